"""Pull-based dispatch: every server keeps ``concurrency_per_server`` requests in flight from one shared queue.

A reader streams prompts into a bounded queue; each server runs ``concurrency_per_server`` workers that pull
the next prompt when their previous request ends, so a slow server simply takes less work and nothing waits
behind it. Failures are retried (exponential backoff with full jitter, Retry-After honoured) on whichever server
pulls them next. A request that outlives its server's learned deadline (``deadline``) is presumed hung and
retried. A server with ``server_down_after`` consecutive connection/5xx/timeout failures, or silent for
``server_silence_s`` with requests in flight and failing /health_generate (a wedged scheduler), is marked down:
its in-flight requests are handed back to the queue, it is probed with /health_generate (backoff) and rejoins
when healthy. While every server is down the queue simply waits: no attempts are spent. A prompt whose last
attempt fails goes to failed.parquet with its error; nothing is dropped.

The queue holds conversations (``turns``): a prompt with k answer points is k requests in order, one at a time.
When a turn's answer arrives the conversation goes back to the queue for its next turn, which any server may
take; retries, deadlines and benching apply to each turn's request, and the row is stored after the last turn.

Once nothing is left to send, requests still running on a slow server are also sent to idle ones (``hedge``):
the first answer to a turn is kept, the other request is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from draftgen.client import introspect
from draftgen.client.errors import RequestError
from draftgen.client.records import Capabilities, ChatResult
from draftgen.client.server import ServerClient
from draftgen.generate.config import GenerateConfig
from draftgen.generate.deadline import HangPolicy, ServerDeadline
from draftgen.generate.guard import Guard, GuardTripped
from draftgen.generate.hedge import HedgePolicy, RateBook, Running, plan_hedges
from draftgen.generate.progress import Progress, ServerView, short_label
from draftgen.generate.retry import RetryPolicy, counts_against_server
from draftgen.generate.status_file import FleetSnapshot, ServerSnapshot, StatusWriter
from draftgen.generate.store import RunStore
from draftgen.generate.turns import Conversation
from draftgen.prompts.rows import PromptRow, RejectedRow

MAIN_POLL_S = 0.2
SILENCE_POLL_S = 5.0  # how often the silence watch looks (at most; a quarter of server_silence_s if shorter)
SILENCE_HEALTH_TIMEOUT_S = 30.0  # SGLang's /health_generate itself gives up after 20 s
READER_YIELD_EVERY = 512
HEDGE_POLL_S = 0.5  # how often the tail is checked for requests to hedge
EVENT_LOG_LIMIT = 1000
RECENT_EVENTS = 20  # the last events, for progress.json


@dataclass(frozen=True)
class ServerPlan:
    """A server as preflight found it: its URL and what it accepts."""

    url: str
    capabilities: Capabilities


class AllServersDown(RuntimeError):
    pass


@dataclass
class ServerStats:
    url: str
    completed: int = 0
    completion_tokens: int = 0
    errors: int = 0
    downs: int = 0
    down_s: float = 0.0
    accept_sum: float = 0.0  # spec_accept_length summed over the requests that reported it
    accept_n: int = 0
    hedges: int = 0  # copies of another server's running requests sent here
    hedge_wins: int = 0  # of those, answered here first (the answer kept is this server's)


@dataclass
class DispatchOutcome:
    status: str  # "complete", "interrupted", "halted"
    completed: int  # conversations (rows) stored
    failed: int
    started_at: float
    ended_at: float
    servers: list[ServerStats]
    events: list[tuple[float, str, str]]  # (time, server, what happened)
    error: BaseException | None = None
    in_flight_at_stop: int = 0
    turns: int = 0  # turn requests answered (a conversation of k answers is k turns)
    hedged: int = 0  # requests copied to an idle server at the tail
    hedge_wins: int = 0  # turns whose kept answer came from the copy

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at


@dataclass
class _Item:
    """A conversation in progress; attempts and hang count are its current turn's."""

    conversation: Conversation
    attempts: int = 0
    holds_slot: bool = True  # holds a reader slot until a worker takes it the first time
    last_server: str | None = None
    presumed_hung: int = 0  # times a learned deadline cut this turn's request short
    answered: int = 0  # turns answered so far: a request sent for an earlier turn lost its race
    racing: set[_Flight] = field(default_factory=set)  # this turn's requests in flight (two while hedged)
    hedged: bool = False  # this turn has a copy on another server

    @property
    def copy_running(self) -> bool:
        """Another request for this same turn is still in flight (a hedge, or the original of one)."""
        return any(f.turn == self.answered for f in self.racing)


