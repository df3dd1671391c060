"""One validation run: read generate's shards, build loss masks, flag every sample, stage the export.

``validate_generation(config)`` reads one generation folder or several (the shards of one prompt file, checked
for overlap and coverage by ``coverage.py``) and returns a ``ValidationResult`` (per-sample records, streamed to
``samples.parquet`` batch by batch and read back lazily; counts; the gate verdict);
``require_fit_to_train(result)`` raises when the degenerate share is over the threshold (the notebook's gate);
``finalize_export(result)`` publishes the staged export once the gate has passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from draftgen.prompts.rows import holdout_fraction
from draftgen.rundir import write_json
from draftgen.rundir.layout import VALIDATE_RECORDS as RECORDS_FILE
from draftgen.rundir.layout import VALIDATE_SUMMARY as SUMMARY_FILE
from draftgen.training.id_rows import IdsLayout, ids_layout
from draftgen.training.masks import MaskSpec, build_conversation_masks, load_tokenizer
from draftgen.training.trainers import SpanTrainer
from draftgen.validate import card, export
from draftgen.validate.checks import CorpusIndex, flag_batch, index_corpus
from draftgen.validate.config import FLAGS, LENGTH_FLAGS, ValidateConfig
from draftgen.validate.coverage import Coverage, check_coverage
from draftgen.validate.folders import GenerationSet, open_generations
from draftgen.validate.reader import iter_batches
from draftgen.validate.records import RecordsWriter
from draftgen.validate.token_rows import server_rows
from draftgen.validate.turns import assemble_batch, turn_rows


class ValidationGateError(RuntimeError):
    """The corpus is not fit to train on: too large a share of degenerate samples."""


@dataclass(frozen=True)
class ValidationResult:
    config: ValidateConfig
    output: GenerationSet  # the generation folder(s) read
    records_path: (
        Path  # samples.parquet: one row per sample (id, folder, shard, row, token counts, flags, text)
    )
    index: CorpusIndex
    coverage: Coverage  # ids missing from the prompt file's selection, ids stored more than once
    counts: dict[str, Any]  # in, out, dropped, dropped_by_flag, flagged_but_kept
    seconds: float

    @property
    def records(self) -> pl.DataFrame:
        """Every record, read from samples.parquet on each call (~330 bytes a row: ``scan()`` reads less)."""
        return pl.read_parquet(self.records_path)

    def scan(self) -> pl.LazyFrame:
        """The records as a lazy frame: what the report reads, projecting only the columns it needs."""
        return pl.scan_parquet(self.records_path)

    @property
    def samples(self) -> int:
        return self.counts["in"]

    @property
    def degenerate_share(self) -> float:
        """Share of samples dropped for a defect other than running out of length budget."""
        return self.counts["degenerate"] / self.counts["in"] if self.counts["in"] else 1.0

    @property
    def truncated_share(self) -> float:
        """Share of samples dropped only because they hit a length limit (max_tokens or max_length)."""
        return self.counts["length_limited"] / self.counts["in"] if self.counts["in"] else 1.0

    @property
    def passed(self) -> bool:
        return (
            self.counts["in"] > 0
            and self.degenerate_share <= self.config.max_degenerate_share
            and self.truncated_share <= self.config.max_truncated_share
        )

    @property
    def out_dir(self) -> Path:
        return Path(self.config.out_dir)


def _totals(records: pl.LazyFrame, exprs: list[pl.Expr]) -> dict[str, Any]:
    """One row of aggregates over the records, streamed (only the columns the expressions name are read)."""
    return records.select(exprs).collect(engine="streaming").row(0, named=True)


def count_flags(records: pl.DataFrame | pl.LazyFrame, config: ValidateConfig) -> dict[str, Any]:
    """Samples in, out and dropped; a sample with several flags counts under each, and once in dropped."""
    records = records.lazy()
    columns = records.collect_schema().names()
    size = _totals(records, [pl.len().alias("n")])["n"] if columns else 0
    if not size:
        return {
            "in": 0,
            "out": 0,
            "held_out": {"rows": 0, "prompts": 0},
            "yield": token_yield(records, config),
            "token_source": _token_sources(records),
            "dropped": 0,
            "degenerate": 0,
            "length_limited": 0,
            "dropped_by_flag": {f: 0 for f in FLAGS if f in config.drop_flags},
            "flagged_but_kept": {f: 0 for f in FLAGS if f not in config.drop_flags},
        }
    held = pl.col("held_out") if "held_out" in columns else pl.lit(False)
    key = "prompt_id" if "prompt_id" in columns else "id"
    # A sample cut inside its reasoning has no answer: that empty answer is the truncation's doing, not a defect.
    defect = [pl.col(f) for f in config.drop_flags if f not in LENGTH_FLAGS and f != "empty_answer"]
    if "empty_answer" in config.drop_flags:
        defect.append(pl.col("empty_answer") & ~pl.col("truncated"))
    degenerate = (pl.any_horizontal(defect) & pl.col("dropped")).sum() if defect else pl.lit(0)
    totals = _totals(
        records,
        [
            *(pl.col(f).sum().alias(f) for f in FLAGS),
            pl.col("dropped").sum().alias("dropped"),
            degenerate.alias("degenerate"),
            held.sum().alias("held_rows"),
            (held & ~pl.col("dropped")).sum().alias("held_kept"),
            pl.col(key).filter(held).n_unique().alias("held_prompts"),
        ],
    )
    flagged = {f: int(totals[f]) for f in FLAGS}
    dropped, degenerate_rows = int(totals["dropped"]), int(totals["degenerate"])
    held_rows = int(totals["held_rows"])
    return {
        "in": size,
        "out": size - dropped - int(totals["held_kept"]),
        "held_out": {"rows": held_rows, "prompts": int(totals["held_prompts"]) if held_rows else 0},
        "yield": token_yield(records, config),
        "token_source": _token_sources(records),
        "dropped": dropped,
        "degenerate": degenerate_rows,  # dropped for a defect (a sample with a defect and a length flag counts here)
        "length_limited": dropped - degenerate_rows,  # dropped only for length flags
        "dropped_by_flag": {f: n for f, n in flagged.items() if f in config.drop_flags},
        "flagged_but_kept": {f: n for f, n in flagged.items() if f not in config.drop_flags},
    }


def token_yield(records: pl.DataFrame | pl.LazyFrame, config: ValidateConfig) -> dict[str, Any]:
    """Generated tokens that a kept training row supervises ÷ every token the target generated, and where the
    rest went: a dropped row's tokens under its first drop flag (length flags first), a kept row's under the max_length cut or, what
    its mask leaves out (an earlier turn re-rendered without its reasoning, say), "not supervised"."""
    records = records.lazy()
    columns = records.collect_schema().names()
    empty = {"generated_tokens": 0, "supervised_generated": 0, "share": None, "lost": {}}
    if not columns:
        return empty
    held = pl.col("held_out") if "held_out" in columns else pl.lit(False)
    kept = ~pl.col("dropped") & ~held
    totals = _totals(
        records,
        [
            pl.len().alias("rows"),
            pl.col("generated_tokens").sum().alias("generated"),
            pl.col("supervised_generated").filter(kept).sum().alias("supervised"),
            pl.col("generated_tokens").filter(~pl.col("dropped") & held).sum().alias("withheld"),
            pl.col("cut_generated").filter(kept).sum().alias("cut"),
            (pl.col("generated_tokens") - pl.col("supervised_generated") - pl.col("cut_generated"))
            .filter(kept)
            .clip(0)
            .sum()
            .alias("rest"),
        ],
    )
    if not totals["rows"]:
        return empty
    generated, supervised = int(totals["generated"]), int(totals["supervised"])
    lost: dict[str, int] = {}
    # A row cut by max_tokens has an empty answer too: the cut is why, so length flags are named first.
    order = [f for f in LENGTH_FLAGS if f in config.drop_flags] + [
        f for f in config.drop_flags if f not in LENGTH_FLAGS
    ]
    first = pl.coalesce([pl.when(pl.col(f)).then(pl.lit(f)) for f in order] or [pl.lit("?")])
    by_flag = (
        records.filter(pl.col("dropped"))
        .group_by(first.alias("flag"))
        .agg(pl.col("generated_tokens").sum())
        .collect(engine="streaming")
    )
    rank = {f: i for i, f in enumerate(order)}
    for flag, n in sorted(by_flag.iter_rows(), key=lambda item: rank.get(item[0], len(rank))):
        if n:
            lost[f"dropped: {flag}"] = int(n)
    if totals["withheld"]:
        lost["held out (the drafter verdict's prompts)"] = int(totals["withheld"])
    if totals["cut"]:
        lost["cut at max_length"] = int(totals["cut"])
    if totals["rest"]:
        lost["not supervised"] = int(totals["rest"])
    return {
        "generated_tokens": generated,
        "supervised_generated": supervised,
        "share": supervised / generated if generated else None,
        "lost": dict(sorted(lost.items(), key=lambda item: -item[1])),
    }


def _token_sources(records: pl.LazyFrame) -> dict[str, Any]:
    """How many rows came from the server's ids and how many were re-tokenized; how often re-tokenizing differs."""
    if not records.collect_schema().names():
        sources, differs = {}, 0
    else:
        sources = dict(records.group_by("token_source").len().collect(engine="streaming").iter_rows())
        differs = int(_totals(records, [pl.col("retokenized_differs").sum().alias("n")])["n"] or 0)
    server = int(sources.get("server", 0))
    return {
        "server": server,
        "retokenized": int(sources.get("retokenized", 0)),
        "retokenized_differs": differs,
        "retokenized_differs_rate": differs / server if server else None,
    }


