"""A prompt's life in dispatch, as explicit states: the work item (one conversation) and each request it sends.

A conversation is ``FRESH`` when the reader puts it in the queue (it holds one of the reader's slots until a
worker first takes it), ``QUEUED`` when it waits again (its next turn, a retry that came due, or handed back by a
benched server), ``SENT`` with one request in flight, ``HEDGED`` with two (a copy on an idle server at the tail),
``BACKING_OFF`` between a failure and its retry, and finally ``STORED``, ``FAILED`` or ``SET_ASIDE`` (a turn whose
prompt alone reached the trainer's max_length; earlier turns, if any, are stored).

Each request (``Flight``) is ``RUNNING`` until it returns, or ends early as ``EVICTED`` (its server was marked
down under it: not the prompt's fault, the attempt is not counted) or ``LOST`` (the other copy of its turn
answered first). Only the dispatcher changes these states; everything else reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import math
from collections import deque
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from draftgen.generate.length_cap import TurnLimit
from draftgen.generate.turns import Conversation
from draftgen.prompts.rows import PromptRow, RejectedRow

READER_YIELD_EVERY = 512


class TurnState(enum.Enum):
    FRESH = "fresh"
    QUEUED = "queued"
    SENT = "sent"
    HEDGED = "hedged"
    BACKING_OFF = "backing off"
    STORED = "stored"
    FAILED = "failed"
    SET_ASIDE = "set aside"  # its next turn could train nothing (draftgen.generate.length_cap): not sent


class FlightState(enum.Enum):
    RUNNING = "running"
    RETURNED = "returned"
    EVICTED = "evicted"
    LOST = "lost"


@dataclass(eq=False)
class Flight:
    """One request for one turn of ``work``, on one server."""

    work: Work
    turn: int  # the conversation's turn index when sent
    server: str
    started: float  # loop time
    hedge: bool = False  # the copy, not the original
    state: FlightState = FlightState.RUNNING
    scope: asyncio.Timeout | None = None  # its deadline; rescheduled to now to end the wait early

    @property
    def running(self) -> bool:
        return self.state is FlightState.RUNNING

    def end_early(self, state: FlightState, now: float) -> None:
        """Evict or lose this request: its wait ends now (the connection closes, so the server aborts it)."""
        if not self.running:
            return
        self.state = state
        # A scope already expiring (its deadline fired, the worker has not resumed yet) ends on its own.
        if self.scope is not None and not self.scope.expired():
            with contextlib.suppress(RuntimeError):
                self.scope.reschedule(now)


@dataclass(eq=False)
class Work:
    """A conversation in progress; ``attempts`` and ``presumed_hung`` count its current turn's tries."""

    conversation: Conversation
    state: TurnState = TurnState.FRESH
    attempts: int = 0
    presumed_hung: int = 0  # times a learned deadline cut this turn's request short
    limit: TurnLimit | None = (
        None  # this turn's prompt length and the max_tokens it is sent with (set once a turn)
    )
    last_server: str | None = None
    # The server holding this turn's prefix (the one that answered the previous turn): its home while it waits
    # (draftgen.generate.affinity); set when a turn is answered, cleared once the next is sent.
    prefer: str | None = None
    # Servers where a request of this conversation has streamed its first token: they have prefilled its prompt,
    # so their prefix cache holds it (a later sample of the prompt waits for that: draftgen.generate.affinity).
    prefilled_on: dict[str, float] = field(default_factory=dict)  # server → when (loop time)
    # Told when a request of this work returns: a later sample waiting for it to stream a token may now never get
    # one there (the queue then wakes a worker to take that sample).
    on_land: Callable[[], None] | None = None
    flights: set[Flight] = field(default_factory=set)  # requests not yet returned (stale ones included)

    def running(self) -> list[Flight]:
        """This turn's requests still in flight (two while hedged)."""
        return [f for f in self.flights if f.running and f.turn == self.conversation.turn]

    def launch(self, server: str, now: float, *, hedge: bool = False) -> Flight:
        flight = Flight(self, self.conversation.turn, server, now, hedge=hedge)
        self.flights.add(flight)
        self.state = TurnState.HEDGED if len(self.running()) > 1 else TurnState.SENT
        if not hedge:
            self.attempts += 1
            self.last_server = server
            self.prefer = None
        return flight

    def land(self, flight: Flight) -> None:
        """``flight`` came back (answer, error, eviction or loss); the turn's state follows what still runs."""
        self.flights.discard(flight)
        if flight.running:
            flight.state = FlightState.RETURNED
        if self.state is TurnState.HEDGED and len(self.running()) < 2:
            self.state = TurnState.SENT
        if self.on_land is not None:
            self.on_land()

    def answered(self, now: float) -> None:
        """This turn is answered: any other copy of it is cut short."""
        for other in self.running():
            other.end_early(FlightState.LOST, now)

    def next_turn(self) -> None:
        self.state = TurnState.QUEUED
        self.prefer = self.last_server  # its prompt holds the one just answered there
        self.attempts = 0
        self.presumed_hung = 0
        self.limit = None