class _WorkQueue(asyncio.Queue):  # type: ignore[type-arg]
    """The shared queue, in two lanes: work already under way (a conversation's next turn, a retry, a request
    handed back by a benched server) goes before fresh prompts, so conversations finish soon after they start
    and few are part-way at once. Each lane is FIFO. Uses asyncio.Queue's subclass hooks, as PriorityQueue does."""

    def _init(self, maxsize: int) -> None:
        self._queue: deque[_Item] = deque()  # under way
        self._fresh: deque[_Item] = deque()  # from the reader, not taken yet

    def _put(self, item: _Item) -> None:
        (self._fresh if item.holds_slot else self._queue).append(item)

    def _get(self) -> _Item:
        return self._queue.popleft() if self._queue else self._fresh.popleft()

    def qsize(self) -> int:
        return len(self._queue) + len(self._fresh)

    def empty(self) -> bool:
        return not self._queue and not self._fresh


@dataclass(eq=False)
class _Flight:
    item: _Item
    turn: int  # item.answered when sent: the turn it answers
    scope: asyncio.Timeout | None = None
    evicted: bool = False
    lost: bool = False  # cut short because the other copy of its turn answered first
    hedge: bool = False  # the copy, not the original
    started: float = field(default_factory=time.monotonic)

    @property
    def stale(self) -> bool:
        """Its turn was answered already (by the other copy)."""
        return self.turn != self.item.answered


def _cut_short(flight: _Flight, now: float) -> None:
    """End a request's wait now (its timeout fires; the connection is closed, so the server aborts it)."""
    # A scope already expiring (its deadline fired, the worker has not resumed yet) ends on its own.
    if flight.scope is not None and not flight.scope.expired():
        with contextlib.suppress(RuntimeError):
            flight.scope.reschedule(now)


@dataclass
class _Server:
    index: int
    url: str
    client: ServerClient
    stats: ServerStats
    deadline: ServerDeadline
    up: bool = True
    up_event: asyncio.Event = field(default_factory=asyncio.Event)
    down_event: asyncio.Event = field(default_factory=asyncio.Event)
    consecutive_failures: int = 0
    down_since: float | None = None
    in_flight: dict[int, _Flight] = field(default_factory=dict)
    # Last reply of any kind, or the send that ended an idle spell: the silence watch measures from here.
    last_answer: float = field(default_factory=time.monotonic)


