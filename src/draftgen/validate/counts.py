"""What validate counts over the per-sample records: rows in, out and dropped by flag, the gate's two shares, and
where every generated token went (the trained-token buckets).

The unit of account is the trained token (docs/validate.md#yield-where-every-generated-token-went): every token the
target generated lands in exactly one bucket of ``token_yield``'s ``buckets`` — trained, held out, cut at
max_length, not supervised, or dropped under the first flag that dropped its row — so the buckets sum to the
generated tokens. A turn that a client ends as a repetition loop (``turn_ended_by``) gets a bucket of its own
beside these once validate reads that column.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from draftgen.validate.config import FLAGS, LENGTH_FLAGS, ValidateConfig

TRAINED = "trained"
HELD_OUT = "held out (the drafter verdict's prompts)"
CUT_AT_MAX_LENGTH = "cut at max_length"
NOT_SUPERVISED = "not supervised"


def dropped_bucket(flag: str) -> str:
    return f"dropped: {flag}"


def _totals(records: pl.LazyFrame, exprs: list[pl.Expr]) -> dict[str, Any]:
    """One row of aggregates over the records, streamed (only the columns the expressions name are read)."""
    return records.select(exprs).collect(engine="streaming").row(0, named=True)


def _column(columns: list[str], name: str) -> pl.Expr:
    """A boolean record column, False for records written without it."""
    return pl.col(name) if name in columns else pl.lit(False)


def _no_cut_turns() -> dict[str, int]:
    return {"trained": 0, "trained_tokens": 0, "closing_tokens": 0, "closing_measured": 0}


def count_flags(records: pl.DataFrame | pl.LazyFrame, config: ValidateConfig) -> dict[str, Any]:
    """Samples in, out and dropped; a sample with several flags counts under each, and once in dropped.

    ``out`` is every exported row (prompts.jsonl, the token parquet); ``cut_turns.trained`` of them are turns cut
    by max_tokens trained as generated, which train.jsonl leaves out (``conversation_rows``)."""
    records = records.lazy()
    columns = records.collect_schema().names()
    size = _totals(records, [pl.len().alias("n")])["n"] if columns else 0
    drop = [f for f in FLAGS if f in config.drop_flags]
    if not size:
        return {
            "in": 0,
            "out": 0,
            "conversation_rows": 0,
            "held_out": {"rows": 0, "prompts": 0},
            "yield": token_yield(records, config),
            "token_source": token_sources(records),
            "dropped": 0,
            "degenerate": 0,
            "length_limited": 0,
            "cut_at_max_length": {"rows": 0, "trained": 0},
            "cut_turns": _no_cut_turns(),
            "dropped_by_flag": dict.fromkeys(drop, 0),
            "flagged_but_kept": {f: 0 for f in FLAGS if f not in config.drop_flags},
        }
    held = _column(columns, "held_out")
    cut = _column(columns, "cut_trained")  # exported as generated (held-out ones included)
    trained_cut = cut & ~held
    key = "prompt_id" if "prompt_id" in columns else "id"
    # A sample cut inside its reasoning has no answer: that empty answer is the truncation's doing, not a defect.
    # A row whose answer lies past the trainer's window is the trainer's cut: its loader dropping it
    # (trainer_rejects) is not a defect.
    past = _column(columns, "past_max_length")
    defect = [
        pl.col(f) & ~past if f == "trainer_rejects" else pl.col(f)
        for f in drop
        if f not in LENGTH_FLAGS and f != "empty_answer"
    ]
    if "empty_answer" in drop:
        defect.append(pl.col("empty_answer") & ~pl.col("truncated"))
    defective = pl.any_horizontal(defect) if defect else pl.lit(False)
    degenerate = (defective & pl.col("dropped")).sum()
    # Ran out of length budget: dropped only for length flags, or cut and trained as generated. Judged by cause:
    # a cut where the trainer's max_length set the budget is expected and never counts against the gate.
    out_of_budget = (pl.col("dropped") & ~defective) | cut
    at_max_length = _column(columns, "cut_at_max_length")
    closing = pl.col("closing_tokens") if "closing_tokens" in columns else pl.lit(None, dtype=pl.Int64)
    totals = _totals(
        records,
        [
            *(pl.col(f).sum().alias(f) for f in FLAGS if f not in drop),
            *((pl.col(f) & pl.col("dropped")).sum().alias(f) for f in drop),
            pl.col("dropped").sum().alias("dropped"),
            degenerate.alias("degenerate"),
            held.sum().alias("held_rows"),
            (held & ~pl.col("dropped")).sum().alias("held_kept"),
            pl.col(key).filter(held).n_unique().alias("held_prompts"),
            trained_cut.sum().alias("cut_trained"),
            pl.col("supervised_generated").filter(trained_cut).sum().alias("cut_tokens"),
            closing.filter(trained_cut).sum().alias("closing"),
            closing.filter(trained_cut).count().alias("closing_measured"),
            (out_of_budget & ~at_max_length).sum().alias("length_limited"),
            (out_of_budget & at_max_length).sum().alias("at_max_length"),
            (trained_cut & at_max_length).sum().alias("at_max_length_trained"),
        ],
    )
    dropped, degenerate_rows = int(totals["dropped"]), int(totals["degenerate"])
    held_rows = int(totals["held_rows"])
    out = size - dropped - int(totals["held_kept"])
    trained = int(totals["cut_trained"] or 0)
    return {
        "in": size,
        "out": out,
        "conversation_rows": out - trained if config.export_jsonl else 0,
        "held_out": {"rows": held_rows, "prompts": int(totals["held_prompts"]) if held_rows else 0},
        "yield": token_yield(records, config),
        "token_source": token_sources(records),
        "dropped": dropped,
        "degenerate": degenerate_rows,  # dropped for a defect (a sample with a defect and a length flag counts here)
        # ran out of the budget max_tokens set: dropped only for length flags, or cut and trained as generated
        "length_limited": int(totals["length_limited"] or 0),
        # the same where the trainer's max_length set the budget: expected, reported, never gated
        "cut_at_max_length": {
            "rows": int(totals["at_max_length"] or 0),
            "trained": int(totals["at_max_length_trained"] or 0),
        },
        "cut_turns": {
            "trained": trained,
            "trained_tokens": int(totals["cut_tokens"] or 0),
            # tokens the chat template would add closing them (train.jsonl's path), over the rows where measured
            "closing_tokens": int(totals["closing"] or 0),
            "closing_measured": int(totals["closing_measured"] or 0),
        },
        "dropped_by_flag": {f: int(totals[f]) for f in drop},  # rows that carry the flag and were dropped
        "flagged_but_kept": {f: int(totals[f]) for f in FLAGS if f not in drop},
    }


def token_yield(records: pl.DataFrame | pl.LazyFrame, config: ValidateConfig) -> dict[str, Any]:
    """Trained tokens (generated tokens that an exported row's mask supervises) ÷ every token the target
    generated, and ``buckets``: each generated token once — trained; held out; cut at max_length or not
    supervised (what a kept row's mask leaves out: an earlier turn re-rendered without its reasoning, say); or a
    dropped row's, under its first drop flag (length flags first)."""
    records = records.lazy()
    columns = records.collect_schema().names()
    empty = {"generated_tokens": 0, "trained_tokens": 0, "share": None, "buckets": {}}
    if not columns:
        return empty
    held = _column(columns, "held_out")
    past = _column(columns, "past_max_length")  # dropped: the trainer's window left the answer nothing
    kept = ~pl.col("dropped") & ~held
    generated, supervised = pl.col("generated_tokens"), pl.col("supervised_generated")
    cut = pl.min_horizontal(pl.col("cut_generated"), generated - supervised).clip(0)
    totals = _totals(
        records,
        [
            pl.len().alias("rows"),
            generated.sum().alias("generated"),
            supervised.filter(kept).sum().alias("trained"),
            generated.filter(~pl.col("dropped") & held).sum().alias("withheld"),
            cut.filter(kept).sum().alias("cut"),
            (generated - supervised - cut).filter(kept).sum().alias("rest"),
            generated.filter(pl.col("dropped") & past).sum().alias("past"),
        ],
    )
    if not totals["rows"]:
        return empty
    made, trained = int(totals["generated"]), int(totals["trained"])
    rest: dict[str, int] = {}
    # A row cut by max_tokens has an empty answer too: the cut is why, so length flags are named first.
    order = [f for f in LENGTH_FLAGS if f in config.drop_flags] + [
        f for f in config.drop_flags if f not in LENGTH_FLAGS
    ]
    first = pl.coalesce([pl.when(pl.col(f)).then(pl.lit(f)) for f in order] or [pl.lit("?")])
    by_flag = (
        records.filter(pl.col("dropped") & ~past)
        .group_by(first.alias("flag"))
        .agg(generated.sum())
        .collect(engine="streaming")
    )
    for flag, n in by_flag.iter_rows():
        if n:
            rest[dropped_bucket(flag)] = int(n)
    for name, n in (
        (HELD_OUT, totals["withheld"]),
        (CUT_AT_MAX_LENGTH, (totals["cut"] or 0) + (totals["past"] or 0)),
    ):
        if n:
            rest[name] = int(n)
    if totals["rest"]:
        rest[NOT_SUPERVISED] = int(totals["rest"])
    return {
        "generated_tokens": made,
        "trained_tokens": trained,
        "share": trained / made if made else None,
        "buckets": {TRAINED: trained, **dict(sorted(rest.items(), key=lambda item: -item[1]))},
    }


def token_sources(records: pl.LazyFrame) -> dict[str, Any]:
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
