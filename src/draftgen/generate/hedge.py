"""Hedging the tail: at the end of a run, requests still running on a slow server are also sent to an idle one.

Pull-based dispatch keeps every server busy while prompts remain; once the queue is empty, fast servers go idle
while a slow server still holds a full batch, each request there needing several times as long. The run then
ends when the slow server's last request does. A server is *slow* when the median per-request rate of its
recent answers (completion tokens ÷ latency) is below ``slow_ratio`` times the fleet's (the median of the
servers' medians). With nothing left to send, each idle slot on a fast server takes one request from a slow
server — the most recently sent first (it has the most left to do) — and the first answer is stored; the
dispatcher cancels the other request (the server sees the connection close and aborts it).

This module only decides; the dispatcher sends, cancels and stores.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import deque
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftgen.generate.work import TurnState, Work

if TYPE_CHECKING:
    from draftgen.generate.fleet_health import Server

WINDOW = 200  # recent answers per server the rate is read from
MIN_SAMPLES = 10  # answers a server needs before its rate counts
POLL_S = 0.5  # how often the tail is checked for requests to hedge


@dataclass(frozen=True)
class HedgePolicy:
    slow_ratio: float  # hedge servers slower than this × the fleet's median per-request rate; 0: never
    min_samples: int = MIN_SAMPLES

    @property
    def enabled(self) -> bool:
        return self.slow_ratio > 0


class RateBook:
    """Recent per-request rates (completion tokens per second of latency), per server."""

    def __init__(self, window: int = WINDOW) -> None:
        self._rates: dict[str, deque[float]] = {}
        self._window = window

    def observe(self, server: str, completion_tokens: int | None, latency_s: float) -> None:
        if not completion_tokens or latency_s <= 0:
            return
        self._rates.setdefault(server, deque(maxlen=self._window)).append(completion_tokens / latency_s)

    def median(self, server: str, min_samples: int) -> float | None:
        rates = self._rates.get(server)
        if rates is None or len(rates) < min_samples:
            return None
        return statistics.median(rates)

    def slow_servers(self, servers: Sequence[str], policy: HedgePolicy) -> set[str]:
        """Servers whose median rate is below ``slow_ratio`` × the median of the servers' medians."""
        medians = {s: m for s in servers if (m := self.median(s, policy.min_samples)) is not None}
        if len(medians) < 2:
            return set()
        fleet = statistics.median(medians.values())
        return {s for s, m in medians.items() if m < policy.slow_ratio * fleet}


@dataclass(frozen=True)
class Running:
    """A request in flight, as the planner sees it."""

    key: Hashable  # the dispatcher's handle on it
    server: str
    started: float  # monotonic send time
    hedged: bool  # already has a copy running elsewhere


def plan_hedges(
    running: Sequence[Running], slow: set[str], idle_slots: Mapping[str, int]
) -> list[tuple[Hashable, str]]:
    """(request key, target server) pairs: requests on slow servers, newest first, onto idle slots of the other
    servers (the one with most free slots first). Never a second copy of one request, never onto a slow server."""
    candidates = sorted(
        (r for r in running if r.server in slow and not r.hedged), key=lambda r: r.started, reverse=True
    )
    free = {server: n for server, n in idle_slots.items() if n > 0 and server not in slow}
    plan: list[tuple[Hashable, str]] = []
    for request in candidates:
        if not free:
            break
        target = max(free, key=lambda s: free[s])
        plan.append((request.key, target))
        free[target] -= 1
        if free[target] == 0:
            del free[target]
    return plan


class TailHedger:
    """Which requests to copy now: only once nothing is left to send, from slow servers onto idle slots."""

    def __init__(self, policy: HedgePolicy, concurrency_per_server: int) -> None:
        self.policy = policy
        self.rates = RateBook()
        self.concurrency = concurrency_per_server

    def plan(self, servers: Sequence[Server]) -> list[tuple[Work, Server]]:
        up = [s for s in servers if s.up]
        slow = self.rates.slow_servers([s.url for s in up], self.policy)
        if not slow:
            return []
        flights = {
            (s.index, key): flight for s in up for key, flight in s.in_flight.items() if flight.running
        }
        running = [
            Running(key=key, server=f.server, started=f.started, hedged=f.work.state is TurnState.HEDGED)
            for key, f in flights.items()
            if f.turn == f.work.conversation.turn
        ]
        idle = {s.url: self.concurrency - len(s.in_flight) for s in up}
        by_url = {s.url: s for s in up}
        return [(flights[key].work, by_url[target]) for key, target in plan_hedges(running, slow, idle)]

    def describe(self, plan: Sequence[tuple[Work, Server]]) -> str:
        sources = sorted({work.last_server or "?" for work, _ in plan})
        return (
            f"hedged {len(plan)} request(s) still running on slow {', '.join(sources)} (median per-request rate "
            f"below {self.policy.slow_ratio:g} x the fleet's): copies sent to idle servers, the first answer is kept"
        )

    async def watch(
        self,
        servers: Sequence[Server],
        nothing_left: Callable[[], bool],
        send_copy: Callable[[Work, Server], Coroutine[Any, Any, None]],
        note: Callable[[str, str], None],
    ) -> None:
        """Every ``POLL_S``, once ``nothing_left()``, send the planned copies (``send_copy`` marks the turn hedged
        before it returns, so no turn is planned twice)."""
        async with asyncio.TaskGroup() as group:
            while True:
                await asyncio.sleep(POLL_S)
                if not nothing_left():
                    continue
                plan = self.plan(servers)
                for work, target in plan:
                    group.create_task(send_copy(work, target))
                if plan:
                    note("fleet", self.describe(plan))
