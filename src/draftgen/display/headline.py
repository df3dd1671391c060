"""The headline block a report opens with: the notebook's question, its answer in a few large figures, PASS/FAIL
with the reason, the clock the figures are on, and the files the run wrote.

A step's report module builds its ``Headline`` from its results (one function per step, ``headline(...)``), and
the notebook shows it in a cell tagged ``headline``. ``draftgen run`` moves that cell's output to the top of
report.html (``display.report_html``) and prints its text at the end, so the terminal and the report say the
same thing. A step adds a figure by adding a ``Stat``: the block lays out however many it is given.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

HEADLINE_TAG = "headline"  # the notebook cell whose output is the headline block
MARKER = "data-draftgen-headline"  # the attribute the block's HTML carries (the report and its tests find it by it)
VERDICTS = {
    "PASS": "#2e7d32",
    "FAIL": "#c62828",
    "WARN": "#ef6c00",
    "RUNNING": "#1565c0",
    "STOPPED": "#c62828",
}


@dataclass(frozen=True)
class Stat:
    """One large figure: ``value`` already formatted (``display.table.format_value``), its unit and a line under it."""

    label: str
    value: str
    unit: str = ""
    detail: str = ""

    def text(self) -> str:
        figure = f"{self.value} {self.unit}".strip()
        return f"{self.label}: {figure}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Headline:
    """What the run answers. ``verdict`` is PASS, FAIL, WARN, RUNNING, STOPPED or "" (a step with no gate)."""

    step: str
    question: str
    answer: str
    stats: Sequence[Stat] = ()
    verdict: str = ""
    reason: str = ""
    clock: str = ""  # the simulated-clock note, when the figures are on one
    files: Sequence[tuple[str, str | Path]] = field(default_factory=tuple)  # (what, path)
    home: str | Path | None = (
        None  # the run folder report.html is written to: links to files in it are relative
    )

    def __post_init__(self) -> None:
        if self.verdict and self.verdict not in VERDICTS:
            raise ValueError(f"headline verdict {self.verdict!r} is not one of {', '.join(VERDICTS)}")

    def text(self) -> str:
        """The block as lines for a terminal (what ``draftgen run`` prints at the end)."""
        lines = [f"{self.step}: {self.question}"]
        verdict = f"{self.verdict} — " if self.verdict else ""
        lines.append(f"  {verdict}{self.answer}")
        if self.reason:
            lines.append(f"  why: {self.reason}")
        lines += [f"  {stat.text()}" for stat in self.stats]
        if self.clock:
            lines.append(f"  clock: {self.clock}")
        lines += [f"  {what}: {path}" for what, path in self.files]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        esc = html.escape
        badge = ""
        if self.verdict:
            badge = f"<span class='dg-verdict' style='background:{VERDICTS[self.verdict]}'>{esc(self.verdict)}</span> "
        stats = "".join(
            "<div class='dg-stat'>"
            f"<div class='dg-stat-label'>{esc(s.label)}</div>"
            f"<div class='dg-stat-value'>{esc(s.value)}"
            + (f" <span class='dg-stat-unit'>{esc(s.unit)}</span>" if s.unit else "")
            + "</div>"
            + (f"<div class='dg-stat-detail'>{esc(s.detail)}</div>" if s.detail else "")
            + "</div>"
            for s in self.stats
        )
        reason = f"<p class='dg-reason'>{esc(self.reason)}</p>" if self.reason else ""
        clock = f"<p class='dg-clock'>{esc(self.clock)}</p>" if self.clock else ""
        files = ""
        if self.files:
            items = "".join(
                f"<li>{esc(what)}: <a href='{esc(_href(path, self.home))}'><code>{esc(str(path))}</code></a></li>"
                for what, path in self.files
            )
            files = (
                f"<details class='dg-files'><summary>files this run wrote</summary><ul>{items}</ul></details>"
            )
        return (
            f"<section class='dg-headline' {MARKER}='{esc(self.step)}'>{HEADLINE_STYLE}"
            f"<p class='dg-question'>{esc(self.step)}: {esc(self.question)}</p>"
            f"<p class='dg-answer'>{badge}{esc(self.answer)}</p>{reason}"
            f"<div class='dg-stats'>{stats}</div>{clock}{files}</section>"
        )


def _href(path: str | Path, home: str | Path | None) -> str:
    """A link the saved report can follow: relative to the run folder (where report.html is) for a file in it,
    else the file's absolute address."""
    target = Path(path).expanduser().absolute()
    if home is not None:
        try:
            return target.relative_to(Path(home).expanduser().absolute()).as_posix()
        except ValueError:
            pass
    return target.as_uri()


HEADLINE_STYLE = (
    "<style>"
    ".dg-headline{border:1px solid #c8d3e0;border-left:6px solid #4c72b0;border-radius:4px;padding:0.8em 1.1em;"
    "margin:0.4em 0 1em 0;background:#f7f9fc;max-width:100%;box-sizing:border-box}"
    ".dg-headline .dg-question{margin:0;color:#555;font-size:0.95em}"
    ".dg-headline .dg-answer{margin:0.3em 0;font-size:1.25em;font-weight:600;line-height:1.35}"
    ".dg-headline .dg-reason,.dg-headline .dg-clock{margin:0.2em 0;color:#444}"
    ".dg-headline .dg-clock{font-size:0.85em;font-style:italic}"
    ".dg-headline .dg-verdict{color:white;border-radius:3px;padding:0.05em 0.45em;font-size:0.9em}"
    ".dg-headline .dg-stats{display:flex;flex-wrap:wrap;gap:0.6em 2.2em;margin:0.6em 0}"
    ".dg-headline .dg-stat{min-width:9em;max-width:22em}"
    ".dg-headline .dg-stat-label{color:#555;font-size:0.85em}"
    ".dg-headline .dg-stat-value{font-size:1.7em;font-weight:600;font-variant-numeric:tabular-nums}"
    ".dg-headline .dg-stat-unit{font-size:0.55em;font-weight:400;color:#444}"
    ".dg-headline .dg-stat-detail{font-size:0.8em;color:#666}"
    ".dg-headline .dg-files{font-size:0.85em;color:#444}"
    ".dg-headline .dg-files ul{margin:0.2em 0}"
    "</style>"
)
