"""One validation run: read generate's shards, build loss masks, flag every sample, stage the export.

``validate_generation(config)`` reads one generation folder or several (the shards of one prompt file, checked
for overlap and coverage by ``coverage.py``) and returns a ``ValidationResult`` (per-sample records, counts, the gate verdict);
``require_fit_to_train(result)`` raises when the degenerate share is over the threshold (the notebook's gate);
``finalize_export(result)`` publishes the staged export once the gate has passed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from draftgen.prompts.rows import holdout_fraction
from draftgen.training.id_rows import IdsLayout, ids_layout
from draftgen.training.masks import MaskSpec, build_conversation_masks, load_tokenizer
from draftgen.training.trainers import SpanTrainer
from draftgen.validate import card, export
from draftgen.validate.checks import CorpusIndex, flag_batch, index_corpus
from draftgen.validate.config import FLAGS, LENGTH_FLAGS, ValidateConfig
from draftgen.validate.coverage import Coverage, check_coverage
from draftgen.validate.folders import GenerationSet, open_generations
from draftgen.validate.reader import iter_batches
from draftgen.validate.token_rows import server_rows
from draftgen.validate.turns import assemble_batch, turn_rows

RECORDS_FILE = "samples.parquet"
SUMMARY_FILE = "summary.json"


class ValidationGateError(RuntimeError):
    """The corpus is not fit to train on: too large a share of degenerate samples."""


@dataclass(frozen=True)
class ValidationResult:
    config: ValidateConfig
    output: GenerationSet  # the generation folder(s) read
    records: pl.DataFrame  # one row per sample: id, folder, shard, row, token counts, mask sum, flags, text
    index: CorpusIndex
    coverage: Coverage  # ids missing from the prompt file's selection, ids stored more than once
    counts: dict[str, Any]  # in, out, dropped, dropped_by_flag, flagged_but_kept
    seconds: float

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


def count_flags(records: pl.DataFrame, config: ValidateConfig) -> dict[str, Any]:
    """Samples in, out and dropped; a sample with several flags counts under each, and once in dropped."""
    flagged = {f: int(records[f].sum()) for f in FLAGS} if records.height else dict.fromkeys(FLAGS, 0)
    dropped = int(records["dropped"].sum()) if records.height else 0
    held = (
        records.filter(pl.col("held_out"))
        if records.height and "held_out" in records.columns
        else records.head(0)
    )
    key = "prompt_id" if "prompt_id" in records.columns else "id"
    # A sample cut inside its reasoning has no answer: that empty answer is the truncation's doing, not a defect.
    defect = [pl.col(f) for f in config.drop_flags if f not in LENGTH_FLAGS and f != "empty_answer"]
    if "empty_answer" in config.drop_flags:
        defect.append(pl.col("empty_answer") & ~pl.col("truncated"))
    if records.height and defect:
        degenerate = int(records.select((pl.any_horizontal(defect) & pl.col("dropped")).sum()).item())
    else:
        degenerate = 0
    return {
        "in": records.height,
        "out": records.height - dropped - int((~held["dropped"]).sum())
        if held.height
        else records.height - dropped,
        "held_out": {"rows": held.height, "prompts": held[key].n_unique() if held.height else 0},
        "yield": token_yield(records, config),
        "token_source": _token_sources(records),
        "dropped": dropped,
        "degenerate": degenerate,  # dropped for a defect (a sample with a defect and a length flag counts here)
        "length_limited": dropped - degenerate,  # dropped only for length flags
        "dropped_by_flag": {f: n for f, n in flagged.items() if f in config.drop_flags},
        "flagged_but_kept": {f: n for f, n in flagged.items() if f not in config.drop_flags},
    }


def token_yield(records: pl.DataFrame, config: ValidateConfig) -> dict[str, Any]:
    """Generated tokens that a kept training row supervises ÷ every token the target generated, and where the
    rest went: a dropped row's tokens under its first drop flag (length flags first), a kept row's under the max_length cut or, what
    its mask leaves out (an earlier turn re-rendered without its reasoning, say), "not supervised"."""
    if not records.height:
        return {"generated_tokens": 0, "supervised_generated": 0, "share": None, "lost": {}}
    generated = int(records["generated_tokens"].sum())
    held = pl.col("held_out") if "held_out" in records.columns else pl.lit(False)
    kept = records.filter(~pl.col("dropped") & ~held)
    supervised = int(kept["supervised_generated"].sum())
    lost: dict[str, int] = {}
    dropped = records.filter(pl.col("dropped"))
    if dropped.height:
        # A row cut by max_tokens has an empty answer too: the cut is why, so length flags are named first.
        order = [f for f in LENGTH_FLAGS if f in config.drop_flags] + [
            f for f in config.drop_flags if f not in LENGTH_FLAGS
        ]
        first = pl.coalesce([pl.when(pl.col(f)).then(pl.lit(f)) for f in order] or [pl.lit("?")])
        by_flag = dropped.group_by(first.alias("flag")).agg(pl.col("generated_tokens").sum())
        lost.update({f"dropped: {flag}": int(n) for flag, n in by_flag.iter_rows() if n})
    withheld = int(records.filter(~pl.col("dropped") & held)["generated_tokens"].sum())
    if withheld:
        lost["held out (the drafter verdict's prompts)"] = withheld
    cut = int(kept["cut_generated"].sum())
    if cut:
        lost["cut at max_length"] = cut
    rest = int(
        (kept["generated_tokens"] - kept["supervised_generated"] - kept["cut_generated"]).clip(0).sum()
    )
    if rest:
        lost["not supervised"] = rest
    return {
        "generated_tokens": generated,
        "supervised_generated": supervised,
        "share": supervised / generated if generated else None,
        "lost": dict(sorted(lost.items(), key=lambda item: -item[1])),
    }


def _token_sources(records: pl.DataFrame) -> dict[str, Any]:
    """How many rows came from the server's ids and how many were re-tokenized; how often re-tokenizing differs."""
    sources = dict(records.group_by("token_source").len().iter_rows()) if records.height else {}
    server = int(sources.get("server", 0))
    differs = int(records["retokenized_differs"].sum()) if records.height else 0
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
    parts: list[pl.DataFrame] = []
    bar = _progress(output.rows) if progress else None
    try:
        for batch in iter_batches(output.outputs, config.batch_size):
            parts.append(_validate_batch(batch.frame, tokenizer, spec, layout, config, index, writer))
            if bar is not None:
                bar.update(batch.frame.height)
    finally:
        if bar is not None:
            bar.close()
    records = pl.concat(parts, how="vertical_relaxed")
    counts = count_flags(records, config)
    writer.close(counts)
    result = ValidationResult(
        config=config,
        output=output,
        records=records,
        index=index,
        coverage=coverage,
        counts=counts,
        seconds=time.perf_counter() - started,
    )
    card.write_card(writer.staging, result)
    records.write_parquet(out_dir / RECORDS_FILE)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary(result), indent=2) + "\n")
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
