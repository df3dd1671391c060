"""The figure of ``draftgen.draft_positions``: acceptance per draft position, as generate's report and validate's
card read it. Drawn on a bare ``Figure``; callers save it (``display.plots``)."""

from __future__ import annotations

from matplotlib.figure import Figure

from draftgen.draft_positions import DraftPositions

TITLE = "How often is each draft position accepted?"
NO_HISTOGRAM = (
    "no drafts histogram in these turns: their servers sent none\n"
    "(SGLang 0.5.23 sends it with return_spec_tokens_details, on a speculative server)"
)


def acceptance_by_position(positions: DraftPositions) -> Figure:
    """Bars: the share of verify steps whose k-th draft was accepted; dots: the share of those that had accepted
    draft k-1. The first fall shows where the drafter stops being right, the second whether it stops for good."""
    figure = Figure(figsize=(7, 3.6))
    axes = figure.subplots()
    table = positions.table()
    if table.is_empty():
        axes.text(0.5, 0.5, NO_HISTOGRAM, ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
        axes.set_title(TITLE)
        return figure
    x = table["position"].to_list()
    shares = table["share"].to_list()
    axes.bar(x, shares, color="#4c72b0", label="of all verify steps")
    for position, share, accepted in zip(x, shares, table["accepted"].to_list(), strict=True):
        axes.annotate(f"{share:.1%}\n({accepted:,})", (position, share), ha="center", va="bottom", fontsize=8)
    axes.plot(
        x,
        table["given_previous"].to_list(),
        linestyle="none",
        marker="o",
        color="#dd8452",
        label="of the steps that accepted the draft before it",
    )
    axes.set_xticks(x)
    axes.set_ylim(0.0, 1.15)
    axes.set_title(
        f"{TITLE}\n({positions.verify_steps:,} verify steps of {positions.turns:,} generated turns)"
    )
    axes.set_xlabel("draft position (1 = the first token the drafter proposed)")
    axes.set_ylabel("share of verify steps\nthat accepted it")
    axes.legend(fontsize=7, loc="upper right")
    axes.grid(axis="y", alpha=0.3)
    return figure
