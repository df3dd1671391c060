"""Read generate's output folder: ``shards/*.parquet`` and ``manifest.json``
(docs/design.md#generation-output-the-run-folder).

Every shard's schema is checked before any work starts, so a missing column or a corrupt file stops the run in
seconds with the file named, not an hour in. Shards are read one at a time: memory stays bounded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.rundir.layout import MANIFEST, SHARD_GLOB, SHARDS, shard_paths

# What validate needs from each shard; the other contract columns are carried along when present.
REQUIRED_COLUMNS = ("id", "messages", "reasoning_content", "content", "finish_reason")
OPTIONAL_COLUMNS = ("prompt_tokens", "completion_tokens", "server", "attempts")
TEXT_COLUMNS = ("id", "reasoning_content", "content", "finish_reason")
# Multi-turn rows (draftgen.training.conversation): every generated turn's text. Shards written before these columns
# existed lack them; they are read as null there (single-turn rows: the answer is content/reasoning_content).
TURN_COLUMNS = (
    "turn_after",
    "turn_content",
    "turn_reasoning",
    "turn_finish_reason",
    "turn_prompt_tokens",
    "turn_completion_tokens",
    "turns_mode",
    # The server's token ids per turn (draftgen.training.token_ids); null where it sent none, or in older shards.
    "turn_prompt_shared",
    "turn_prompt_ids",
    "turn_output_ids",
    # Which limit set each turn's max_tokens (draftgen.generate.length_cap): a cut judged by its cause.
    "turn_budget_by",
    # The prompt row's category (draftgen.prompts.rows.row_category), kept with the held-out prompts, and a
    # sampling plan's arm (draftgen.sampling_plan: a sample's id names its prompt); null where absent.
    "category",
    "arm",
    # Agentic rows (docs/generate.md#agentic-conversations): the messages' other fields, the tools, each turn's
    # calls, the divergence that ended a conversation; null in shards written before them.
    "message_extras",
    "tools",
    "turn_tool_calls",
    "tool_divergence",
)


class GenerationDataError(ValueError):
    """generate's output cannot be read: names the folder or file and what to do."""


@dataclass(frozen=True)
class GenerationOutput:
    directory: Path
    shards: tuple[Path, ...]
    rows_per_shard: tuple[int, ...]
    optional_columns: tuple[str, ...]  # OPTIONAL_COLUMNS present in every shard
    manifest: dict[str, Any] | None
    warnings: tuple[str, ...] = field(default=())

    @property
    def rows(self) -> int:
        return sum(self.rows_per_shard)


def _unreadable(path: Path, exc: Exception) -> GenerationDataError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return GenerationDataError(
        f"shard {path} cannot be read ({type(exc).__name__}: {detail}). Move it aside and resume generate "
        "(draftgen run generate --resume ...) to regenerate its prompts, then validate again"
    )


def _check_schema(path: Path) -> tuple[int, set[str]]:
    try:
        schema = pl.read_parquet_schema(path)
        rows = pl.scan_parquet(path).select(pl.len()).collect().item()
    except Exception as exc:  # polars raises ComputeError, OSError, ... for a damaged file
        raise _unreadable(path, exc) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in schema]
    if missing:
        raise GenerationDataError(
            f"shard {path} lacks column(s) {', '.join(missing)} (has: {', '.join(schema) or 'none'}); "
            f"validate needs {', '.join(REQUIRED_COLUMNS)} (docs/design.md: generation output)"
        )
    problems = []
    for name in TEXT_COLUMNS:
        if schema[name] not in (pl.String, pl.Null):
            problems.append(f"{name} is {schema[name]}, expected a string")
    messages = schema["messages"]
    fields = (
        {f.name for f in messages.inner.fields}
        if isinstance(messages, pl.List) and isinstance(messages.inner, pl.Struct)
        else set()
    )
    if not {"role", "content"} <= fields:
        problems.append(f"messages is {messages}, expected a list of {{role, content}} structs")
    if problems:
        raise GenerationDataError(f"shard {path}: {'; '.join(problems)}")
    return int(rows), {c for c in OPTIONAL_COLUMNS if c in schema}


