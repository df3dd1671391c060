"""What ``draftgen serve`` shows while it supervises: event lines, plus a live status table on a terminal.

Both views print the same event lines (stage changes, exits with their log tail, restarts); on a terminal the
table below them is redrawn in place every poll. In a pipe or a log file only the event lines appear.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import TextIO

from draftgen.serve.stages import Stage


@dataclass(frozen=True)
class StatusRow:
    """A snapshot of one supervised process, for display."""

    name: str
    port: int
    gpus: tuple[int, ...]
    stage: Stage
    detail: str
    in_stage_s: float
    up_s: float | None  # since this attempt started; None while not running
    restarts: int
    pid: int | None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


_HEADER = ("port", "GPUs", "stage", "for", "up", "restarts", "pid", "meaning")


def render_table(rows: list[StatusRow]) -> list[str]:
    """The status table as text lines (pure: the caller decides where they go)."""
    cells = [_HEADER]
    for row in rows:
        stage = row.stage.value + (f" ({row.detail})" if row.detail else "")
        cells.append(
            (
                str(row.port),
                ",".join(map(str, row.gpus)) or "router",
                stage,
                _duration(row.in_stage_s),
                _duration(row.up_s),
                str(row.restarts),
                str(row.pid) if row.pid else "-",
                row.stage.meaning,
            )
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(_HEADER))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]


class LineView:
    """Plain event lines: for pipes, log files and tests."""

    def __init__(self, stream: TextIO = sys.stdout):
        self.stream = stream

    def event(self, text: str) -> None:
        with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) must not stop the shutdown
            print(text, file=self.stream, flush=True)

    def refresh(self, rows: list[StatusRow]) -> None:
        pass

    def close(self, rows: list[StatusRow]) -> None:
        pass


class TableView(LineView):
    """Event lines scroll above a status table that is redrawn in place (ANSI cursor movement)."""

    def __init__(self, stream: TextIO = sys.stdout):
        super().__init__(stream)
        self._drawn = 0

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    def event(self, text: str) -> None:
        with contextlib.suppress(OSError):
            self._erase()
        super().event(text)

    def refresh(self, rows: list[StatusRow]) -> None:
        lines = render_table(rows)
        with contextlib.suppress(OSError):
            self._erase()
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
            self._drawn = len(lines)

    def close(self, rows: list[StatusRow]) -> None:
        self.refresh(rows)
        self._drawn = 0
