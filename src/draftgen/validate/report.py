"""Tables and the plot validate.ipynb shows: flag counts and rates, examples per flag, the mask-sum histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from draftgen.display.headline import Headline, Stat
from draftgen.display.notes import Notes, Stack
from draftgen.display.table import Column, Table, format_value
from draftgen.rundir.layout import EXPORT, EXPORT_STAGING, VALIDATE_RECORDS, VALIDATE_SUMMARY
from draftgen.validate.config import FLAGS
from draftgen.validate.counts import TRAINED
from draftgen.validate.pipeline import ValidationResult, gate_advice

EXAMPLE_COLUMNS = (
    "id",
    "shard",
    "row",
    "finish_reason",
    "mask_sum",
    "n_tokens",
    "answer",
    "reasoning",
    "mismatch",
    "difference",
    "ids_problem",
)


def flag_table(result: ValidationResult) -> pl.DataFrame:
    """One row per flag: how many samples carry it, the rate, how many of them it drops, and what it means."""
    total = max(result.samples, 1)
    dropped = result.counts["dropped_by_flag"]
    carried = (
        result.scan().select(pl.col(f).sum() for f in FLAGS).collect(engine="streaming").row(0, named=True)
        if result.samples
        else dict.fromkeys(FLAGS, 0)
    )
    return (
        pl.DataFrame(
            {
                "flag": list(FLAGS),
                "samples": [int(carried[f] or 0) for f in FLAGS],
                "dropped": [int(dropped.get(f, 0)) for f in FLAGS],
                "meaning": list(FLAGS.values()),
            }
        )
        .with_columns((pl.col("samples") / total).alias("rate"))
        .select("flag", "samples", "rate", "dropped", "meaning")
    )


def counts_table(result: ValidationResult) -> pl.DataFrame:
    counts = result.counts
    cut = counts["cut_turns"]["trained"]
    rows = [("in", counts["in"]), ("out (exported)", counts["out"])]
    if cut:
        rows.append(("  of them cut at their limit, trained as generated (not in train.jsonl)", cut))
    at_length = counts.get("cut_at_max_length") or {"rows": 0}
    rows.append(("cut by max_tokens (gated)", counts["length_limited"]))
    if at_length["rows"]:
        rows.append(("cut at the trainer's max_length (expected, not gated)", at_length["rows"]))
    rows.append(("dropped", counts["dropped"]))
    rows += [(f"  dropped with {flag}", n) for flag, n in counts["dropped_by_flag"].items() if n]
    rows += [(f"  kept with {flag}", n) for flag, n in counts["flagged_but_kept"].items() if n]
    return pl.DataFrame({"samples": [r[0] for r in rows], "count": [r[1] for r in rows]}, orient="col")


def flag_examples(result: ValidationResult, flag: str, limit: int | None = None) -> pl.DataFrame:
    limit = result.config.examples_per_flag if limit is None else limit
    columns = list(EXAMPLE_COLUMNS)
    if len(result.output.outputs) > 1:
        columns.insert(1, "folder")
    if not result.samples:
        return pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    return result.scan().filter(pl.col(flag)).head(limit).select(columns).collect()


def folder_table(result: ValidationResult) -> pl.DataFrame:
    """One row per generation folder: its shard of the prompt file, rows, limit and the run's status."""
    manifests = result.output.manifests
    return pl.DataFrame(
        {
            "folder": list(result.output.labels),
            "shard": [f"{f.shard[0]}/{f.shard[1]}" if f.shard else "all" for f in result.output.folders],
            "rows": [o.rows for o in result.output.outputs],
            "limit": [f.limit for f in result.output.folders],
            "status": [str(m.get("status")) if m else "no manifest" for m in manifests],
        },
        orient="col",
    )


