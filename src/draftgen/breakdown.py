"""Acceptance length and per-request speed broken down by prompt category, output length, turn (and arm).

A run's overall acceptance hides where the drafter is weak; the same figures per group show it. One table shape
serves generate's report, monitor, the benchmark and the drafter verdict: the caller hands in one row per
request (a generated turn) with its group columns, ``completion_tokens``, ``verify_ct`` and ``accept_length``
(either is enough) and ``latency_s`` (on the hardware's clock), and gets per group:

- ``requests`` (and ``share``), ``completion_tokens``;
- ``accept_length``: the group's generated tokens over its verify steps — what SGLang's own acceptance length
  counts, so a group's figure is the one its server would show serving only that group — with a 95% interval;
- ``tok_s``: the group's tokens over its requests' latencies (sent → last byte), with a 95% interval.

The interval is the normal approximation of a ratio estimator over independent requests (the delta method:
standard error ``sqrt(Σ (t_i − R·v_i)² / (n (n − 1))) / mean(v)``). Requests, not verify steps, are the
independent units (steps of one request share its text), and a ratio of sums is what the figure is; the
approximation is closed-form, exact enough from a few dozen requests on (the table gives ``requests`` beside
it, and none below 2), and costs one pass over 900K rows, where a bootstrap would cost a thousand.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import polars as pl

from draftgen.display.table import Column, Table

Z95 = 1.959964
NO_CATEGORY = "(none)"  # the group of rows without a category field
# Output-length buckets (completion tokens, upper edges): powers of two around the production max_tokens.
LENGTH_EDGES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
GROUPS = {"category": "category", "length": "output_tokens", "turn": "turn", "arm": "arm"}
INPUT_COLUMNS = ("completion_tokens", "verify_ct", "accept_length", "latency_s")


def length_bucket(tokens: pl.Expr) -> pl.Expr:
    """Each request's output-length bucket as a label (``"≤256"``, ``"257–512"``, ..., ``">32768"``), ordered."""
    lows = (0, *LENGTH_EDGES[:-1])
    labels = [
        f"≤{high}" if low == 0 else f"{low + 1}–{high}" for low, high in zip(lows, LENGTH_EDGES, strict=True)
    ]
    expr = pl.when(tokens.is_null()).then(pl.lit(None, dtype=pl.String))
    for high, label in zip(LENGTH_EDGES, labels, strict=True):
        expr = expr.when(tokens <= high).then(pl.lit(label))
    return expr.otherwise(pl.lit(f">{LENGTH_EDGES[-1]}"))


def bucket_order(label: str) -> int:
    """Sort key of a length-bucket label: its lower edge."""
    digits = label.lstrip("≤>").split("–")[0]
    return int(digits) + (1 if label.startswith(">") else 0) if digits.isdigit() else -1


def _ratio(numerator: str, denominator: str, name: str) -> list[pl.Expr]:
    """R = Σ num / Σ den over the group's requests that have both, and R's 95% interval (delta method)."""
    both = pl.col(numerator).is_not_null() & pl.col(denominator).is_not_null() & (pl.col(denominator) > 0)
    num, den = pl.col(numerator).filter(both), pl.col(denominator).filter(both)
    n = both.sum()
    ratio = pl.when(n > 0).then(num.sum() / den.sum())
    se = pl.when(n > 1).then(((num - ratio * den).pow(2).sum() / (n * (n - 1))).sqrt() / den.mean())
    return [
        ratio.alias(name),
        (ratio - Z95 * se).alias(f"{name}_low"),
        (ratio + Z95 * se).alias(f"{name}_high"),
        n.alias(f"{name}_requests"),
    ]


def prepare(requests: pl.DataFrame) -> pl.DataFrame:
    """The requests with a verify count wherever one can be had (tokens / acceptance when only that is known),
    the output-length bucket and a category label for rows without one."""
    frame = requests
    for column in INPUT_COLUMNS:
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias(column))
    frame = frame.with_columns(
        pl.col("completion_tokens").cast(pl.Float64),
        pl.coalesce(
            pl.col("verify_ct").cast(pl.Float64),
            pl.col("completion_tokens").cast(pl.Float64) / pl.col("accept_length"),
        ).alias("verify_ct"),
        pl.col("latency_s").cast(pl.Float64),
    )
    frame = frame.with_columns(length_bucket(pl.col("completion_tokens")).alias("output_tokens"))
    if "category" in frame.columns:
        frame = frame.with_columns(pl.col("category").cast(pl.String).fill_null(NO_CATEGORY))
    return frame


