"""``run(config)``: the whole loop, into its run folder (``rundir``'s ``open_run`` … ``finish_run``).

features/export/, features/original/, features/holdout/   the target's features for (a), (b) and (c)
runs/<arm>-seed<N>/     each SpecForge run: specforge.yaml, train.log, its checkpoints
loop.json               the inputs' counts, every run's figures, the summary and the verdict
runs.parquet            one row per arm and seed (and the baseline): accuracy per position, lengths
parameters.yaml, .complete
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from draftgen.loop import arms, evaluate, features, report, specforge_run
from draftgen.loop.config import LoopConfig
from draftgen.rundir import finish_run, open_run, write_json, write_parquet

FEATURES = "features"
RUNS = "runs"
SUMMARY = "loop.json"
RUNS_TABLE = "runs.parquet"


@dataclass(frozen=True)
class LoopResult:
    out_dir: Path
    summary: pl.DataFrame
    runs: list[report.ArmRun]
    held_rows: int
    verdict: str
    inputs: dict[str, Any]

    @property
    def export_shown_better(self) -> bool:
        """The export's drafter beat the source answers' and the baseline on every seed."""
        return report.shown_better(self.summary, arms.ARM_EXPORT, (arms.ARM_ORIGINAL,))

    def table(self) -> report.Table:
        return report.table(self.summary, self.held_rows)


def _common_rows(
    export_rows: list[arms.Row], original: list[arms.Row], accepts: Any, limit: int
) -> tuple[list[arms.Row], list[arms.Row], int]:
    """The rows both arms train on: the same ids, each accepted by SpecForge's loader in both (first ``limit``)."""
    import torch

    def ok(row: arms.Row) -> bool:
        return accepts is None or bool(accepts(torch.tensor(row.loss_mask)))

    by_id = {r.id: r for r in original if ok(r)}
    pairs = [(r, by_id[r.id]) for r in export_rows if r.id in by_id and ok(r)]
    refused = len(export_rows) - len(pairs)
    if limit:
        pairs = pairs[:limit]
    return [a for a, _ in pairs], [b for _, b in pairs], refused


def run(config: LoopConfig) -> LoopResult:
    out = open_run(config.out_dir, config.public_dict())
    started = time.monotonic()
    prompts_file, eval_file = arms.export_files(config.export_dir)
    export_rows, held_rows = arms.read_rows(prompts_file), arms.read_rows(eval_file)
    if not held_rows:
        raise arms.LoopInputError(f"{eval_file} holds no row: raise validate's holdout_share")
    from draftgen.training.masks import load_tokenizer

    tokenizer = load_tokenizer(config.target)
    original = arms.original_rows(
        config.prompts, export_rows, tokenizer, config.trainer, config.train_max_length
    )
    probe = specforge_run.run_config(
        config, train=out, evaluate=out, rows=1, seed=config.seeds[0], out=out / RUNS, run_id="probe"
    )
    capture = features.resolve_capture(specforge_run.typed(probe))
    trained_a, trained_b, refused = _common_rows(export_rows, original.rows, capture.accepts, config.limit)
    if not trained_a:
        raise arms.LoopInputError(
            f"no row of {prompts_file} has a source answer SpecForge's DFlash loader accepts in both arms "
            f"({len(original.unanswered)} turns unanswered by the source, {len(original.unknown)} unknown ids)"
        )
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    target = features.load_target(config.target, config.device, config.dtype)
    sets = {
        arms.ARM_EXPORT: features.write_features(
            target, trained_a, out / FEATURES / arms.ARM_EXPORT, capture, arms.ARM_EXPORT
        ),
        arms.ARM_ORIGINAL: features.write_features(
            target, trained_b, out / FEATURES / arms.ARM_ORIGINAL, capture, arms.ARM_ORIGINAL
        ),
        arms.HOLDOUT: features.write_features(
            target, held_rows, out / FEATURES / arms.HOLDOUT, capture, arms.HOLDOUT
        ),
    }
    trained_arms = (arms.ARM_EXPORT, arms.ARM_ORIGINAL)
    if config.matched_arm:
        matched = arms.volume_matched(trained_a, trained_b)
        sets[arms.ARM_MATCHED] = features.write_features(
            target, matched, out / FEATURES / arms.ARM_MATCHED, capture, arms.ARM_MATCHED
        )
        trained_arms += (arms.ARM_MATCHED,)
    del target
    evaluated = set(sets[arms.HOLDOUT].ids)
    held = [r for r in held_rows if r.id in evaluated]
    token = evaluate.most_frequent_token(trained_a)
    base = evaluate.baseline_counts(held, token, config.block_size)
    runs = [
        report.ArmRun(
            report.BASELINE,
            None,
            base.accuracy,
            base.simulated_length,
            base.accepted,
            base.pooled,
            None,
            sets[arms.ARM_EXPORT].rows,
            sets[arms.ARM_EXPORT].trained_tokens,
        )
    ]
    for arm in trained_arms:
        for seed in config.seeds:
            run_id = f"{arm}-seed{seed}"
            spec = specforge_run.run_config(
                config,
                train=sets[arm].folder,
                evaluate=sets[arms.HOLDOUT].folder,
                rows=sets[arm].rows,
                seed=seed,
                out=out / RUNS / run_id,
                run_id=run_id,
            )
            trained = specforge_run.train(config, spec)
            counts = evaluate.checkpoint_counts(
                trained.folder / "specforge.yaml",
                trained.checkpoint,
                sets[arms.HOLDOUT].folder,
                config.device,
            )
            runs.append(
                report.ArmRun(
                    arm,
                    seed,
                    counts.accuracy,
                    counts.simulated_length,
                    counts.accepted,
                    counts.pooled,
                    trained.eval_metrics.get("eval/avg_acc"),
                    sets[arm].rows,
                    sets[arm].trained_tokens,
                    trained.seconds,
                )
            )
    summary = report.summary(runs)
    verdict = report.verdict(summary, arms.ARM_EXPORT, arms.ARM_ORIGINAL)
    inputs = {
        "export_rows": len(export_rows),
        "original_unanswered": len(original.unanswered),
        "original_unknown": len(original.unknown),
        "refused_by_loader": refused,
        "held_out_rows": len(held),
        "held_out_refused": len(sets[arms.HOLDOUT].refused),
        "capture_layers": list(capture.layers),
        "baseline_token": token,
        "seconds": time.monotonic() - started,
    }
    write_parquet(out / RUNS_TABLE, pl.DataFrame([_flat(r) for r in runs]))
    write_json(
        out / SUMMARY,
        {
            "inputs": inputs,
            "runs": [asdict(r) for r in runs],
            "summary": summary.to_dicts(),
            "verdict": verdict,
        },
        indent=2,
        end="\n",
    )
    finish_run(out)
    return LoopResult(out, summary, runs, len(held), verdict, inputs)


def _flat(run_: report.ArmRun) -> dict[str, Any]:
    row = asdict(run_)
    accuracy = row.pop("accuracy")
    return row | {f"acc_{k + 1}": a for k, a in enumerate(accuracy)}