def coverage_table(result: ValidationResult) -> pl.DataFrame:
    """Do the folders together hold every prompt of their prompt file, each once? One figure per row."""
    coverage = result.coverage
    rows: list[tuple[str, str]] = [
        ("generation folders", str(len(result.output.outputs))),
        ("prompt file", coverage.prompt_file or "unknown"),
        ("distinct ids stored", f"{coverage.stored:,}"),
    ]
    if coverage.checked:
        rows += [
            ("prompt ids expected", f"{coverage.expected:,} ({coverage.note})"),
            ("missing", f"{coverage.missing:,}"),
            *((f"  missing in shard {key}", f"{n:,}") for key, n in coverage.missing_by_shard.items()),
            ("  of them failed every attempt", f"{coverage.missing_failed:,} (a resume retries them)"),
            ("  e.g.", ", ".join(coverage.missing_examples) or "-"),
            ("stored ids not in the prompt file's selection", f"{coverage.unexpected:,}"),
        ]
    else:
        rows.append(("coverage", f"not checked: {coverage.note}"))
    rows += [
        ("shards no folder holds", ", ".join(coverage.missing_shards) or "none"),
        ("ids stored more than once (flagged duplicate_id)", f"{coverage.duplicated_ids:,}"),
    ]
    return pl.DataFrame({"figure": [r[0] for r in rows], "value": [r[1] for r in rows]}, orient="col")


def duplicate_table(result: ValidationResult, limit: int = 20) -> pl.DataFrame:
    """Ids stored more than once, with the folders holding them (the first one's row is exported)."""
    return (
        result.coverage.duplicates.head(limit)
        .with_columns(pl.col("folders").list.join(", "))
        .rename({"folders": "folders (first kept)"})
    )


def spikes(
    mask_sums: np.ndarray, *, min_share: float = 0.02, min_count: int = 10, top: int = 5
) -> list[tuple[int, int]]:
    """Exact mask-sum values held by many samples — (value, count), largest first.

    A healthy corpus spreads mask sums over hundreds of values; one value held by >= ``min_share`` of all samples
    (and >= ``min_count``) is a template artefact: the 6-token empty answers of the user's last run, for one.
    """
    values, counts = np.unique(mask_sums, return_counts=True)
    return spikes_of_counts(values, counts, min_share=min_share, min_count=min_count, top=top)


def spikes_of_counts(
    values: np.ndarray, counts: np.ndarray, *, min_share: float = 0.02, min_count: int = 10, top: int = 5
) -> list[tuple[int, int]]:
    """``spikes`` from each distinct mask sum and how many samples hold it (ascending values)."""
    if counts.size == 0:
        return []
    threshold = max(min_count, min_share * counts.sum())
    order = np.argsort(-counts, kind="stable")
    return [(int(values[i]), int(counts[i])) for i in order[:top] if counts[i] >= threshold]


def _preview(text: Any, width: int = 28) -> str:
    text = "" if text is None else str(text)
    text = text.replace("\n", "\\n")
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def max_tokens_caps(result: ValidationResult) -> list[int]:
    """The max_tokens the turns were generated under, from the generation folders' manifests: each run's own,
    unless every arm of its sampling plan sets its own, and each arm's."""
    caps: set[int] = set()
    for manifest in result.output.manifests:
        parameters = (manifest or {}).get("parameters") or {}
        arms = [a for a in parameters.get("sampling_plan") or [] if isinstance(a, dict)]
        own = [a["max_tokens"] for a in arms if isinstance(a.get("max_tokens"), int)]
        caps.update(own)
        if isinstance(parameters.get("max_tokens"), int) and (not arms or len(own) < len(arms)):
            caps.add(parameters["max_tokens"])
    return sorted(caps)