@dataclass(frozen=True)
class Home:
    """Where work waits: ``url``'s lane; with ``after``, for ``after`` (a prompt's first sample) to stream its first
    token there (``after.prefilled_on``): a later sample sent with the first would be prefilled beside it, in the
    same step, and find nothing cached."""

    url: str
    after: Work | None = None

    def since(self, queued_at: float) -> float | None:
        """When the work became ready to go home: queued, or its first sample prefilled there; None while that
        sample still runs there unprefilled; ``-inf`` when it no longer runs there and never streamed (the
        prefix will not be there: the work is open to every server)."""
        if self.after is None:
            return queued_at
        prefilled = self.after.prefilled_on.get(self.url)
        if prefilled is not None:
            return max(queued_at, prefilled)
        if any(f.server == self.url and f.running for f in self.after.flights):
            return None
        return -math.inf


class Homes(Protocol):
    """Where work under way should wait (``draftgen.generate.affinity.PrefixAffinity``)."""

    hold_s: float

    def home(self, work: Work) -> Home | None: ...

    def taken(self, work: Work, url: str) -> None: ...

    def can_host(self, url: str) -> bool: ...


@dataclass(eq=False)
class Waiting:
    """Work in a server's lane."""

    queued_at: float
    work: Work
    home: Home


class WorkQueue:
    """The shared queue. What a free worker of server S takes next (``get(S)``):

    1. S's own lane: work whose home is S (a next turn or a later sample whose prefix S holds:
       ``draftgen.generate.affinity``), oldest first; a later sample once its first has streamed a token on S;
    2. work under way with no home (a retry, a request handed back by a benched server), then the oldest work in
       another server's lane that has been ready to go there for ``hold_s``, or whose home can no longer take it;
    3. fresh prompts, in file order;
    4. whatever still waits in another server's lane, rather than nothing.

    Work under way goes before fresh prompts, so conversations finish soon after they start and few are part-way at
    once; lane work waits only while its server has no free worker, for ``hold_s`` at most once ready, before (2)
    opens it to every server. A worker that finds nothing waits. Work put in a lane wakes a waiting worker of its
    home; any other work, or lane work whose home has none waiting, wakes the worker that has waited longest (for
    lane work a moment later: the home's own worker, just finishing the request that made this work, takes it
    first)."""

    def __init__(self, homes: Homes | None = None) -> None:
        self._homes = homes
        self._under_way: deque[Work] = deque()
        self._fresh: deque[Work] = deque()
        self._lanes: dict[str, list[Waiting]] = {}  # home → its work, oldest first
        self._waiters: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._order = itertools.count()

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def qsize(self) -> int:
        return len(self._under_way) + len(self._fresh) + sum(len(lane) for lane in self._lanes.values())

    def empty(self) -> bool:
        return self.qsize() == 0

    def put_nowait(self, work: Work) -> None:
        home = self._homes.home(work) if self._homes is not None else None
        if home is None:
            (self._fresh if work.state is TurnState.FRESH else self._under_way).append(work)
            self._wake_longest_waiting()
            return
        self._wait_in_lane(home, Waiting(self._now(), work, home))
        if not (home.after is None and self._wake(home.url)):
            asyncio.get_running_loop().call_soon(self._wake_longest_waiting)

    def _wait_in_lane(self, home: Home, waiting: Waiting) -> None:
        self._lanes.setdefault(home.url, []).append(waiting)
        if home.after is not None and home.after.on_land is None:
            home.after.on_land = lambda: self._gate_moved(home.url)

    def _gate_moved(self, url: str) -> None:
        """A first sample's request returned: work waiting in ``url``'s lane for it may be free to go (its first
        token came, or never will there). A worker of ``url`` takes it; else the one that has waited longest."""
        if not self._wake(url):
            self._wake_longest_waiting()

    def first_token_hook(self, work: Work, server: str) -> Callable[[], None] | None:
        """What a request of ``work`` on ``server`` calls when its first token streams: ``server`` has its prompt
        now, and a later sample waiting for that in its lane is free to go (None: no affinity, nothing waits)."""
        if self._homes is None:
            return None

        def prefilled() -> None:
            work.prefilled_on.setdefault(server, self._now())
            if any(w.home.after is work for w in self._lanes.get(server, ())):
                self._wake(server)

        return prefilled

    async def get(self, server: str) -> Work:
        """The next work for a free worker of ``server``, waiting until there is some."""
        while True:
            work = self._take(server)
            if work is not None:
                return work
            if self._lanes.get(server):
                # only its own work is waiting, for a first token: another server's worker may take it
                self._wake_longest_waiting(besides=server)
            entry = (next(self._order), asyncio.get_running_loop().create_future())
            waiting = self._waiters.setdefault(server, deque())
            waiting.append(entry)
            try:
                await entry[1]
            except asyncio.CancelledError:
                if entry in waiting:
                    waiting.remove(entry)
                elif entry[1].done() and not entry[1].cancelled():
                    self._wake_longest_waiting()  # woken, then cancelled: the wake goes to another worker
                raise

    # ----- which work ------------------------------------------------------------------------------------------
    def _take(self, server: str) -> Work | None:
        own = self._lanes.get(server) or []
        ready = next((w for w in own if w.home.since(w.queued_at) is not None), None)
        if ready is not None:
            return self._taken(ready, server)
        if self._under_way:
            return self._taken(self._under_way.popleft(), server)
        opened = self._other(server, opened_only=True)
        if opened is not None:
            return self._taken(opened, server)
        if self._fresh:
            return self._taken(self._fresh.popleft(), server)
        other = self._other(server, opened_only=False)
        return self._taken(other, server) if other is not None else None

    def _other(self, server: str, *, opened_only: bool) -> Waiting | None:
        """The oldest work in another server's lane: among that open to all (ready to go home for ``hold_s``, or
        its home cannot take it), or among all."""
        now = self._now()
        candidates = (
            w
            for home, lane in self._lanes.items()
            if home != server
            for w in lane
            if not opened_only or self._opened(w, now)
        )
        return min(candidates, key=lambda w: w.queued_at, default=None)

    def _opened(self, waiting: Waiting, now: float) -> bool:
        assert self._homes is not None
        if not self._homes.can_host(waiting.home.url):
            return True
        since = waiting.home.since(waiting.queued_at)
        return since is not None and now - since >= self._homes.hold_s

    def _taken(self, item: Work | Waiting, server: str) -> Work:
        """``item`` goes to ``server``; a first sample's next samples, next in the fresh lane, get it as their home."""
        if isinstance(item, Waiting):
            self._lanes[item.home.url].remove(item)
        work = item.work if isinstance(item, Waiting) else item
        if self._homes is None:
            return work
        self._homes.taken(work, server)
        if work.state is TurnState.FRESH:
            now = self._now()
            while self._fresh and (home := self._homes.home(self._fresh[0])) is not None:
                self._wait_in_lane(home, Waiting(now, self._fresh.popleft(), home))
        return work

    # ----- waking a waiting worker ---------------------------------------------------------------------------
    def _wake(self, server: str) -> bool:
        waiting = self._waiters.get(server)
        while waiting:
            _, waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return True
        return False

    def _wake_longest_waiting(self, besides: str | None = None) -> None:
        while True:
            heads = [(w[0][0], server) for server, w in self._waiters.items() if w and server != besides]
            if not heads:
                return
            if self._wake(min(heads)[1]):
                return