def _progress(total: int):
    from draftgen.display.progressbar import bar_stream, tqdm

    return tqdm(total=total, unit="sample", desc="validate", mininterval=1.0, file=bar_stream())


def _ids_layout(tokenizer: Any, spec: MaskSpec, config: ValidateConfig) -> IdsLayout | None:
    """The trainer's markers in ids, when rows are built from the server's ids (span trainers only)."""
    if config.token_ids != "server" or not isinstance(spec.rules, SpanTrainer):
        return None
    return ids_layout(tokenizer, spec.rules)


def _validate_batch(
    stored: pl.DataFrame,
    tokenizer: Any,
    spec: MaskSpec,
    layout: IdsLayout | None,
    config: ValidateConfig,
    index: CorpusIndex,
    writer: export.ExportWriter,
) -> pl.DataFrame:
    """One batch of stored rows → its training rows, checked, flagged and (the kept ones) exported."""
    stored_problems = None
    if config.rows == "per_turn":
        turns = turn_rows(stored)
        frame, foreign, stored_problems = turns.frame, turns.foreign, turns.problems
        conversations = assemble_batch(frame).conversations
    else:
        frame = stored
        assembled = assemble_batch(frame)  # what the trainer sees: the target's own answers in place
        conversations, foreign = assembled.conversations, assembled.foreign
    retokenized = build_conversation_masks(tokenizer, conversations, spec, keep_ids=True)
    tokens = None
    if layout is not None and "output_ids" in frame.columns:
        tokens = server_rows(
            tokenizer,
            layout,
            frame,
            retokenized,
            last_only=spec.last_turn_only,
            max_length=spec.max_length,
            stored_problems=stored_problems,
        )
    masks = tokens.masks if tokens is not None else retokenized
    records = flag_batch(frame, masks, config, index, foreign, tokens)
    key = "prompt_id" if "prompt_id" in records.columns else "id"
    held = np.array([holdout_fraction(i) < config.holdout_share for i in records[key].to_list()], dtype=bool)
    records = records.with_columns(pl.Series("held_out", held))
    writer.write(frame, conversations, masks, (~records["dropped"]).to_numpy() & ~held)
    writer.write_holdout(
        stored.filter(pl.Series([holdout_fraction(i) < config.holdout_share for i in stored["id"]]))
    )
    return records