class Dispatcher:
    """Runs one session of a generation run. ``run`` returns a DispatchOutcome; it never raises for failures
    of individual requests (they are retried or recorded) — only for bugs."""

    def __init__(
        self,
        config: GenerateConfig,
        servers: list[ServerPlan],
        store: RunStore,
        guard: Guard,
        progress: Progress | None = None,
        *,
        api_key: str = "EMPTY",
        rng: random.Random | None = None,
        status: StatusWriter | None = None,
    ):
        self.config = config
        self.store = store
        self.guard = guard
        self.progress = progress
        self.status = status
        self.policy = RetryPolicy(config.max_attempts, config.backoff_base_s, config.backoff_max_s)
        self.sampling = config.sampling
        self.rng = rng or random.Random()
        self._plans = servers
        self._api_key = api_key
        self.servers: list[_Server] = []
        self.events: list[tuple[float, str, str]] = []
        self.recent_events: deque[tuple[float, str, str]] = deque(maxlen=RECENT_EVENTS)
        self.halt: BaseException | None = None
        self.completed = 0  # conversations stored
        self.turns = 0  # turn requests answered (== completed with turns: last)
        self.failed = 0
        self._outstanding = 0  # taken from the reader, not yet stored or failed
        self._reader_done = False
        self._all_done: asyncio.Event | None = None
        self._queue: asyncio.Queue[_Item] | None = None
        self._slots: asyncio.Semaphore | None = None
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._all_down_since: float | None = None
        self.hedge_policy = HedgePolicy(config.hedge_slow_ratio)
        self.rates = RateBook()
        self.hedged = 0
        self.hedge_wins = 0
        self._hedge_keys = itertools.count(-1, -1)  # in_flight keys of hedge copies (slots are >= 0)

    # ----- public -----------------------------------------------------------------------------------------
    async def run(self, prompts: Iterator[PromptRow | RejectedRow], stop: asyncio.Event) -> DispatchOutcome:
        config = self.config
        started = time.time()
        self._queue = _WorkQueue()
        total_slots = config.concurrency_per_server * len(self._plans)
        self._slots = asyncio.Semaphore(max(64, 2 * total_slots))
        self._all_done = asyncio.Event()
        hang_policy = HangPolicy(
            request_timeout_s=config.request_timeout_s,
            max_tokens=config.max_tokens,
            factor=config.hang_factor,
            min_s=config.hang_min_s,
        )
        for index, plan in enumerate(self._plans):
            client = ServerClient(
                plan.url,
                api_key=self._api_key,
                timeout_s=config.request_timeout_s + 30.0,
                capabilities=plan.capabilities,
            )
            server = _Server(index, client.url, client, ServerStats(client.url), ServerDeadline(hang_policy))
            server.up_event.set()
            self.servers.append(server)
        status = "interrupted"
        in_flight = 0
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._reader(prompts))]
                for server in self.servers:
                    tasks.append(group.create_task(self._prober(server)))
                    if config.server_silence_s > 0:
                        tasks.append(group.create_task(self._silence_watch(server)))
                    for slot in range(config.concurrency_per_server):
                        tasks.append(group.create_task(self._worker(server, slot)))
                if self.progress is not None or self.status is not None:
                    tasks.append(group.create_task(self._ticker()))
                if self.hedge_policy.enabled and len(self.servers) > 1:
                    tasks.append(group.create_task(self._hedger()))
                status = await self._wait_for_end(stop)
                in_flight = sum(len(s.in_flight) for s in self.servers)
                for task in tasks:
                    task.cancel()
        except BaseExceptionGroup as group_error:  # a bug in a worker: surface the first one, unwrapped
            errors = group_error.exceptions
            raise errors[0] if len(errors) == 1 else group_error from None
        finally:
            for handle in self._timers.values():
                handle.cancel()
            self._timers.clear()
            now = time.time()
            for server in self.servers:
                if server.down_since is not None:
                    server.stats.down_s += now - server.down_since
                await server.client.close()
            if self.progress is not None:
                self._refresh()
            if self.status is not None:
                self.status.update(self.snapshot(), force=True)
        return DispatchOutcome(
            status=status,
            completed=self.completed,
            turns=self.turns,
            failed=self.failed,
            started_at=started,
            ended_at=time.time(),
            servers=[s.stats for s in self.servers],
            events=self.events,
            error=self.halt,
            in_flight_at_stop=in_flight,
            hedged=self.hedged,
            hedge_wins=self.hedge_wins,
        )

    # ----- the end of a session -----------------------------------------------------------------------------
    async def _wait_for_end(self, stop: asyncio.Event) -> str:
        assert self._all_done is not None
        while True:
            if self.halt is not None:
                return "halted"
            if self._all_done.is_set():
                return "complete"
            if stop.is_set():
                return "interrupted"
            self._check_all_down()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MAIN_POLL_S):
                    await self._all_done.wait()

    def _check_all_down(self) -> None:
        if any(s.up for s in self.servers):
            self._all_down_since = None
            return
        now = time.monotonic()
        if self._all_down_since is None:
            self._all_down_since = now
            self._event("fleet", "every server is down: waiting for one to come back (no attempts spent)")
        elif now - self._all_down_since > self.config.all_down_timeout_s:
            self.halt = AllServersDown(
                f"every server has been down for {self.config.all_down_timeout_s:.0f} s "
                f"(all_down_timeout_s); finished work is saved — bring the servers back and resume"
            )

    def _maybe_done(self) -> None:
        if self._reader_done and self._outstanding == 0 and self._all_done is not None:
            self._all_done.set()

    # ----- reader -------------------------------------------------------------------------------------------
    async def _reader(self, prompts: Iterator[PromptRow | RejectedRow]) -> None:
        assert self._queue is not None and self._slots is not None
        done_ids = self.store.done_ids
        for count, item in enumerate(prompts):
            if count % READER_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # keep the loop responsive while skipping stored ids
            if isinstance(item, RejectedRow) or item.id in done_ids:
                continue
            await self._slots.acquire()
            self._outstanding += 1
            self._queue.put_nowait(_Item(Conversation(item, self.config.turns)))
        self._reader_done = True
        self._maybe_done()

    # ----- workers ------------------------------------------------------------------------------------------
    async def _worker(self, server: _Server, slot: int) -> None:
        assert self._queue is not None and self._slots is not None
        queue = self._queue
        while True:
            if not server.up:
                await server.up_event.wait()
            item = await queue.get()
            if item.holds_slot:
                item.holds_slot = False
                self._slots.release()
            if not server.up:  # went down while this worker waited for work
                queue.put_nowait(item)
                continue
            item.attempts += 1
            item.last_server = server.url
            flight = _Flight(item, turn=item.answered)
            result, error = await self._send(server, slot, flight)
            if flight.stale:  # its hedge copy answered this turn first; this request was cancelled
                continue
            if (
                result is None and flight.evicted
            ):  # its server was marked down under it: not the prompt's fault
                item.attempts -= 1
                if not item.copy_running:  # else the hedge copy carries on
                    queue.put_nowait(item)
                continue
            self._settle(server, item, result, error)

    async def _send(
        self, server: _Server, key: int, flight: _Flight
    ) -> tuple[ChatResult | None, RequestError | None]:
        """One request for ``flight``'s turn to ``server``, registered in its in-flight table under ``key``."""
        config = self.config
        item = flight.item
        if not server.in_flight:
            server.last_answer = time.monotonic()  # an idle spell is not silence
        server.in_flight[key] = flight
        item.racing.add(flight)
        result: ChatResult | None = None
        error: RequestError | None = None
        timeout_s = server.deadline.timeout_s(item.presumed_hung)
        try:
            async with asyncio.timeout(timeout_s) as scope:
                flight.scope = scope
                result = await server.client.chat(
                    item.conversation.request(),
                    self.sampling,
                    config.model,
                    stream=config.stream,
                    timeout_s=config.request_timeout_s + 30.0,
                )
        except TimeoutError:
            if not flight.evicted and not flight.lost:
                error = self._timeout_error(server, item, timeout_s)
        except RequestError as exc:
            error = exc
        finally:
            del server.in_flight[key]
            item.racing.discard(flight)
        if result is not None or (error is not None and error.kind in ("http", "protocol")):
            server.last_answer = time.monotonic()  # it answered, if only with an error
        return result, error

    def _settle(
        self,
        server: _Server,
        item: _Item,
        result: ChatResult | None,
        error: RequestError | None,
        *,
        hedge: bool = False,
    ) -> None:
        """Keep an answer, or handle a failure (unless the turn's other copy still runs: that one decides)."""
        if result is not None and result.finish_reason == "abort":
            error = RequestError("protocol", "the server aborted the request (finish_reason 'abort')")
        if error is not None:
            if item.copy_running:
                self._count_failure(server, error)
                return
            self._on_failure(server, item, error)
        else:
            assert result is not None
            self._on_success(server, item, result, hedge=hedge)

    def _timeout_error(self, server: _Server, item: _Item, timeout_s: float) -> RequestError:
        if timeout_s >= self.config.request_timeout_s:
            return RequestError(
                "timeout", f"no answer within request_timeout_s={self.config.request_timeout_s:g}"
            )
        item.presumed_hung += 1
        return RequestError(
            "timeout",
            f"presumed hung: no answer within {timeout_s:.0f} s (hang_factor {self.config.hang_factor:g} x "
            f"max_tokens at this server's slow rate of {server.deadline.slow_rate:.1f} tok/s per request); "
            f"the next try gets twice as long",
        )

    def _on_success(self, server: _Server, item: _Item, result: ChatResult, *, hedge: bool = False) -> None:
        item.answered += 1  # any copy of this turn still running is now stale
        item.hedged = False
        now = asyncio.get_running_loop().time()
        for other in item.racing:  # cancelled: its server sees the connection close and aborts it
            other.lost = True
            _cut_short(other, now)
        if hedge:
            self.hedge_wins += 1
            server.stats.hedge_wins += 1
        self.rates.observe(server.url, result.completion_tokens, result.latency_s)
        if server.deadline.observe(result.completion_tokens, result.latency_s):
            deadline = server.deadline
            self._event(
                server.url,
                f"hang deadline learned: {deadline.timeout_s():.0f} s (slow rate {deadline.slow_rate:.1f} tok/s "
                f"per request; request_timeout_s {self.config.request_timeout_s:g} s stays the hard limit)",
            )
        server.consecutive_failures = 0
        tokens = result.completion_tokens or 0
        server.stats.completed += 1
        server.stats.completion_tokens += tokens
        if result.spec_accept_length is not None:
            server.stats.accept_sum += result.spec_accept_length
            server.stats.accept_n += 1
        conversation = item.conversation
        label = conversation.label()
        conversation.record(result, item.attempts)
        self.turns += 1
        if conversation.finished:
            self.store.add(conversation.output_row())
            self.completed += 1
            self._outstanding -= 1
        else:  # the next turn goes back to the queue: whichever server pulls it next answers it
            item.attempts = 0
            item.presumed_hung = 0
            assert self._queue is not None
            self._queue.put_nowait(item)
        if self.progress is not None:
            self.progress.advance(tokens, conversation_done=conversation.finished)
        self._maybe_done()
        try:
            self.guard.observe(  # every turn is a sample
                id=label,
                server=server.url,
                content=result.content,
                reasoning=result.reasoning_content,
                finish_reason=result.finish_reason,
            )
        except GuardTripped as tripped:
            self._stop_with(tripped)

    def _count_failure(self, server: _Server, error: RequestError) -> None:
        server.stats.errors += 1
        if counts_against_server(error):
            server.consecutive_failures += 1
            if server.up and server.consecutive_failures >= self.config.server_down_after:
                self._mark_down(server, f"{server.consecutive_failures} consecutive failures (last: {error})")

    def _on_failure(self, server: _Server, item: _Item, error: RequestError) -> None:
        self._count_failure(server, error)
        if self.policy.should_retry(error, item.attempts):
            delay = self.policy.delay(item.attempts, error, self.rng)
            key = id(item)
            loop = asyncio.get_running_loop()
            self._timers[key] = loop.call_later(delay, self._retry_due, key, item)
            return
        self.store.add_failure(item.conversation.failure_row(error, item.attempts, server.url))
        self.failed += 1
        self._outstanding -= 1
        if self.progress is not None:
            self.progress.fail()
        self._maybe_done()
        try:
            self.guard.observe(id=item.conversation.label(), server=server.url, error=str(error))
        except GuardTripped as tripped:
            self._stop_with(tripped)

    def _retry_due(self, key: int, item: _Item) -> None:
        self._timers.pop(key, None)
        assert self._queue is not None
        self._queue.put_nowait(item)

    def _stop_with(self, error: BaseException) -> None:
        if self.halt is None:
            self.halt = error
            if self._all_done is not None:
                self._all_done.set()  # wake the main loop now

    # ----- hedging the tail ----------------------------------------------------------------------------------
    def _hedge_plan(self) -> list[tuple[_Item, _Server]]:
        """Copies to send now: only when nothing is left to send (reader done, queue empty, no retry pending)."""
        assert self._queue is not None
        if not (self._reader_done and self._queue.empty() and not self._timers):
            return []
        up = [s for s in self.servers if s.up]
        slow = self.rates.slow_servers([s.url for s in up], self.hedge_policy)
        if not slow:
            return []
        flights = {(s.index, key): flight for s in up for key, flight in s.in_flight.items()}
        running = [
            Running(key=key, server=self.servers[key[0]].url, started=f.started, hedged=f.item.hedged)
            for key, f in flights.items()
            if not f.stale and not f.evicted and not f.lost
        ]
        idle = {s.url: self.config.concurrency_per_server - len(s.in_flight) for s in up}
        by_url = {s.url: s for s in up}
        return [(flights[key].item, by_url[target]) for key, target in plan_hedges(running, slow, idle)]

    async def _hedger(self) -> None:
        async with asyncio.TaskGroup() as group:
            while True:
                await asyncio.sleep(HEDGE_POLL_S)
                plan = self._hedge_plan()
                for item, target in plan:
                    item.hedged = True
                    self.hedged += 1
                    target.stats.hedges += 1
                    group.create_task(self._hedge(target, item))
                if plan:
                    sources = sorted({item.last_server or "?" for item, _ in plan})
                    self._event(
                        "fleet",
                        f"hedged {len(plan)} request(s) still running on slow {', '.join(sources)} "
                        f"(median per-request rate below {self.hedge_policy.slow_ratio:g} x the fleet's): "
                        "copies sent to idle servers, the first answer is kept",
                    )

    async def _hedge(self, server: _Server, item: _Item) -> None:
        """The copy: same turn, another server; whichever answers first is kept, the other is cancelled."""
        flight = _Flight(item, turn=item.answered, hedge=True)
        result, error = await self._send(server, next(self._hedge_keys), flight)
        if flight.stale or (result is None and flight.evicted and item.copy_running):
            return
        if result is None and flight.evicted:  # both copies' servers went down: back to the queue
            assert self._queue is not None
            self._queue.put_nowait(item)
            return
        self._settle(server, item, result, error, hedge=True)

    # ----- server health ------------------------------------------------------------------------------------
    def _mark_down(self, server: _Server, why: str) -> None:
        server.up = False
        server.up_event.clear()
        server.down_event.set()
        server.down_since = time.time()
        server.stats.downs += 1
        now = asyncio.get_running_loop().time()
        evicted = 0
        for flight in server.in_flight.values():
            flight.evicted = True
            if flight.scope is not None:
                _cut_short(flight, now)
                evicted += 1
        self._event(
            server.url, f"marked down after {why}; {evicted} in-flight request(s) handed to other servers"
        )

    def _mark_up(self, server: _Server) -> None:
        if server.down_since is not None:
            server.stats.down_s += time.time() - server.down_since
        server.down_since = None
        server.consecutive_failures = 0
        server.last_answer = time.monotonic()
        server.up = True
        server.down_event.clear()
        server.up_event.set()
        self._event(server.url, "healthy again (/health_generate 200): rejoined")

    async def _prober(self, server: _Server) -> None:
        config = self.config
        while True:
            await server.down_event.wait()
            delay = config.probe_interval_s
            while not server.up:
                await asyncio.sleep(delay)
                status = (
                    await introspect.health(
                        server.client, generate=True, timeout_s=min(30.0, config.request_timeout_s)
                    )
                ).status
                if status == 200:
                    self._mark_up(server)
                else:
                    delay = min(delay * 2, config.probe_max_interval_s)

    async def _silence_watch(self, server: _Server) -> None:
        """A wedged scheduler answers nothing while /health says 200: after ``server_silence_s`` of silence with
        requests in flight, ask /health_generate (SGLang: 200 on any scheduler output, 503 after 20 s without)."""
        limit = self.config.server_silence_s
        while True:
            await asyncio.sleep(min(SILENCE_POLL_S, limit / 4))
            silent = time.monotonic() - server.last_answer
            if not server.up or not server.in_flight or silent < limit:
                continue
            status = (
                await introspect.health(server.client, generate=True, timeout_s=SILENCE_HEALTH_TIMEOUT_S)
            ).status
            silent = time.monotonic() - server.last_answer
            if not server.up or silent < limit:  # benched by its failures, or it answered meanwhile
                continue
            in_flight = len(server.in_flight)
            if status == 200:
                server.last_answer = time.monotonic()  # alive, only slow: look again after another silence
                self._event(
                    server.url,
                    f"no answer for {silent:.0f} s with {in_flight} in flight, but /health_generate 200: waiting",
                )
                continue
            self._mark_down(
                server,
                f"{silent:.0f} s without an answer with {in_flight} in flight and /health_generate "
                f"{status or 'unanswered'} (server_silence_s {limit:g})",
            )

    # ----- progress -----------------------------------------------------------------------------------------
    def _event(self, server: str, what: str) -> None:
        event = (time.time(), server, what)
        if len(self.events) < EVENT_LOG_LIMIT:
            self.events.append(event)
        self.recent_events.append(event)
        if self.progress is not None:
            self.progress.note(f"[{time.strftime('%H:%M:%S')}] {short_label(server)}: {what}")

    def _refresh(self) -> None:
        assert self.progress is not None
        views = [ServerView(short_label(s.url), len(s.in_flight), s.up) for s in self.servers]
        self.progress.refresh(views, retrying=len(self._timers))

    def snapshot(self) -> FleetSnapshot:
        """The session's counters now, for progress.json."""
        servers = tuple(
            ServerSnapshot(
                url=s.url,
                up=s.up,
                in_flight=len(s.in_flight),
                completed=s.stats.completed,
                completion_tokens=s.stats.completion_tokens,
                accept_sum=s.stats.accept_sum,
                accept_n=s.stats.accept_n,
                errors=s.stats.errors,
                downs=s.stats.downs,
            )
            for s in self.servers
        )
        return FleetSnapshot(
            completed=self.completed,
            failed=self.failed,
            completion_tokens=sum(s.completion_tokens for s in servers),
            retrying=len(self._timers),
            servers=servers,
            guard_rates=self.guard.rates(),
            guard_totals=dict(self.guard.totals),
            guard_seen=self.guard.seen,
            events=tuple(self.recent_events),
            turns_completed=self.turns,
        )

    async def _ticker(self) -> None:
        interval = max(0.05, self.config.progress_interval_s)
        if self.status is not None:
            interval = min(interval, self.config.status_interval_s)
        while True:
            if self.progress is not None:
                self._refresh()
            if self.status is not None:
                self.status.update(self.snapshot())
            await asyncio.sleep(interval)
