"""Each stored row as the conversation the trainer will see, and whether it holds assistant text the target
model did not write.

``conversation.assemble`` (the one place that puts source messages and generated answers together) does the
work: in ``turns: all`` every source assistant message is replaced by the target's own answer (its tool calls
included, the source's tool results re-addressed to them); in ``turns: last`` source assistant messages stay in the
history (``foreign_assistant_turn``: the trainer would supervise text another model wrote). Rows from shards written
before the turn columns existed are single-turn ``last`` rows. A turn is exported in SpecForge's shape
(``export_turn``): tool calls as ``{"id", "type", "function": {"name", "arguments": JSON string}}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from draftgen.training.conversation import (
    Answer,
    Turn,
    assemble,
    encode_calls,
    generated_calls,
    generated_turns,
    message_columns,
    request_messages,
    stored_messages,
)
from draftgen.training.token_ids import TokenIdsError, expand
from draftgen.training.tools import export_calls
from draftgen.validate.reader import GenerationDataError

ROW_COLUMNS = (
    "id",
    "messages",
    "content",
    "reasoning_content",
    "turn_after",
    "turn_content",
    "turn_reasoning",
    # agentic rows (training.conversation): the messages' other fields, the tools, each turn's calls; a row per
    # turn carries its turn's calls in ``tool_calls``
    "message_extras",
    "tools",
    "turn_tool_calls",
    "tool_calls",
)


@dataclass(frozen=True)
class AssembledBatch:
    # per row: turns as exported ({role, content[, reasoning_content][, tool_calls, tool_call_id, name]})
    conversations: list[list[dict[str, Any]]]
    foreign: np.ndarray  # bool per row: an assistant turn the target model did not write
    tools: list[list[dict[str, Any]] | None]  # per row: its tool schemas (None: none)


def export_turn(turn: Turn) -> dict[str, Any]:
    """A turn in the export's shape: generated answers carry their reasoning, other turns role and content; tool
    calls, a result's call id and a name where the turn has them (calls in SpecForge's shape)."""
    if turn.generated:
        out: dict[str, Any] = {
            "role": "assistant",
            "content": turn.content,
            "reasoning_content": turn.reasoning_content or "",
        }
    else:
        out = {"role": turn.role, "content": turn.content}
        if turn.tool_call_id is not None:
            out["tool_call_id"] = turn.tool_call_id
        if turn.name is not None:
            out["name"] = turn.name
    if turn.tool_calls:
        out["tool_calls"] = export_calls(turn.tool_calls)
    return out


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    text = row.get("tools")
    return json.loads(text) if text else None


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


def _place(frame: pl.DataFrame, index: int) -> str:
    """Where row ``index`` of a batch was read from: folder/shards/file, row n."""
    if "folder" not in frame:
        return "?"
    return f"{frame['folder'][index]}/shards/{frame['shard'][index]}, row {frame['row'][index]}"


def assemble_batch(frame: pl.DataFrame) -> AssembledBatch:
    """The trainer's conversation for every row of a batch (the last turn is always a generated answer)."""
    conversations: list[list[dict[str, Any]]] = []
    tools: list[list[dict[str, Any]] | None] = []
    foreign = np.zeros(frame.height, dtype=bool)
    columns = [c for c in ROW_COLUMNS if c in frame.columns] + (
        ["turns_mode"] if "turns_mode" in frame else []
    )
    for index, row in enumerate(frame.select(columns).iter_rows(named=True)):
        tools.append(row_tools(row))
        try:
            assembled = assemble(row)
        except ValueError as exc:
            if row.get("turn_after") is not None:
                raise GenerationDataError(
                    f"row {row['id']!r} ({_place(frame, index)}): its turn "
                    f"columns do not fit its messages ({exc}); the shard was not written by draftgen generate as "
                    "it is — move it aside and resume generate to regenerate its prompts"
                ) from None
            turns = _legacy(row)
            foreign[index] = any(m["role"] == "assistant" for m in row["messages"])
        else:
            turns = [export_turn(t) for t in assembled]
            foreign[index] = any(t.role == "assistant" and not t.generated for t in assembled)
        conversations.append(turns)
    return AssembledBatch(conversations=conversations, foreign=foreign, tools=tools)


# ----- one training row per generated turn ------------------------------------------------------------------------
ID_COLUMNS = ("turn_prompt_shared", "turn_prompt_ids", "turn_output_ids")
TURN_EXTRA = ("turn_finish_reason", "turn_prompt_tokens", "turn_completion_tokens", "turn_budget_by")
TURN_ROW_SCHEMA = {
    "id": pl.String,  # the training row's id: the prompt id, with "#k" for turn k of a multi-turn conversation
    "prompt_id": pl.String,
    "turn": pl.Int64,
    "turns": pl.Int64,
    "folder": pl.String,
    "shard": pl.String,
    "row": pl.Int64,
    "messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
    "message_extras": pl.List(pl.String),  # as the stored row's (training.conversation.message_columns)
    "tools": pl.String,
    "reasoning_content": pl.String,
    "content": pl.String,
    "tool_calls": pl.String,  # this turn's calls (a JSON list), null where it called nothing
    "tool_divergence": pl.String,  # the stored row's, on the turn that diverged only
    "finish_reason": pl.String,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "budget_by": pl.String,  # which limit set the turn's max_tokens (generate.length_cap); null in older shards
    "prompt_ids": pl.List(pl.UInt32),
    "output_ids": pl.List(pl.UInt32),
}


