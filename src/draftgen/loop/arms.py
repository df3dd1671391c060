"""The three sets of rows the loop compares: (a) the export's, (b) the same prompts with their source answers, and
(c) the held-out split of the target's own answers. Each row is SpecForge's pre-tokenized shape (id, input_ids,
loss_mask); (b) is built with the same trainer's mask, a row per generated turn like (a)'s."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgen.rundir.layout import EXPORT, EXPORT_HOLDOUT, EXPORT_HOLDOUT_EVAL, EXPORT_PROMPTS
from draftgen.training.conversation import answer_points

ARM_EXPORT = "export"  # (a): the target's own answers, as validate exported them
ARM_ORIGINAL = "original"  # (b): the same prompts with the answers the prompt file brought
ARM_MATCHED = "export-matched"  # (a) with each row's trained tokens cut to its (b) row's count
HOLDOUT = "holdout"  # (c): the target's own answers to held-out prompts


class LoopInputError(ValueError):
    """A file the loop needs is missing or does not fit the others; the message names it and the fix."""


@dataclass(frozen=True)
class Row:
    id: str
    input_ids: list[int]
    loss_mask: list[int]

    @property
    def trained(self) -> int:
        return sum(self.loss_mask)


def export_files(export_dir: str | Path) -> tuple[Path, Path]:
    """(export/prompts.jsonl, export/holdout/eval.jsonl) of validate's run folder or of its export/ itself."""
    folder = Path(export_dir)
    if (folder / EXPORT).is_dir():
        folder = folder / EXPORT
    prompts, held = folder / EXPORT_PROMPTS, folder / EXPORT_HOLDOUT / EXPORT_HOLDOUT_EVAL
    for path, why in (
        (prompts, "export_prompts: true"),
        (held, "holdout_share > 0 and export_prompts: true"),
    ):
        if not path.is_file():
            raise LoopInputError(
                f"{path} does not exist: run validate with {why} (its export must have passed)"
            )
    return prompts, held


def read_rows(path: Path) -> list[Row]:
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            rows.append(Row(str(record["id"]), list(record["input_ids"]), list(record["loss_mask"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise LoopInputError(
                f"{path}, line {number}: not an {{id, input_ids, loss_mask}} row ({exc})"
            ) from None
    return rows


def _records(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        import polars as pl

        yield from pl.read_parquet(path).iter_rows(named=True)
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def source_conversations(prompts: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Each valid prompt row's whole source conversation (its answers kept), by the id generate gave it."""
    from draftgen.prompts.rows import PromptRow, normalize_record, source_messages

    out = {}
    for number, record in enumerate(_records(Path(prompts))):
        row = normalize_record(record, number)
        if isinstance(row, PromptRow):
            out[row.id] = source_messages(record)
    return out


def _turn_of(row_id: str, known: dict[str, Any]) -> tuple[str, int] | None:
    """(prompt id, generated turn) of an export row id: the prompt id itself (one turn), or ``<prompt>#<turn>``."""
    if row_id in known:
        return row_id, 0
    prompt, _, turn = row_id.rpartition("#")
    return (prompt, int(turn)) if prompt in known and turn.isdigit() else None


def original_conversation(messages: Sequence[dict[str, Any]], turn: int) -> list[dict[str, Any]] | None:
    """The source conversation up to and including its own answer to generated turn ``turn`` (None: the source has
    no answer there — it ends with the question the target answered)."""
    asked = list(messages)
    while asked and asked[-1]["role"] == "assistant":
        asked.pop()
    points = answer_points(asked, "all")
    if turn >= len(points):
        return None
    after = points[turn] + 1
    if after >= len(messages) or messages[after]["role"] != "assistant":
        return None
    return [dict(m) for m in messages[: after + 1]]


@dataclass(frozen=True)
class OriginalRows:
    rows: list[Row]
    unanswered: list[str]  # export rows whose turn the source did not answer: no (b) row
    unknown: list[str]  # export rows whose prompt the prompt file does not hold


def original_rows(
    prompts: str | Path, export_rows: Sequence[Row], tokenizer: Any, trainer: str, max_length: int
) -> OriginalRows:
    """Arm (b): for each of the export's rows, the same prompt and turn with the source's own answer, masked by the
    same trainer (only that turn supervised, cut at ``max_length``: as validate builds a row per turn)."""
    from draftgen.training.masks import MaskSpec, build_conversation_masks

    sources = source_conversations(prompts)
    ids, conversations, unanswered, unknown = [], [], [], []
    for row in export_rows:
        place = _turn_of(row.id, sources)
        if place is None:
            unknown.append(row.id)
            continue
        conversation = original_conversation(sources[place[0]], place[1])
        if conversation is None:
            unanswered.append(row.id)
            continue
        ids.append(row.id)
        conversations.append(conversation)
    if unknown and len(unknown) == len(export_rows):
        raise LoopInputError(
            f"none of the export's {len(export_rows)} rows is a prompt of {prompts} (first: {unknown[0]!r}): give "
            "the prompt file generate answered"
        )
    spec = MaskSpec(trainer=trainer, max_length=max_length, last_turn_only=True)
    masks = build_conversation_masks(tokenizer, conversations, spec, keep_ids=True) if conversations else None
    rows = [
        Row(row_id, [int(t) for t in masks.input_ids[i]], masks.loss_mask(i).tolist())
        for i, row_id in enumerate(ids)
        if masks is not None
    ]
    return OriginalRows(rows, unanswered, unknown)


def volume_matched(export_rows: Sequence[Row], original: Sequence[Row]) -> list[Row]:
    """Each export row trained only on its first trained tokens, as many as the source answer of the same id holds
    (the pairs share ids and order): the target's text at the source's volume, row by row."""
    out = []
    for mine, theirs in zip(export_rows, original, strict=True):
        if mine.id != theirs.id:
            raise ValueError(f"rows out of step: {mine.id} beside {theirs.id}")
        budget, mask = theirs.trained, []
        for bit in mine.loss_mask:
            keep = bool(bit) and budget > 0
            budget -= keep
            mask.append(int(keep))
        out.append(Row(mine.id, mine.input_ids, mask))
    return out