def validate_generation(
    config: ValidateConfig, *, tokenizer: Any = None, progress: bool = True
) -> ValidationResult:
    """Check every sample of the generation folder(s); write records, summary and the staged export."""
    started = time.perf_counter()
    output = open_generations(config.generation_dirs, config.prompt_file)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
    spec = config.mask_spec()
    index = index_corpus(output.outputs, config.duplicate_answer_min_prompts)
    coverage = check_coverage(output)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = export.ExportWriter(
        out_dir, jsonl=config.export_jsonl, tokens=config.export_tokens, prompts=config.export_prompts
    )
    layout = _ids_layout(tokenizer, spec, config)
    samples = RecordsWriter(out_dir / RECORDS_FILE)  # each batch's records go to disk: memory stays bounded
    bar = _progress(output.rows) if progress else None
    try:
        for batch in iter_batches(output.outputs, config.batch_size):
            samples.write(_validate_batch(batch.frame, tokenizer, spec, layout, config, index, writer))
            if bar is not None:
                bar.update(batch.frame.height)
    finally:
        if bar is not None:
            bar.close()
    path = samples.close()
    counts = count_flags(pl.scan_parquet(path), config)
    writer.close(counts)
    result = ValidationResult(
        config=config,
        output=output,
        records_path=path,
        index=index,
        coverage=coverage,
        counts=counts,
        seconds=time.perf_counter() - started,
    )
    card.write_card(writer.staging, result)
    write_json(out_dir / SUMMARY_FILE, summary(result), indent=2, end="\n")
    return result


