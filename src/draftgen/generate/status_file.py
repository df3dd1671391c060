"""Writes ``progress.json`` and ``progress-history.jsonl`` while a generate session runs (format:
``draftgen.watch.progress_file``).

The dispatcher's ticker hands a ``FleetSnapshot`` to ``StatusWriter.update`` every refresh; the writer keeps the
samples of the last ``RATE_WINDOW_S`` seconds, and every ``interval_s`` writes the file (rates and ETA over
that window) and appends one history line. ``finish`` records how the session ended. A write that fails (disk
full, permissions) never stops the run: it is reported once through ``note`` and retried next interval.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.display.humanize import short_label
from draftgen.watch.progress_file import (
    DETAIL_LIMIT,
    FORMAT,
    STATES,
    append_history,
    process_start_ticks,
    stale_after_s,
    write_progress,
)

RATE_WINDOW_S = 300.0  # rates and ETA are measured over the last five minutes (less early in a session)
EVENTS_SHOWN = 20


@dataclass(frozen=True)
class ServerSnapshot:
    """One server's counters since the session started."""

    url: str
    up: bool
    in_flight: int
    completed: int
    completion_tokens: int
    accept_sum: float  # sum of spec_accept_length over the requests that reported it
    accept_n: int
    errors: int
    downs: int
    cached_tokens: int = 0  # prompt tokens its prefix cache held, over the answers that said
    cache_prompt_tokens: int = 0  # those answers' prompt tokens


@dataclass(frozen=True)
class FleetSnapshot:
    """What the dispatcher knows now (counters since the session started)."""

    completed: int
    failed: int
    completion_tokens: int
    retrying: int
    servers: tuple[ServerSnapshot, ...]
    guard_rates: Mapping[str, float] = field(default_factory=dict)
    guard_totals: Mapping[str, int] = field(default_factory=dict)
    guard_seen: int = 0
    events: tuple[tuple[float, str, str], ...] = ()  # (time, server, what), the most recent last
    turns_completed: int | None = None  # multi-turn runs: assistant turns finished this session
    trained_tokens: int | None = None  # completion tokens the trainer keeps (each turn's up to max_length)
    # Per turn index of the conversations stored this session: (prompt tokens, cached tokens) of the turns whose
    # server said (draftgen.generate.cache_share); empty when none did.
    cache_by_turn: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class _Sample:
    t: float
    completed: int
    tokens: int
    servers: dict[str, tuple[int, float, int]]  # url → (completion tokens, accept sum, accept n)