def plot_mask_sums(result: ValidationResult, ax: Any = None) -> Any:
    """Histogram of supervised tokens per sample, log scale, with each spike annotated by an example. With one row
    per turn (``rows: per_turn``) max_tokens caps each sample's generated tokens: its line marks where the turns
    it cut pile up; a conversation's row sums its turns, which no cap applies to."""
    import matplotlib.pyplot as plt

    # One row per distinct mask sum (at most max_length of them), not one per sample: the histogram of a 1M-row
    # corpus from a few KB.
    histogram = (
        result.scan().group_by("mask_sum").len().sort("mask_sum").collect(engine="streaming")
        if result.samples
        else pl.DataFrame(schema={"mask_sum": pl.Int64, "len": pl.UInt32})
    )
    values, counts = histogram["mask_sum"].to_numpy(), histogram["len"].to_numpy()
    total = int(counts.sum())
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4.5))
    per_turn = result.config.rows == "per_turn"
    ax.set_title("How many tokens does each sample's loss mask supervise?")
    ax.set_xlabel(
        f"mask sum (supervised tokens per sample, {'one generated turn' if per_turn else 'one conversation'} "
        "each; linear to 32, log above)"
    )
    ax.set_ylabel("samples (log)")
    if total == 0:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center")
        return ax
    top = max(int(values.max()), 33)
    edges = np.unique(np.concatenate([np.arange(0, 33), np.geomspace(33, top + 1, 40).round()]))
    edges = np.append(edges, edges[-1] + 1)
    ax.hist(values, bins=edges - 0.5, weights=counts, color="#4c72b0", log=True)
    ax.set_xscale("symlog", linthresh=32)
    ticks = [0, 1, 2, 4, 8, 16, 32] + [2**k for k in range(6, 17) if 2 ** (k - 1) <= top]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.axvline(result.config.min_assistant_tokens + 0.5, color="#c44e52", linestyle="--", linewidth=1)
    ax.text(
        result.config.min_assistant_tokens + 0.7,
        0.97,
        f"tiny_mask ≤ {result.config.min_assistant_tokens}",
        color="#c44e52",
        transform=ax.get_xaxis_transform(),
        va="top",
        fontsize=8,
    )
    for cap in max_tokens_caps(result) if per_turn else []:
        ax.axvline(cap, color="#8172b2", linestyle="--", linewidth=1)
        ax.text(
            cap * 0.97,
            0.97,
            f"max_tokens {cap:,} (caps each turn)",
            color="#8172b2",
            transform=ax.get_xaxis_transform(),
            ha="right",
            va="top",
            fontsize=8,
        )
        ax.set_xlim(right=max(ax.get_xlim()[1], cap * 1.15))
    for rank, (value, count) in enumerate(spikes_of_counts(values, counts)):
        example = (
            result.scan()
            .filter(pl.col("mask_sum") == value)
            .head(1)
            .select("id", "answer", "reasoning")
            .collect()
            .row(0, named=True)
        )
        label = (
            f"mask sum {value}: {count} samples ({count / total:.0%})\n"
            f"e.g. {example['id']}: answer {_preview(example['answer'])}, "
            f"reasoning {_preview(example['reasoning'])}"
        )
        ax.annotate(
            label,
            xy=(value, count),
            xytext=(0.35, 0.9 - 0.17 * rank),
            textcoords="axes fraction",
            fontsize=8,
            arrowprops={"arrowstyle": "->", "color": "#555555"},
            bbox={"boxstyle": "round", "fc": "#fff8e1", "ec": "#999999"},
        )
    return ax


def plot_flag_rates(result: ValidationResult, ax: Any = None) -> Any:
    """Bar chart: which defects, and how common? (red: the samples the flag drops, grey: those kept with it)"""
    import matplotlib.pyplot as plt

    table = flag_table(result)
    total = max(result.samples, 1)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    flags = table["flag"].to_list()
    dropped = (table["dropped"] / total * 100).to_list()
    kept = ((table["samples"] - table["dropped"]) / total * 100).to_list()
    ax.barh(flags, dropped, color="#c44e52")
    ax.barh(flags, kept, left=dropped, color="#8c8c8c")
    ax.invert_yaxis()
    ax.set_xlabel("% of samples (red: dropped from the export, grey: kept with the flag)")
    ax.set_title("Which defects does the generated data have, and how often?")
    return ax


def yield_table(result: ValidationResult) -> pl.DataFrame:
    """Where the tokens the target generated went: each in one bucket, trained first (the buckets sum to the
    generated tokens)."""
    made = result.counts["yield"]
    total = max(made["generated_tokens"], 1)
    rows = [("generated by the target", made["generated_tokens"])]
    rows += [(f"  {bucket}", n) for bucket, n in made["buckets"].items()]
    return pl.DataFrame(
        {"tokens": [r[0] for r in rows], "count": [r[1] for r in rows], "share": [r[1] / total for r in rows]}
    )


def token_source_line(result: ValidationResult) -> str:
    """One line: how many rows carry the server's own ids, how many were re-tokenized, and how often that differs."""
    source = result.counts["token_source"]
    line = f"{source['server']:,} rows from the server's token ids, {source['retokenized']:,} re-tokenized from text"
    if source["server"] == 0:
        return line + " (the servers sent no token ids, or token_ids is 'retokenize')"
    rate = source["retokenized_differs_rate"]
    return line + f"; re-tokenizing would differ on {source['retokenized_differs']:,} of them ({rate:.1%})"