class Intake:
    """Prompts into the queue, a bounded number waiting at a time, and the moment every one taken has ended."""

    def __init__(self, queue: WorkQueue, *, turns: str, window: int, skip: Container[str]) -> None:
        self.queue = queue
        self.turns = turns
        self.skip = skip  # ids already stored
        self.reader_done = False
        self.all_done = asyncio.Event()
        self._slots = asyncio.Semaphore(window)
        self._outstanding = 0  # taken from the reader, not yet stored or failed

    async def read(self, prompts: Iterator[PromptRow | RejectedRow]) -> None:
        for count, row in enumerate(prompts):
            if count % READER_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # keep the loop responsive while skipping stored ids
            if isinstance(row, RejectedRow) or row.id in self.skip:
                continue
            await self._slots.acquire()
            self._outstanding += 1
            self.queue.put_nowait(Work(Conversation(row, self.turns)))
        self.reader_done = True
        self._check()

    def taken(self, work: Work) -> None:
        """A worker took ``work`` from the queue: a fresh prompt frees its reader slot."""
        if work.state is TurnState.FRESH:
            self._slots.release()
            work.state = TurnState.QUEUED

    def ended(self) -> None:
        """A conversation was stored or failed for good."""
        self._outstanding -= 1
        self._check()

    def _check(self) -> None:
        if self.reader_done and self._outstanding == 0:
            self.all_done.set()