class StatusWriter:
    """Owns progress.json and progress-history.jsonl for one session of one run folder."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        interval_s: float,
        total: int,
        done_at_start: int,
        max_rates: Mapping[str, float] | None = None,
        turns_total: int | None = None,
        turns_done_at_start: int | None = None,
        note: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        servers_clock: Mapping[str, Any] | None = None,
    ):
        self.servers_clock = dict(servers_clock or {})  # HardwareClock.as_dict(): readers state rates on it
        self.out_dir = Path(out_dir)
        self.interval_s = interval_s
        self.total = total
        self.done_at_start = done_at_start
        self.max_rates = dict(max_rates or {})
        self.turns_total = turns_total
        self.turns_done_at_start = turns_done_at_start
        self._note = note
        self._clock = clock
        self.started_at = clock()
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self._pid_start = process_start_ticks(self.pid)
        self._samples: deque[_Sample] = deque()
        self._last_write: float | None = None
        self._last: FleetSnapshot | None = None
        self.last_error: str | None = None
        self.writes = 0

    # ----- called by the dispatcher ---------------------------------------------------------------------
    def update(self, snapshot: FleetSnapshot, *, force: bool = False) -> bool:
        """Remember ``snapshot``; write the files if ``interval_s`` has passed (or ``force``). True if written."""
        now = self._clock()
        self._last = snapshot
        self._sample(now, snapshot)
        if not force and self._last_write is not None and now - self._last_write < self.interval_s:
            return False
        return self._write(now, snapshot, "running", "")

    def finish(self, state: str, detail: str = "") -> bool:
        """The session ended: write the last counters with ``state`` (finished, interrupted, halted, failed)."""
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        snapshot = self._last or FleetSnapshot(0, 0, 0, 0, ())
        now = self._clock()
        self._sample(now, snapshot)
        return self._write(now, snapshot, state, detail)

    # ----- the document ---------------------------------------------------------------------------------
    def _sample(self, now: float, snapshot: FleetSnapshot) -> None:
        servers = {s.url: (s.completion_tokens, s.accept_sum, s.accept_n) for s in snapshot.servers}
        samples = self._samples
        samples.append(_Sample(now, snapshot.completed, snapshot.completion_tokens, servers))
        while len(samples) > 2 and now - samples[1].t >= RATE_WINDOW_S:
            samples.popleft()

    def _write(self, now: float, snapshot: FleetSnapshot, state: str, detail: str) -> bool:
        try:
            write_progress(self.out_dir, self.document(now, snapshot, state, detail))
            append_history(self.out_dir, self.history_line(now, snapshot))
        except OSError as exc:
            first = self.last_error is None
            self.last_error = f"{type(exc).__name__}: {exc}"
            if first and self._note is not None:
                self._note(f"progress.json could not be written ({self.last_error}); the run goes on")
            return False
        self._last_write = now
        self.writes += 1
        return True

    def document(self, now: float, snapshot: FleetSnapshot, state: str, detail: str) -> dict[str, Any]:
        first = self._samples[0]
        span = now - first.t
        conversations_per_s = (snapshot.completed - first.completed) / span if span > 0 else None
        tok_s = (snapshot.completion_tokens - first.tokens) / span if span > 0 else None
        done = self.done_at_start + snapshot.completed
        remaining = max(0, self.total - done - snapshot.failed)
        if remaining == 0:
            eta_s: float | None = 0.0
        elif conversations_per_s:
            eta_s = remaining / conversations_per_s
        else:
            eta_s = None
        servers = []
        for server in snapshot.servers:
            then = first.servers.get(server.url, (0, 0.0, 0))
            window_n = server.accept_n - then[2]
            servers.append(
                {
                    "url": server.url,
                    "label": short_label(server.url),
                    "up": server.up,
                    "in_flight": server.in_flight,
                    "completed": server.completed,
                    "completion_tokens": server.completion_tokens,
                    "errors": server.errors,
                    "downs": server.downs,
                    "tok_s": (server.completion_tokens - then[0]) / span if span > 0 else None,
                    "mean_accept": server.accept_sum / server.accept_n if server.accept_n else None,
                    "mean_accept_window": (server.accept_sum - then[1]) / window_n if window_n else None,
                    "cached_tokens": server.cached_tokens,
                    "cache_prompt_tokens": server.cache_prompt_tokens,
                }
            )
        document: dict[str, Any] = {
            "format": FORMAT,
            "state": state,
            "detail": detail[:DETAIL_LIMIT],
            "out_dir": str(self.out_dir),
            "host": self.host,
            "pid": self.pid,
            "pid_start": self._pid_start,
            "session_started_at": self.started_at,
            "heartbeat_at": now,
            "interval_s": self.interval_s,
            "stale_after_s": stale_after_s(self.interval_s),
            "conversations": {
                "total": self.total,
                "done": done,
                "done_at_start": self.done_at_start,
                "session_done": snapshot.completed,
                "failed": snapshot.failed,
            },
            "completion_tokens": snapshot.completion_tokens,
            "trained_tokens": snapshot.trained_tokens,
            "clock": self.servers_clock,
            "rate": {"window_s": span, "conversations_per_s": conversations_per_s, "tok_s": tok_s},
            "eta_s": eta_s,
            "eta_at": now + eta_s if eta_s is not None else None,
            "retrying": snapshot.retrying,
            "servers": servers,
            "guard": {
                "seen": snapshot.guard_seen,
                "window_rates": dict(snapshot.guard_rates),
                "max_rates": self.max_rates,
                "totals": dict(snapshot.guard_totals),
            },
            "events": [
                {"at": at, "server": short_label(server), "what": what}
                for at, server, what in snapshot.events[-EVENTS_SHOWN:]
            ],
        }
        if snapshot.cache_by_turn:  # [prompt tokens, cached tokens] per turn index (stored conversations)
            document["cache_by_turn"] = [list(pair) for pair in snapshot.cache_by_turn]
        if snapshot.turns_completed is not None:  # multi-turn: one request per assistant turn
            document["turns"] = {
                "session_done": snapshot.turns_completed,
                "done": None
                if self.turns_done_at_start is None
                else self.turns_done_at_start + snapshot.turns_completed,
                "total": self.turns_total,
            }
        if state != "running":
            document["ended_at"] = now
        return document

    def history_line(self, now: float, snapshot: FleetSnapshot) -> dict[str, Any]:
        """Cumulative session counters; per server [completed, tokens, accept sum, accept n, in flight, up]."""
        return {
            "t": round(now, 3),
            "session": round(self.started_at, 3),
            "done": self.done_at_start + snapshot.completed,
            "failed": snapshot.failed,
            "tokens": snapshot.completion_tokens,
            "servers": {
                s.url: [
                    s.completed,
                    s.completion_tokens,
                    round(s.accept_sum, 3),
                    s.accept_n,
                    s.in_flight,
                    int(s.up),
                ]
                for s in snapshot.servers
            },
        }
