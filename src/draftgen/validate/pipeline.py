"""One validation run: read generate's shards, build loss masks, flag every sample, stage the export.

``validate_generation(config)`` reads one generation folder or several (the shards of one prompt file, checked
for overlap and coverage by ``coverage.py``) and returns a ``ValidationResult`` (per-sample records, streamed to
``samples.parquet`` batch by batch and read back lazily; counts; the gate verdict);
``require_fit_to_train(result)`` raises when the degenerate share is over the threshold (the notebook's gate);
``finalize_export(result)`` publishes the staged export once the gate has passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from draftgen.prompts.rows import holdout_fraction
from draftgen.rundir import write_json
from draftgen.rundir.layout import VALIDATE_RECORDS as RECORDS_FILE
from draftgen.rundir.layout import VALIDATE_SUMMARY as SUMMARY_FILE
from draftgen.sampling_plan import arm_thinking, prompt_of
from draftgen.training.id_rows import IdsLayout, ids_layout
from draftgen.training.masks import MaskSpec, TokenizerLoadError, build_conversation_masks, load_tokenizer
from draftgen.training.template_fit import template_problem
from draftgen.training.trainers import SpanTrainer
from draftgen.validate import card, export, trainer_config
from draftgen.validate.checks import CorpusIndex, flag_batch, index_corpus
from draftgen.validate.config import FLAG_ADVICE, FLAG_ADVICE_DEFAULT, LENGTH_FLAGS, ValidateConfig
from draftgen.validate.counts import count_flags
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
    counts: dict[str, Any]  # validate.counts.count_flags: in, out, dropped, by flag, cut turns, yield
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
        """Share of samples cut by max_tokens: dropped only for a length limit, or cut and trained as generated (a run
        where most answers are cut still fails). Turns cut where the trainer's max_length set the budget are
        expected and not counted here (``counts["cut_at_max_length"]``)."""
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


def _progress(total: int):
    from draftgen.display.progressbar import bar_stream, tqdm

    return tqdm(total=total, unit="sample", desc="validate", mininterval=1.0, file=bar_stream())


def _ids_layout(tokenizer: Any, spec: MaskSpec, config: ValidateConfig) -> IdsLayout | None:
    """The trainer's markers in ids, when rows are built from the server's ids (span trainers only)."""
    if config.token_ids != "server" or not isinstance(spec.rules, SpanTrainer):
        return None
    return ids_layout(tokenizer, spec.rules)


def _by_thinking(
    frame: pl.DataFrame, spec: MaskSpec, arms: dict[str, bool]
) -> list[tuple[pl.DataFrame, MaskSpec]]:
    """A batch as parts of one thinking mode each, with the mask spec of that mode: a sampling plan's arms may
    think or not, and the trainer's template renders each mode its own way (no plan: the batch, as it is)."""
    if not arms or "arm" not in frame.columns:
        return [(frame, spec)]
    thinking = frame["arm"].replace_strict(arms, default=spec.enable_thinking, return_dtype=pl.Boolean)
    thinking = thinking.fill_null(spec.enable_thinking)
    parts = []
    for mode in (True, False):
        part = frame.filter(thinking == mode)
        if part.height:
            parts.append(
                (part, spec if mode == spec.enable_thinking else replace(spec, enable_thinking=mode))
            )
    return parts


def _validate_batch(
    stored: pl.DataFrame,
    tokenizer: Any,
    spec: MaskSpec,
    layout: IdsLayout | None,
    config: ValidateConfig,
    index: CorpusIndex,
    writer: export.ExportWriter,
    arms: dict[str, bool] | None = None,
) -> pl.DataFrame:
    """One batch of stored rows → its training rows, checked, flagged and (the kept ones) exported; ``arms``:
    whether each sampling-plan arm thinks (each sample is then checked by its own arm's rule)."""
    stored_problems = None
    if config.rows == "per_turn":
        turns = turn_rows(stored)
        frame, foreign, stored_problems = turns.frame, turns.foreign, turns.problems
        assembled = assemble_batch(frame)
        conversations = assembled.conversations
    else:
        frame = stored
        assembled = assemble_batch(frame)  # what the trainer sees: the target's own answers in place
        conversations, foreign = assembled.conversations, assembled.foreign
    retokenized = build_conversation_masks(
        tokenizer, conversations, spec, keep_ids=True, tools=assembled.tools
    )
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
    key = "prompt_id" if config.rows == "per_turn" else "id"  # the stored row's id, in either frame
    if arms and "arm" in stored.columns:  # each sample's arm, and whether that arm thinks
        arm_of = dict(zip(stored["id"], stored["arm"], strict=True))
        frame = frame.with_columns(
            pl.col(key).replace_strict(arm_of, default=None, return_dtype=pl.String).alias("arm")
        ).with_columns(
            pl.col("arm").replace_strict(arms, default=None, return_dtype=pl.Boolean).alias("thinking")
        )
    records = flag_batch(frame, masks, config, index, foreign, tokens)
    key = "prompt_id" if "prompt_id" in records.columns else "id"
    # held out by prompt: every sample of a prompt on the same side (a sample id names its prompt)
    held = np.array(
        [holdout_fraction(prompt_of(i)) < config.holdout_share for i in records[key].to_list()], dtype=bool
    )
    records = records.with_columns(pl.Series("held_out", held))
    kept = (~records["dropped"]).to_numpy() & ~held
    # A cut turn is exact only as ids: train.jsonl, rendered through the chat template, would close it.
    writer.write(
        frame, conversations, masks, kept, conversations_keep=kept & ~records["cut_trained"].to_numpy()
    )
    writer.write_held_out(frame, masks, (~records["dropped"]).to_numpy() & held)
    writer.write_holdout(
        stored.filter(
            pl.Series([holdout_fraction(prompt_of(i)) < config.holdout_share for i in stored["id"]])
        )
    )
    return records


