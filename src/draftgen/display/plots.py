"""Figures as notebooks show them and run folders keep them: one wrapper for every plot draftgen draws.

A figure is drawn on a bare ``matplotlib.figure.Figure`` (no pyplot: no global figure registry, no backend to
choose in a kernel or a test), then either saved (``save``: ``folder/name.png``, shown inline from that file) or
only shown (``Plot(figure)``: rendered to PNG when displayed, e.g. by the read-only monitor).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from draftgen.rundir import replace_file
from draftgen.rundir.layout import plot_file

DPI = 110


@dataclass(frozen=True)
class Plot:
    """A figure shown inline as PNG whatever the matplotlib backend; ``path`` is where it was saved, if it was."""

    figure: Figure
    path: Path | None = None

    def _repr_png_(self) -> bytes:
        if self.path is not None:
            return self.path.read_bytes()
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
        return buffer.getvalue()

    def __repr__(self) -> str:
        if self.path is not None:
            return f"plot saved to {self.path}"
        return f"<plot: {self.figure.axes[0].get_title() if self.figure.axes else ''}>"


def new_figure(figsize: tuple[float, float], ncols: int = 1) -> tuple[Figure, Any]:
    """A figure and its axes (one, or a row of ``ncols``)."""
    figure = Figure(figsize=figsize)
    return figure, figure.subplots(1, ncols)


def save(figure: Figure, folder: str | Path, name: str) -> Plot:
    """Write ``folder/name.png`` and return it for inline display."""
    path = Path(folder) / plot_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(
        path, lambda temporary: figure.savefig(temporary, format="png", dpi=DPI, bbox_inches="tight")
    )
    return Plot(figure, path)


def message(figure: Figure, axes: Any, text: str) -> Plot:
    """Nothing to draw yet: say why in the middle of the axes."""
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=10)
    axes.set_axis_off()
    return Plot(figure)


def completion_length_histogram(
    axes: Any,
    tokens: Any,
    max_tokens: int | None,
    *,
    title: str,
    ylabel: str,
    xlabel: str = "completion tokens per turn (reasoning + answer)",
) -> None:
    """Completion tokens as a histogram, with max_tokens marked: where thinking models pile up when cut.
    ``tokens`` must be per request (a turn): max_tokens caps each request, not a conversation's sum."""
    import math

    import numpy as np

    values = np.asarray(tokens, dtype=float)
    bins = min(80, max(10, int(math.sqrt(max(1, len(values))))))
    axes.hist(values, bins=bins, color="#55a868")
    if max_tokens:
        cut = float((values >= max_tokens).mean()) if values.size else 0.0
        axes.axvline(
            max_tokens,
            color="#c44e52",
            linestyle="--",
            label=f"max_tokens {max_tokens:,} ({cut:.1%} reach it)",
        )
        axes.legend(fontsize=8)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)


def mean_band(axes: Any, band: tuple[float, float, float], linewidth: float = 1.2) -> float:
    """The run's mean acceptance as a dashed line over its 95% interval, so a wobble around it reads as one and not
    as a collapse; returns the interval's top for the caller's y limit."""
    mean, low, high = band
    axes.axhspan(low, high, color="#888888", alpha=0.25, lw=0)
    axes.axhline(
        mean,
        color="black",
        linestyle="--",
        linewidth=linewidth,
        label=f"run mean {mean:.2f} (95% interval {low:.2f}–{high:.2f})",
    )
    return high
