"""Each stored row as the conversation the trainer will see, and whether it holds assistant text the target
model did not write.

``conversation.assemble`` (the one place that puts source messages and generated answers together) does the
work: in ``turns: all`` every source assistant message is replaced by the target's own answer; in ``turns: last``
source assistant messages stay in the history (``foreign_assistant_turn``: the trainer would supervise text
another model wrote). Rows from shards written before the turn columns existed are single-turn ``last`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from draftgen.training.conversation import Turn, assemble
from draftgen.validate.reader import GenerationDataError

ROW_COLUMNS = (
    "id",
    "messages",
    "content",
    "reasoning_content",
    "turn_after",
    "turn_content",
    "turn_reasoning",
)


@dataclass(frozen=True)
class AssembledBatch:
    conversations: list[
        list[dict[str, Any]]
    ]  # per row: turns as exported ({role, content[, reasoning_content]})
    foreign: np.ndarray  # bool per row: an assistant turn the target model did not write


def export_turn(turn: Turn) -> dict[str, Any]:
    """A turn in the export's shape: generated answers carry their reasoning, other turns role and content."""
    if turn.generated:
        return {
            "role": "assistant",
            "content": turn.content,
            "reasoning_content": turn.reasoning_content or "",
        }
    return {"role": turn.role, "content": turn.content}


def _legacy(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row without turn columns that assemble cannot place (its prompt ends with an assistant message): the
    prompt as given and the answer after it, so the mask check can show what the template makes of it."""
    turns = [{"role": m["role"], "content": m["content"] or ""} for m in row["messages"]]
    turns.append(
        {
            "role": "assistant",
            "content": row["content"] or "",
            "reasoning_content": row["reasoning_content"] or "",
        }
    )
    return turns


def assemble_batch(frame: pl.DataFrame) -> AssembledBatch:
    """The trainer's conversation for every row of a batch (the last turn is always a generated answer)."""
    conversations: list[list[dict[str, Any]]] = []
    foreign = np.zeros(frame.height, dtype=bool)
    columns = [c for c in ROW_COLUMNS if c in frame.columns] + (
        ["turns_mode"] if "turns_mode" in frame else []
    )
    for index, row in enumerate(frame.select(columns).iter_rows(named=True)):
        try:
            assembled = assemble(row)
        except ValueError as exc:
            if row.get("turn_after") is not None:
                place = (
                    f"{frame['folder'][index]}/shards/{frame['shard'][index]}" if "folder" in frame else "?"
                )
                raise GenerationDataError(
                    f"row {row['id']!r} ({place}, row {frame['row'][index] if 'row' in frame else '?'}): its turn "
                    f"columns do not fit its messages ({exc}); the shard was not written by draftgen generate as "
                    "it is — move it aside and resume generate to regenerate its prompts"
                ) from None
            turns = _legacy(row)
            foreign[index] = any(m["role"] == "assistant" for m in row["messages"])
        else:
            turns = [export_turn(t) for t in assembled]
            foreign[index] = any(t.role == "assistant" and not t.generated for t in assembled)
        conversations.append(turns)
    return AssembledBatch(conversations=conversations, foreign=foreign)
