"""Findings as sentences, and long event logs folded to their last lines and a count.

A report says what it found in sentences ("nothing missing: ..."), not as a Python list or string repr; a log of
hundreds of lines shows its last few and how many came before, the rest folded away.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

LEVELS = {"info": "#1565c0", "warn": "#ef6c00", "fail": "#c62828", "ok": "#2e7d32"}


@dataclass(frozen=True)
class Notes:
    """Sentences under a title; ``none`` is the sentence shown when there are none."""

    items: Sequence[str]
    title: str = ""
    none: str = ""
    level: str = "info"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"notes level {self.level!r} is not one of {', '.join(LEVELS)}")

    def text(self) -> str:
        lines = [self.title] if self.title else []
        if not self.items:
            return "\n".join([*lines, self.none]) if self.none else "\n".join(lines)
        return "\n".join([*lines, *(f"- {item}" for item in self.items)])

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        title = (
            f"<p style='margin:0.4em 0 0.1em 0'><b>{html.escape(self.title)}</b></p>" if self.title else ""
        )
        if not self.items:
            return f"{title}<p style='color:#2e7d32;margin:0.2em 0'>{html.escape(self.none)}</p>"
        colour = LEVELS["info"] if self.level == "ok" else LEVELS[self.level]
        items = "".join(f"<li>{html.escape(item)}</li>" for item in self.items)
        return f"{title}<ul style='margin:0.2em 0;border-left:3px solid {colour};padding-left:1.6em'>{items}</ul>"


@dataclass(frozen=True)
class Log:
    """An event log shown as its last ``keep`` lines and a count of the earlier ones (folded, not dropped)."""

    lines: Sequence[str]
    title: str = "events"
    keep: int = 8

    def text(self) -> str:
        earlier = len(self.lines) - self.keep
        head = [
            f"{self.title}: {len(self.lines):,} lines" + (f", the last {self.keep}:" if earlier > 0 else ":")
        ]
        return "\n".join([*head, *(f"  {line}" for line in self.lines[-self.keep :])])

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return folded_log_html(list(self.lines), self.keep, self.title)


def folded_log_html(lines: list[str], keep: int, title: str = "log") -> str:
    """The last ``keep`` lines in a <pre>, the earlier ones in a closed <details> with their count."""
    esc = html.escape
    earlier = lines[:-keep] if len(lines) > keep else []
    shown = lines[-keep:] if keep else []
    folded = (
        f"<details class='dg-log-earlier'><summary>{len(earlier):,} earlier {title} lines of {len(lines):,} "
        f"(click to show)</summary><pre>{esc(chr(10).join(earlier))}</pre></details>"
        if earlier
        else ""
    )
    return f"<div class='dg-log'>{folded}<pre>{esc(chr(10).join(shown))}</pre></div>"


class Stack(tuple):
    """Several blocks shown one under the other (a cell shows only its last value; this is one value)."""

    def _repr_html_(self) -> str:
        return "".join(
            item._repr_html_() if hasattr(item, "_repr_html_") else f"<pre>{html.escape(str(item))}</pre>"
            for item in self
        )

    def __repr__(self) -> str:
        return "\n\n".join(str(item) for item in self)
