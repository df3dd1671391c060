"""The two figures of ``draftgen.breakdown``'s tables: acceptance by prompt category and by output length.

Each bar or point carries its 95% interval and its request count, so a low figure from a handful of requests
is not read as a weak spot. The figures are drawn on a bare ``Figure``; callers save them (``display.plots``).
"""

from __future__ import annotations

import polars as pl
from matplotlib.figure import Figure

FEW_REQUESTS = 30  # below this the interval is rough: the bar is drawn pale


def _errors(table: pl.DataFrame) -> list[list[float]]:
    value = table["accept_length"].fill_null(0).to_list()
    low = table["accept_length_low"].to_list()
    high = table["accept_length_high"].to_list()
    return [
        [v - lo if lo is not None else 0.0 for v, lo in zip(value, low, strict=True)],
        [hi - v if hi is not None else 0.0 for v, hi in zip(value, high, strict=True)],
    ]


def _empty(figure: Figure, text: str) -> Figure:
    axes = figure.subplots()
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()
    return figure


def acceptance_by_category(table: pl.DataFrame | None, unit: str = "requests") -> Figure:
    """Horizontal bars, lowest acceptance on top, each labelled with its count: where the drafter is weakest."""
    if table is None or table.is_empty() or table["accept_length"].drop_nulls().is_empty():
        return _empty(Figure(figsize=(8, 2.5)), "no category or no per-request acceptance in these rows")
    table = table.filter(pl.col("accept_length").is_not_null()).sort("accept_length", descending=True)
    figure = Figure(figsize=(8, 1.2 + 0.38 * table.height))
    axes = figure.subplots()
    labels = [str(c) for c in table["category"].to_list()]
    counts = table["requests_with_acceptance"].to_list()
    colors = ["#4c72b0" if n >= FEW_REQUESTS else "#a6bddb" for n in counts]
    values = table["accept_length"].to_list()
    axes.barh(labels, values, xerr=_errors(table), color=colors, capsize=3)
    for index, (value, count) in enumerate(zip(values, counts, strict=True)):
        axes.annotate(
            f" {value:.2f}  (n={count:,})",
            (value, index),
            va="center",
            ha="left",
            fontsize=8,
            xytext=(6, 0),
            textcoords="offset points",
        )
    axes.set_xlim(1.0, max(values) * 1.25)
    axes.set_title("Where is acceptance low? Acceptance length by prompt category (95% interval)")
    axes.set_xlabel(f"acceptance length (tokens per verify step), over {unit}")
    axes.grid(axis="x", alpha=0.3)
    return figure


def acceptance_by_length(table: pl.DataFrame, unit: str = "requests") -> Figure:
    """Acceptance length per output-length bucket (points with intervals), request counts as bars behind."""
    table = table.filter(pl.col("accept_length").is_not_null())
    if table.is_empty():
        return _empty(Figure(figsize=(8, 2.5)), "no per-request acceptance in these rows")
    figure = Figure(figsize=(8, 3.6))
    axes = figure.subplots()
    labels = [str(b) for b in table["output_tokens"].to_list()]
    positions = list(range(len(labels)))
    counts = axes.twinx()
    counts.bar(positions, table["requests_with_acceptance"].to_list(), color="#dddddd", zorder=0)
    counts.set_ylabel(unit, color="#888888")
    axes.set_zorder(counts.get_zorder() + 1)
    axes.patch.set_visible(False)
    axes.errorbar(
        positions,
        table["accept_length"].to_list(),
        yerr=_errors(table),
        marker="o",
        capsize=3,
        color="#c44e52",
    )
    axes.set_xticks(positions, labels, fontsize=8)
    highs = [h for h in table["accept_length_high"].to_list() if h is not None]
    axes.set_ylim(1.0, max([*highs, *table["accept_length"].to_list()]) * 1.08)  # from 1: no draft accepted
    axes.set_title("Does acceptance change with output length? (95% interval; grey: requests)")
    axes.set_xlabel("completion tokens per request")
    axes.set_ylabel("acceptance length\n(tokens per verify step; 1 = none accepted)")
    axes.grid(axis="y", alpha=0.3)
    return figure
