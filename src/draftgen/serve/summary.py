"""The end of serve's start, as grouped checks: "ready: 7/7 servers", and a row for each server that was not, with
why and where its log is.

By the time every server is ready or failed, the event lines above have told each server's story stage by stage;
a reader wants the outcome in a few lines. Servers that did the same are one row (``display.checks``); a server
that failed, or needed restarts to come up, keeps a row of its own, named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftgen.display.checks import CheckRow, checks_text
from draftgen.display.humanize import seconds_range

READY = "ready"
RESTARTS = "restarts"


@dataclass(frozen=True)
class ServerStart:
    """How one server's start ended: ready (and how long its last attempt took) or failed, and why."""

    url: str
    ready: bool
    ready_s: float | None  # its last attempt's start → /health_generate 200 (None: not ready)
    restarts: int
    failure: str  # the last attempt's failure ("exited with code 1 after 3.1s (...)"), "" if none failed
    log_path: Path


def startup_checks(starts: Sequence[ServerStart]) -> list[CheckRow]:
    """A ``ready`` row per server (the ready ones share one detail, so they group), and ``restarts`` rows when any
    server was restarted on the way."""
    times = [s.ready_s for s in starts if s.ready and s.ready_s is not None]
    ready_detail = "/health_generate answered 200" + (
        f", {seconds_range(times)} after start" if times else ""
    )
    rows = [
        CheckRow(READY, s.url, "ok", ready_detail)
        if s.ready
        else CheckRow(READY, s.url, "fail", f"{s.failure or 'not ready'}; log {s.log_path}")
        for s in starts
    ]
    if any(s.restarts for s in starts):
        rows += [
            CheckRow(RESTARTS, s.url, "ok", "none")
            if not s.restarts
            else CheckRow(
                RESTARTS,
                s.url,
                "warn",
                f"{s.restarts} restart{'s' if s.restarts != 1 else ''}; the last failure: {s.failure}",
            )
            for s in starts
        ]
    return rows


def startup_text(starts: Sequence[ServerStart]) -> str:
    """The grouped rows as indented text lines, for serve's event stream."""
    return checks_text(startup_checks(starts), "servers")