@dataclass(frozen=True)
class TurnRows:
    frame: pl.DataFrame  # TURN_ROW_SCHEMA: one row per generated turn, its history as the target saw it
    foreign: (
        np.ndarray
    )  # bool per row: the history holds assistant text the target did not write (turns: last)
    problems: list[str | None]  # per row: why its server ids could not be read back (corrupt compact columns)


def _per_turn(row: dict[str, Any], turn_column: str, column: str, turns: int) -> list[Any]:
    """A row's per-turn values; rows without turn columns hold one turn (the scalar column)."""
    if row.get("turn_after") is None:
        return [row.get(column)]
    values = row.get(turn_column)
    return list(values) if values is not None else [None] * turns


def turn_rows(frame: pl.DataFrame) -> TurnRows:
    """Each stored conversation as one row per generated turn: the messages that turn's request carried (the
    source up to its answer point, earlier answers the target's own content, as generate sent them), the turn's
    answer, and the server's prompt and output ids for it where the server sent them."""
    out: dict[str, list[Any]] = {name: [] for name in TURN_ROW_SCHEMA}
    foreign: list[bool] = []
    problems: list[str | None] = []
    wanted = (
        *ROW_COLUMNS,
        "turns_mode",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "tool_divergence",
        *TURN_EXTRA,
    )
    columns = [c for c in (*wanted, *ID_COLUMNS, "folder", "shard", "row") if c in frame.columns]
    for index, row in enumerate(frame.select(columns).iter_rows(named=True)):
        if row.get("turn_after") is not None:
            try:
                assemble(row)  # the turn columns must fit the messages: the one place that checks
            except ValueError as exc:
                raise GenerationDataError(
                    f"row {row['id']!r} ({_place(frame, index)}): its turn columns do not fit its messages "
                    f"({exc}); the shard was not written by draftgen generate as it is — move it aside and "
                    "resume generate to regenerate its prompts"
                ) from None
        mode, points, contents, reasonings = generated_turns(row)
        k = len(points)
        finish = _per_turn(row, "turn_finish_reason", "finish_reason", k)
        prompt_tokens = _per_turn(row, "turn_prompt_tokens", "prompt_tokens", k)
        completion = _per_turn(row, "turn_completion_tokens", "completion_tokens", k)
        budget_by = row.get("turn_budget_by") or [None] * k
        outputs = row.get("turn_output_ids")
        problem = None
        try:
            prompts = expand(row.get("turn_prompt_shared"), row.get("turn_prompt_ids"), outputs)
        except TokenIdsError as exc:
            prompts, problem = [], f"stored ids: {exc}"
        prompts = prompts or [None] * k
        outputs = list(outputs) if outputs is not None else [None] * k
        messages, calls = stored_messages(row), generated_calls(row, k)
        diverged_at = json.loads(row["tool_divergence"])["turn"] if row.get("tool_divergence") else None
        earlier: list[tuple[int, Answer]] = []
        for j, point in enumerate(points):
            try:
                history = request_messages(messages, point, earlier, mode)
            except ValueError as exc:
                raise GenerationDataError(
                    f"row {row['id']!r} ({_place(frame, index)}): its turn columns do not fit its messages ({exc}); "
                    "the shard was not written by draftgen generate as it is — move it aside and resume generate"
                ) from None
            plain, extras = message_columns(history)
            values = {
                "id": row["id"] if k == 1 else f"{row['id']}#{j}",
                "prompt_id": row["id"],
                "turn": j,
                "turns": k,
                "folder": row.get("folder"),
                "shard": row.get("shard"),
                "row": row.get("row"),
                "messages": plain,
                "message_extras": extras,
                "tools": row.get("tools"),
                "reasoning_content": reasonings[j],
                "content": contents[j],
                "tool_calls": encode_calls(calls[j]),
                "tool_divergence": row.get("tool_divergence") if j == diverged_at else None,
                "finish_reason": finish[j],
                "prompt_tokens": prompt_tokens[j],
                "completion_tokens": completion[j],
                "budget_by": budget_by[j],
                "prompt_ids": prompts[j],
                "output_ids": outputs[j],
            }
            for name, value in values.items():
                out[name].append(value)
            foreign.append(mode == "last" and any(m["role"] == "assistant" for m in history))
            problems.append(problem)
            earlier.append((point, Answer(contents[j], calls[j])))
    return TurnRows(pl.DataFrame(out, schema=TURN_ROW_SCHEMA), np.asarray(foreign, dtype=bool), problems)