def plot_yield(result: ValidationResult, ax: Any = None) -> Any:
    """Bar chart: of the tokens the GPUs generated, how many train the drafter, and where did the rest go?"""
    import matplotlib.pyplot as plt

    made = result.counts["yield"]
    labels, values = list(made["buckets"]), list(made["buckets"].values())
    total = max(made["generated_tokens"], 1)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.4 * len(labels) + 1.5))
    colors = [
        "#55a868" if label == TRAINED else "#c44e52" if label.startswith("dropped") else "#8c8c8c"
        for label in labels
    ]
    ax.barh(labels, [100 * v / total for v in values], color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("% of the tokens the target generated")
    share = made["share"]
    ax.set_title(
        "How much of what the GPUs generated trains the drafter?"
        + (f" {share:.1%}" if share is not None else " (no tokens generated)")
    )
    return ax


# ----- what the report shows --------------------------------------------------------------------------------
def inputs(result: ValidationResult) -> Stack:
    """What was read (folders, shards, tokenizer, trainer) and each folder's manifest, in a table."""
    lines = [
        f"{result.samples:,} samples from {len(result.output.shards):,} shards in {result.output.describe()} "
        f"({result.seconds:.1f} s); tokenizer {result.config.tokenizer}, trainer {result.config.trainer.value}.",
        *(f"Warning: {w}" for w in result.output.warnings),
    ]
    runs = []
    for folder, manifest in zip(result.output.labels, result.output.manifests, strict=True):
        if manifest is not None:
            counts = manifest.get("counts") or {}
            runs.append(
                {
                    "folder": str(folder),
                    "status": str(manifest.get("status")),
                    "done": counts.get("done"),
                    "failed": counts.get("failed"),
                    "rejected": counts.get("rejected"),
                    "fingerprint": str(manifest.get("fingerprint")),
                }
            )
    table = Table(
        pl.DataFrame(
            runs,
            schema={
                "folder": pl.String,
                "status": pl.String,
                "done": pl.Int64,
                "failed": pl.Int64,
                "rejected": pl.Int64,
                "fingerprint": pl.String,
            },
        ),
        title="The generation runs read (their manifests)",
        empty="no manifest in the generation folders",
    )
    return Stack((Notes(lines), table))


def coverage_view(result: ValidationResult) -> Stack:
    """Do the folders cover the prompt file, each id once?"""
    blocks: list[Any] = [
        Notes((result.coverage.line(),)),
        Table(folder_table(result), title="Generation folders"),
        Table(coverage_table(result), (Column("figure", kind="text"), Column("value", kind="text"))),
    ]
    if result.coverage.duplicated_ids:
        blocks.append(
            Table(
                duplicate_table(result),
                title="Ids stored more than once (the first folder's copy is exported)",
            )
        )
    return Stack(blocks)


def flags_view(result: ValidationResult) -> Stack:
    """Which defects, how often, and what reaches the export."""
    flags = Table(
        flag_table(result),
        (
            Column("flag", kind="text"),
            Column("samples", kind="int"),
            Column("rate", "share of samples", "percent", 2),
            Column("dropped", "dropped from the export", "int"),
            Column("meaning", kind="text"),
        ),
    )
    counts = Table(counts_table(result), (Column("samples", kind="text"), Column("count", kind="int")))
    return Stack((flags, counts))


def examples_view(result: ValidationResult) -> Stack:
    """A few example rows per flag that any sample carries, the answers shared by many prompts."""
    blocks: list[Any] = []
    for flag, meaning in FLAGS.items():
        examples = flag_examples(result, flag)
        if examples.height:
            blocks.append(
                Table(
                    examples.with_columns(
                        pl.col(c).map_elements(_short, return_dtype=pl.String)
                        for c in ("answer", "reasoning", "difference", "mismatch", "ids_problem")
                        if c in examples.columns and examples.schema[c] == pl.String
                    ),
                    title=f"{flag}: {meaning}",
                    keys=("id",),
                )
            )
    shared = result.index.duplicate_answer_examples
    if shared.height:
        blocks.append(
            Table(shared.select("count", "answer").head(10), title="Answers shared by many prompts")
        )
    if not blocks:
        blocks.append(Notes((), none="No sample carries any flag."))
    return Stack(blocks)


def _short(text: str | None, width: int = 120) -> str | None:
    if text is None:
        return None
    text = text.replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


def yield_view(result: ValidationResult) -> Stack:
    """Where the tokens the target generated went, trained first; which ids the rows were built from."""
    table = Table(
        yield_table(result),
        (
            Column("tokens", "where the tokens went", "text"),
            Column("count", "tokens", "int"),
            Column("share", "share", "percent"),
        ),
    )
    return Stack((Notes((token_source_line(result) + ".",)), table))


def headline(result: ValidationResult) -> Headline:
    """Is the data fit to train on? PASS/FAIL and why, exported rows and the yield."""
    counts = result.counts
    made = counts.get("yield") or {}
    share = made.get("share")
    worst = sorted(counts["dropped_by_flag"].items(), key=lambda item: -item[1])
    top = ", ".join(f"{flag} {n:,}" for flag, n in worst[:3] if n) or "none"
    config = result.config
    passed = result.passed
    at_length = counts.get("cut_at_max_length") or {"rows": 0, "trained": 0}
    if passed:
        reason = (
            f"degenerate {result.degenerate_share:.1%} ≤ {config.max_degenerate_share:.1%} and cut by max_tokens "
            f"{result.truncated_share:.1%} ≤ {config.max_truncated_share:.1%}"
        )
    else:
        over = []
        if result.degenerate_share > config.max_degenerate_share:
            over.append(
                f"degenerate {result.degenerate_share:.1%} > max_degenerate_share {config.max_degenerate_share:.1%}"
            )
        if result.truncated_share > config.max_truncated_share:
            over.append(
                f"cut by max_tokens {result.truncated_share:.1%} > max_truncated_share {config.max_truncated_share:.1%}"
            )
        if not counts["in"]:
            over.append("no samples")
        reason = "; ".join(over) + ": the export is not published. " + gate_advice(result)
    out = result.out_dir
    return Headline(
        step="validate",
        question="is the generated data fit to train a drafter on?",
        answer=(
            f"{counts['out']:,} of {counts['in']:,} training rows exported"
            + (f"; {share:.1%} of the generated tokens train the drafter" if share is not None else "")
        ),
        verdict="PASS" if passed else "FAIL",
        reason=reason,
        stats=[
            Stat("rows exported", f"{counts['out']:,}", "", f"of {counts['in']:,} (one per generated turn)"),
            Stat(
                "yield",
                format_value(share, "percent"),
                "",
                f"{made.get('trained_tokens', 0):,} trained tokens",
            ),
            Stat(
                "degenerate",
                format_value(result.degenerate_share, "percent"),
                "",
                f"threshold {config.max_degenerate_share:.1%}",
            ),
            Stat(
                "cut by max_tokens",
                format_value(result.truncated_share, "percent"),
                "",
                f"threshold {config.max_truncated_share:.1%}",
            ),
            Stat(
                "cut at max_length",
                f"{at_length['rows']:,}",
                "rows",
                f"expected, not gated; {at_length['trained']:,} trained as generated",
            ),
            Stat("dropped", f"{counts['dropped']:,}", "rows", f"most: {top}"),
        ],
        files=[
            ("summary", out / VALIDATE_SUMMARY),
            ("per-sample records", out / VALIDATE_RECORDS),
            ("training export", out / (EXPORT if passed else EXPORT_STAGING)),
        ],
        home=out,
    )


def export_view(result: ValidationResult, export_dir: Path) -> Stack:
    """What the export holds: a sentence, then each file and its size."""
    counts = result.counts
    files = sorted(p for p in export_dir.rglob("*") if p.is_file())
    table = Table(
        pl.DataFrame(
            {
                "file": [str(p.relative_to(export_dir)) for p in files],
                "bytes": [p.stat().st_size for p in files],
            },
            schema={"file": pl.String, "bytes": pl.Int64},
        ),
        (Column("file", kind="text"), Column("bytes", "size", "bytes")),
        empty="the export folder is empty",
    )
    line = (
        f"Exported {counts['out']:,} of {counts['in']:,} samples to {export_dir} "
        f"({counts['conversation_rows']:,} of them in train.jsonl)."
    )
    return Stack((Notes((line,)), table))
