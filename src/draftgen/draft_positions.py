"""Acceptance per draft position, from SGLang's per-request drafts histogram.

SGLang 0.5.23 counts, per request, its verify steps by how many drafts each accepted (the bonus token not
counted): ``spec_correct_drafts_histogram[k]`` is the number of steps that accepted exactly k drafts, the list as
long as the largest k seen + 1 (docs/engines.md). generate stores it per turn (``turn_drafts_histogram``). A draft
is accepted only if every draft before it was (a chain, or the tree's accepted path), so the share of verify steps
whose k-th draft was accepted is sum(h[k:]) / sum(h): where the drafter stops being right, position by position.
The same counts say how often the k-th draft held once the (k-1)-th had: sum(h[k:]) / sum(h[k-1:]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

COLUMN = "turn_drafts_histogram"  # the stored row's per-turn histograms (docs/design.md, the stored row)


@dataclass(frozen=True)
class DraftPositions:
    """Verify steps by drafts accepted (``counts[k]``: steps that accepted exactly k), over ``turns`` turns."""

    counts: tuple[int, ...]
    turns: int  # generated turns whose server sent a histogram

    @property
    def verify_steps(self) -> int:
        return sum(self.counts)

    @property
    def positions(self) -> int:
        """Draft positions some verify step reached (1 … the most drafts any step accepted)."""
        return max(0, len(self.counts) - 1)

    def accepted(self, position: int) -> int:
        """Verify steps whose ``position``-th draft (1-based) was accepted."""
        return sum(self.counts[position:])

    def table(self) -> pl.DataFrame:
        """One row per draft position: the verify steps that accepted it, their share of all verify steps, and the
        share of those that had accepted the draft before it (null past a position no step reached)."""
        steps = self.verify_steps
        rows = [
            {
                "position": position,
                "accepted": self.accepted(position),
                "share": self.accepted(position) / steps if steps else None,
                "given_previous": (
                    self.accepted(position) / self.accepted(position - 1)
                    if self.accepted(position - 1)
                    else None
                ),
            }
            for position in range(1, self.positions + 1)
        ]
        return pl.DataFrame(
            rows,
            schema={
                "position": pl.Int64,
                "accepted": pl.Int64,
                "share": pl.Float64,
                "given_previous": pl.Float64,
            },
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (dataset_info.json): the counts, and each position's share rounded."""
        return {
            "turns": self.turns,
            "verify_steps": self.verify_steps,
            "steps_by_drafts_accepted": list(self.counts),
            "share_by_position": [
                round(row["share"], 4)
                for row in self.table().iter_rows(named=True)
                if row["share"] is not None
            ],
        }


def from_histograms(histograms: Sequence[Sequence[int] | None]) -> DraftPositions:
    """Several turns' histograms summed element by element (a None is a turn whose server sent none)."""
    width = max((len(h) for h in histograms if h is not None), default=0)
    counts = [0] * width
    turns = 0
    for histogram in histograms:
        if histogram is None:
            continue
        turns += 1
        for drafts, steps in enumerate(histogram):
            counts[drafts] += steps
    return DraftPositions(tuple(counts), turns)


def from_rows(frame: pl.LazyFrame, column: str = COLUMN) -> DraftPositions:
    """The histograms of every generated turn of ``frame`` (stored rows, each a list of per-turn histograms; a
    column absent from old shards reads as null), summed in polars: a million rows never become Python lists."""
    turns = (
        frame.select(pl.col(column).alias("h"))
        .explode("h")
        .filter(pl.col("h").is_not_null())
        .with_columns(pl.int_ranges(pl.col("h").list.len()).alias("k"))
    )
    by_k = turns.select("k", "h").explode("k", "h").group_by("k").agg(pl.col("h").sum()).sort("k").collect()
    count = turns.select(pl.len()).collect().item()
    counts = [0] * (int(by_k["k"].max()) + 1 if by_k.height else 0)
    for drafts, steps in by_k.iter_rows():
        counts[drafts] = int(steps)
    return DraftPositions(tuple(counts), int(count))