def breakdown(requests: pl.DataFrame, by: str) -> pl.DataFrame:
    """One row per group of ``by`` (``category``, ``length``, ``turn``, ``arm`` or a column name): requests,
    share, tokens, acceptance length and tok/s with their 95% intervals. Categories are sorted by acceptance
    (lowest first: where the drafter is weakest), lengths and turns in their own order."""
    column = GROUPS.get(by, by)
    frame = prepare(requests)
    if column not in frame.columns:
        raise ValueError(f"no column {column!r} to break acceptance down by (columns: {frame.columns})")
    table = (
        frame.group_by(column)
        .agg(
            pl.len().alias("requests"),
            pl.col("completion_tokens").sum().cast(pl.Int64).alias("completion_tokens"),
            *_ratio("completion_tokens", "verify_ct", "accept_length"),
            *_ratio("completion_tokens", "latency_s", "tok_s"),
        )
        .with_columns((pl.col("requests") / pl.col("requests").sum()).alias("share"))
    )
    if column == "output_tokens":
        table = table.sort(pl.col(column).map_elements(bucket_order, return_dtype=pl.Int64))
    elif column == "category":
        table = table.sort("accept_length", column, nulls_last=True)
    else:
        table = table.sort(column)
    order = ["requests", "share", "completion_tokens", "accept_length", "accept_length_low"]
    order += ["accept_length_high", "tok_s", "tok_s_low", "tok_s_high"]
    return table.select(
        column,
        *order,
        pl.col("accept_length_requests").alias("requests_with_acceptance"),
    ).with_columns(
        pl.col("share").round(4),
        pl.col("accept_length", "accept_length_low", "accept_length_high").round(3),
        pl.col("tok_s", "tok_s_low", "tok_s_high").round(1),
    )


TITLES = {
    "category": "by prompt category (lowest acceptance first)",
    "length": "by output length (completion tokens)",
    "turn": "by turn (0: the first answer of a conversation)",
    "arm": "by sampling arm",
}


def _with_interval(table: pl.DataFrame, value: str, digits: int) -> list[str | None]:
    """``3.10 (3.06–3.14)``: each row's figure and its 95% interval in one cell."""
    cells: list[str | None] = []
    for v, low, high in zip(table[value], table[f"{value}_low"], table[f"{value}_high"], strict=True):
        if v is None:
            cells.append(None)
        elif low is None or high is None:
            cells.append(f"{v:,.{digits}f}")
        else:
            cells.append(f"{v:,.{digits}f} ({low:,.{digits}f}–{high:,.{digits}f})")
    return cells


def shown(table: pl.DataFrame, name: str) -> Table:
    """One breakdown as a report table: a figure and its interval per cell, counts with separators."""
    group = table.columns[0]
    frame = table.select(
        pl.col(group).cast(pl.String),
        "requests",
        "share",
        "completion_tokens",
        pl.Series("accept_length", _with_interval(table, "accept_length", 2), dtype=pl.String),
        "requests_with_acceptance",
        pl.Series("tok_s", _with_interval(table, "tok_s", 1), dtype=pl.String),
    )
    return Table(
        frame,
        (
            Column(group, LABELS.get(name, group.replace("_", " "))),
            Column("requests", "requests", "int"),
            Column("share", "share", "percent"),
            Column("completion_tokens", "completion tokens", "int"),
            Column("accept_length", "acceptance length (95% interval)", "text"),
            Column("requests_with_acceptance", "requests with acceptance", "int"),
            Column("tok_s", "tok/s per request (95% interval)", "text"),
        ),
        title=f"Acceptance length and tok/s per request {TITLES.get(name, 'by ' + name)}",
        empty="no requests to break down",
    )


LABELS = {"category": "category", "length": "output length (tokens)", "turn": "turn", "arm": "arm"}


class Breakdowns(dict[str, pl.DataFrame]):
    """The tables by name; in a notebook, shown one under the other with a heading each."""

    def tables(self) -> list[Table]:
        return [shown(table, name) for name, table in self.items()]

    def _repr_html_(self) -> str:
        if not self:
            return f"<p><i>{html.escape(NOTHING)}</i></p>"
        return "".join(table._repr_html_() for table in self.tables())

    def __repr__(self) -> str:
        return "\n\n".join(str(table) for table in self.tables()) if self else NOTHING


NOTHING = "no finished requests to break acceptance down by yet"


def breakdowns(requests: pl.DataFrame, groups: Sequence[str] | None = None) -> Breakdowns:
    """The breakdowns that apply to these requests: by category (when any row has one), output length and turn
    (when there is more than one), and arm (when the requests carry one)."""
    if groups is None:
        groups = ["length"]
        if "category" in requests.columns and requests["category"].drop_nulls().len():
            groups.insert(0, "category")
        if "turn" in requests.columns and requests["turn"].n_unique() > 1:
            groups.append("turn")
        if "arm" in requests.columns and requests["arm"].n_unique() > 1:
            groups.append("arm")
    return Breakdowns({group: breakdown(requests, group) for group in groups})


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float]
) -> tuple[float, float, float] | None:
    """Σ num / Σ den and its 95% interval (the delta method, as ``breakdown``'s tables): for a whole run's
    acceptance over its /metrics windows, the line and band its plot draws. None without a positive denominator."""
    import numpy as np

    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    keep = np.isfinite(num) & np.isfinite(den) & (den > 0)
    num, den = num[keep], den[keep]
    if not den.size:
        return None
    ratio = float(num.sum() / den.sum())
    n = den.size
    if n < 2:
        return ratio, ratio, ratio
    se = float(np.sqrt(((num - ratio * den) ** 2).sum() / (n * (n - 1))) / den.mean())
    return ratio, ratio - Z95 * se, ratio + Z95 * se