def _read_manifest(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    if not path.exists():
        return None, [f"{path} is missing: counts cannot be compared with generate's own"]
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, [f"{path} is not readable JSON ({exc}); validating the shards alone"]
    if not isinstance(manifest, dict):
        return None, [f"{path} is not a JSON object; validating the shards alone"]
    return manifest, []


def open_generation(path: str | Path) -> GenerationOutput:
    """Find and check every shard of a generation folder; raise GenerationDataError naming what is wrong."""
    directory = Path(path)
    if not directory.exists():
        raise GenerationDataError(
            f"generation folder {directory} does not exist: pass generation_dir = generate's out_dir "
            "(the folder holding shards/ and manifest.json)"
        )
    if not directory.is_dir():
        raise GenerationDataError(f"generation_dir {directory} is a file; pass the folder holding shards/")
    shard_dir = directory / SHARDS
    if not shard_dir.is_dir():
        raise GenerationDataError(
            f"{directory} has no {SHARDS}/ folder: is it generate's out_dir? (expected {shard_dir}/{SHARD_GLOB})"
        )
    shards = tuple(p for p in shard_paths(directory) if p.is_file())
    if not shards:
        raise GenerationDataError(
            f"{shard_dir} holds no .parquet shards ({SHARD_GLOB}): nothing to validate yet"
        )
    rows, optional = [], set(OPTIONAL_COLUMNS)
    for shard in shards:
        count, present = _check_schema(shard)
        rows.append(count)
        optional &= present
    manifest, warnings = _read_manifest(directory / MANIFEST)
    return GenerationOutput(
        directory=directory,
        shards=shards,
        rows_per_shard=tuple(rows),
        optional_columns=tuple(c for c in OPTIONAL_COLUMNS if c in optional),
        manifest=manifest,
        warnings=tuple(warnings),
    )


def read_shard(path: Path, columns: list[str], lenient: tuple[str, ...] = ()) -> pl.DataFrame:
    """``columns`` of one shard; the ``lenient`` ones (generate's OUTPUT_SCHEMA names) are null where absent."""
    try:
        present = pl.read_parquet_schema(path) if lenient else {}
        frame = pl.read_parquet(path, columns=[*columns, *(c for c in lenient if c in present)])
    except Exception as exc:
        raise _unreadable(path, exc) from None
    missing = [pl.lit(None, dtype=OUTPUT_SCHEMA[c]).alias(c) for c in lenient if c not in present]
    return frame.with_columns(missing).select(*columns, *lenient) if lenient else frame


@dataclass(frozen=True)
class SampleBatch:
    """Rows of one or more shards: the contract columns plus ``folder`` (the generation folder as given),
    ``shard`` (file name) and ``row`` (0-based within the shard)."""

    frame: pl.DataFrame
    first_index: int  # position of the first row in the whole corpus (folder, then shard order)


def iter_batches(outputs: Sequence[GenerationOutput], batch_size: int) -> Iterator[SampleBatch]:
    """Folders in order, their shards in order, regrouped into batches of ``batch_size`` rows (the last one may
    be smaller). Only columns every folder has are read, so folders from several nodes concatenate."""
    optional = [c for c in OPTIONAL_COLUMNS if all(c in o.optional_columns for o in outputs)]
    columns = [*REQUIRED_COLUMNS, *optional]
    pending: list[pl.DataFrame] = []
    pending_rows = 0
    emitted = 0
    for output in outputs:
        for shard in output.shards:
            frame = read_shard(shard, columns, TURN_COLUMNS).with_columns(
                pl.lit(str(output.directory)).alias("folder"),
                pl.lit(shard.name).alias("shard"),
                pl.int_range(pl.len(), dtype=pl.Int64).alias("row"),
            )
            pending.append(frame)
            pending_rows += frame.height
            while pending_rows >= batch_size:
                merged = pl.concat(pending, how="vertical_relaxed")
                yield SampleBatch(merged.head(batch_size), emitted)
                emitted += batch_size
                rest = merged.slice(batch_size)
                pending, pending_rows = ([rest], rest.height) if rest.height else ([], 0)
    if pending_rows:
        yield SampleBatch(pl.concat(pending, how="vertical_relaxed"), emitted)