def summary(result: ValidationResult) -> dict[str, Any]:
    return {
        "generation_dir": [str(d) for d in result.output.directories]
        if len(result.output.directories) > 1
        else str(result.output.directories[0]),
        "shards": len(result.output.shards),
        "counts": result.counts,
        "coverage": result.coverage.as_dict(),
        "degenerate_share": result.degenerate_share,
        "max_degenerate_share": result.config.max_degenerate_share,
        "truncated_share": result.truncated_share,
        "max_truncated_share": result.config.max_truncated_share,
        "passed": result.passed,
        "seconds": round(result.seconds, 3),
        "config": result.config.public_dict(),
    }


def gate_message(result: ValidationResult) -> str:
    counts = result.counts
    worst = sorted(counts["dropped_by_flag"].items(), key=lambda item: -item[1])
    top = ", ".join(f"{flag} {n}" for flag, n in worst if n) or "none"
    verdict = "PASS" if result.passed else "FAIL"
    # Coverage is news when checked, when folders were combined or a shard is missing; not for a hand-made folder.
    cover = result.coverage
    shown = cover.checked or cover.missing_shards or cover.duplicated_ids or len(result.output.outputs) > 1
    coverage = cover.line() if shown else ""
    return (
        f"{verdict}: {counts['degenerate']} of {counts['in']} samples degenerate "
        f"({result.degenerate_share:.1%}; threshold max_degenerate_share={result.config.max_degenerate_share:.1%}), "
        f"{counts['length_limited']} cut by a length limit "
        f"({result.truncated_share:.1%}; threshold max_truncated_share={result.config.max_truncated_share:.1%}). "
        f"Dropped by flag: {top}." + (f" {coverage}" if coverage else "")
    )


def require_fit_to_train(result: ValidationResult) -> str:
    """The gate: return the PASS line, or raise ValidationGateError so papermill (and the pipeline) stops."""
    message = gate_message(result)
    if not result.passed:
        staged = result.out_dir / export.STAGING
        raise ValidationGateError(
            f"{message} The export was not published (left in {staged}); look at the flag examples above, "
            "fix generation (or raise max_tokens if truncation is the problem), or raise the threshold if these "
            "samples are acceptable."
        )
    return message


def finalize_export(result: ValidationResult) -> Path:
    """Publish the staged export as ``out_dir/export`` (only for a result that passed the gate)."""
    if not result.passed:
        raise ValidationGateError(gate_message(result) + " The export is not published for a failed gate.")
    return export.finalize(result.out_dir)