def _check_template_fit(
    tokenizer: Any, spec: MaskSpec, config: ValidateConfig, arms: dict[str, bool]
) -> None:
    """Refuse, before a shard is read, a tokenizer whose chat template does not render what the trainer expects:
    every row would fail (ids_unusable, template_mismatch) for one cause that is better named once."""
    for thinking in sorted({spec.enable_thinking, *arms.values()}, reverse=True):
        problem = template_problem(tokenizer, spec.rules, spec.trainer.value, thinking)
        if problem:
            raise TokenizerLoadError(
                f"tokenizer {config.tokenizer} does not fit the trainer {spec.trainer.value}: {problem}"
            )


def validate_generation(
    config: ValidateConfig, *, tokenizer: Any = None, progress: bool = True
) -> ValidationResult:
    """Check every sample of the generation folder(s); write records, summary and the staged export."""
    started = time.perf_counter()
    output = open_generations(config.generation_dirs, config.prompt_file)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
    spec = config.mask_spec()
    arms = arm_thinking((output.outputs[0].manifest or {}).get("parameters") or {}) if output.outputs else {}
    _check_template_fit(tokenizer, spec, config, arms)
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
            for part, part_spec in _by_thinking(batch.frame, spec, arms):
                samples.write(
                    _validate_batch(part, tokenizer, part_spec, layout, config, index, writer, arms)
                )
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
    info = card.write_card(writer.staging, result)
    trainer_config.write_trainer_config(
        writer.staging,
        (out_dir / export.FINAL).resolve(),  # where the export is published: the paths the trainer reads
        trainer=config.trainer,
        max_length=config.max_length,
        last_turn_only=spec.last_turn_only,
        target_model=str(Path(config.tokenizer).resolve()),
        prompts=config.export_prompts,
        conversations=config.export_jsonl,
        holdout=bool(counts["held_out"]["prompts"]),
        served_model=info.get("target_model"),
    )
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
    at_length = counts.get("cut_at_max_length") or {"rows": 0, "trained": 0}
    trained = counts["cut_turns"]["trained"] - at_length["trained"]
    as_generated = f", {trained} of them trained as generated" if trained else ""
    expected = (
        f", {at_length['rows']} more cut at the trainer's max_length (expected, {at_length['trained']} trained as "
        "generated; not gated)"
        if at_length["rows"]
        else ""
    )
    return (
        f"{verdict}: {counts['degenerate']} of {counts['in']} samples degenerate "
        f"({result.degenerate_share:.1%}; threshold max_degenerate_share={result.config.max_degenerate_share:.1%}), "
        f"{counts['length_limited']} cut by max_tokens "
        f"({result.truncated_share:.1%}; threshold max_truncated_share={result.config.max_truncated_share:.1%}"
        f"{as_generated}){expected}. "
        f"Dropped by flag: {top}." + (f" {coverage}" if coverage else "")
    )


def gate_advice(result: ValidationResult) -> str:
    """What to fix, from the causes the flags show: the largest dropping defect when the degenerate share is over,
    max_tokens when the share cut by it is over."""
    config, counts = result.config, result.counts
    advice = []
    if result.degenerate_share > config.max_degenerate_share:
        worst = max(
            (flag for flag in counts["dropped_by_flag"] if flag not in LENGTH_FLAGS),
            key=lambda flag: counts["dropped_by_flag"][flag],
            default=None,
        )
        if worst is not None and counts["dropped_by_flag"][worst]:
            advice.append(
                f"Most degenerate samples are {worst}: {FLAG_ADVICE.get(worst, FLAG_ADVICE_DEFAULT)}"
            )
    if result.truncated_share > config.max_truncated_share:
        advice.append(
            "The samples cut by max_tokens had their whole max_tokens budget (the trainer's max_length left them "
            "more room): raise max_tokens up to the trainer's max_length, or max_truncated_share if answers this "
            "long are expected."
        )
    return (
        " ".join(advice)
        or "Look at the flag examples above, or raise a threshold if these samples are acceptable."
    )


def require_fit_to_train(result: ValidationResult) -> str:
    """The gate: return the PASS line, or raise ValidationGateError so papermill (and the pipeline) stops."""
    message = gate_message(result)
    if not result.passed:
        staged = result.out_dir / export.STAGING
        raise ValidationGateError(
            f"{message} The export was not published (left in {staged}). {gate_advice(result)}"
        )
    return message


def finalize_export(result: ValidationResult) -> Path:
    """Publish the staged export as ``out_dir/export`` (only for a result that passed the gate)."""
    if not result.passed:
        raise ValidationGateError(gate_message(result) + " The export is not published for a failed gate.")
    return export.finalize(result.out_dir)
