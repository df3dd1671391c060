"""Live progress of a generation run: done/total, aggregate tok/s, in flight per server, ETA (tqdm.auto)."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftgen.display.progressbar import bar_stream, tqdm

RATE_WINDOW_S = 30.0


@dataclass(frozen=True)
class ServerView:
    """One server as the progress bar shows it."""

    label: str
    in_flight: int
    up: bool


class Progress:
    """A tqdm bar in a notebook (widget when ipywidgets is installed, text otherwise) or a terminal."""

    def __init__(self, total: int, *, description: str = "generate", enabled: bool = True, file: Any = None):
        self.total = total
        self.done = 0  # conversations (prompts) finished
        self.turns = 0  # turn requests answered (more than done when conversations have several answers)
        self.tokens = 0
        self.failed = 0
        self._samples: deque[tuple[float, int]] = deque()
        self._bar = tqdm(
            total=total,
            desc=description,
            unit="prompt",
            dynamic_ncols=True,
            smoothing=0.05,
            disable=not enabled,
            file=file if file is not None else bar_stream(),
            mininterval=0.5,
        )

    def advance(self, completion_tokens: int, *, conversation_done: bool = True) -> None:
        """One answered turn; ``conversation_done`` when it was its conversation's last."""
        self.turns += 1
        self.done += conversation_done
        self.tokens += completion_tokens

    def fail(self) -> None:
        self.failed += 1

    def skip(self) -> None:
        """A conversation ended without a request (set aside at the trainer's max_length)."""
        self.done += 1

    def tok_per_s(self, now: float | None = None) -> float:
        """Completion tokens per second over the last ``RATE_WINDOW_S`` seconds of refreshes."""
        now = time.monotonic() if now is None else now
        samples = self._samples
        samples.append((now, self.tokens))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_S:
            samples.popleft()
        first_t, first_tokens = samples[0]
        span = now - first_t
        return (self.tokens - first_tokens) / span if span > 0 else 0.0

    def refresh(self, servers: Sequence[ServerView], *, retrying: int = 0) -> None:
        """Redraw: called by the dispatcher's ticker, not once per request."""
        rate = self.tok_per_s()
        flights = " ".join(f"{s.in_flight}" if s.up else f"{s.in_flight}↓" for s in servers)
        parts = [f"{rate:,.0f} tok/s", f"in flight [{flights}]"]
        if self.turns != self.done:
            parts.append(f"turns {self.turns:,}")
        down = sum(1 for s in servers if not s.up)
        if down:
            parts.append(f"{down} down")
        if self.failed:
            parts.append(f"failed {self.failed}")
        if retrying:
            parts.append(f"retrying {retrying}")
        self._bar.set_postfix_str(" | ".join(parts), refresh=False)
        self._bar.update((self.done + self.failed) - self._bar.n)

    def note(self, message: str) -> None:
        """A line above the bar (server down/up, guard)."""
        self._bar.write(message, file=getattr(self._bar, "fp", sys.stderr))

    def close(self) -> None:
        self._bar.update((self.done + self.failed) - self._bar.n)
        self._bar.close()
