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
from collections import deque
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

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
        return flight

    def land(self, flight: Flight) -> None:
        """``flight`` came back (answer, error, eviction or loss); the turn's state follows what still runs."""
        self.flights.discard(flight)
        if flight.running:
            flight.state = FlightState.RETURNED
        if self.state is TurnState.HEDGED and len(self.running()) < 2:
            self.state = TurnState.SENT

    def answered(self, now: float) -> None:
        """This turn is answered: any other copy of it is cut short."""
        for other in self.running():
            other.end_early(FlightState.LOST, now)

    def next_turn(self) -> None:
        self.state = TurnState.QUEUED
        self.attempts = 0
        self.presumed_hung = 0
        self.limit = None


class WorkQueue(asyncio.Queue):  # type: ignore[type-arg]
    """The shared queue, in two lanes: work already under way (a conversation's next turn, a retry, a request
    handed back by a benched server) goes before fresh prompts, so conversations finish soon after they start
    and few are part-way at once. Each lane is FIFO. Uses asyncio.Queue's subclass hooks, as PriorityQueue does."""

    def _init(self, maxsize: int) -> None:
        self._under_way: deque[Work] = deque()
        self._fresh: deque[Work] = deque()

    def _put(self, work: Work) -> None:
        (self._fresh if work.state is TurnState.FRESH else self._under_way).append(work)

    def _get(self) -> Work:
        return self._under_way.popleft() if self._under_way else self._fresh.popleft()

    def qsize(self) -> int:
        return len(self._under_way) + len(self._fresh)

    def empty(self) -> bool:
        return not self._under_way and not self._fresh


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
