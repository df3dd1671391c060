"""Pull-based dispatch: every server keeps ``concurrency_per_server`` requests in flight from one shared queue.

A reader streams prompts into a bounded queue; each server runs ``concurrency_per_server`` workers that pull
the next conversation when their previous request ends, so a slow server simply takes less work and nothing
waits behind it. Failures are retried (``RetryPolicy``: backoff with full jitter, Retry-After honoured) on
whichever server pulls them next. A request that outlives its server's learned deadline (``deadline``) is presumed
hung and retried. Servers are benched and brought back by ``FleetHealth``; at the tail, requests still running on
a slow server are copied to idle ones (``TailHedger``) and the first answer kept. A conversation with k answer
points is k requests in order, one at a time, any server taking each turn.

The dispatcher only decides and sends: what it keeps or gives up goes out as events (``DispatchEvents``) to the
store, the guard and the progress display; the servers' clients come from a factory, so unit tests drive every
rule here with fake servers on a virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Container, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from draftgen.client.errors import RequestError
from draftgen.client.records import Capabilities, ChatResult
from draftgen.client.retry import RetryPolicy, RetryTimers
from draftgen.client.server import ServerClient
from draftgen.generate.affinity import prefix_affinity
from draftgen.generate.config import GenerateConfig
from draftgen.generate.deadline import HangPolicy, ServerDeadline
from draftgen.generate.events import DispatchEvents, StopRun
from draftgen.generate.fleet_health import ChatClient, FleetHealth, Server, ServerStats
from draftgen.generate.hedge import HedgePolicy, TailHedger
from draftgen.generate.length_cap import LengthCap, TurnLimit
from draftgen.generate.status_file import FleetSnapshot, ServerSnapshot
from draftgen.generate.turn_settings import TurnSettings
from draftgen.generate.work import Flight, FlightState, Intake, TurnState, Work, WorkQueue
from draftgen.prompts.rows import PromptRow, RejectedRow

MAIN_POLL_S = 0.2


@dataclass(frozen=True)
class ServerPlan:
    """A server as preflight found it: its URL and what it accepts."""

    url: str
    capabilities: Capabilities


ClientFactory = Callable[[ServerPlan], ChatClient]


def server_clients(config: GenerateConfig, api_key: str = "EMPTY") -> ClientFactory:
    """The production factory: one ``ServerClient`` (one HTTP stack, the SDK's ``max_retries=0``) per server."""
    return lambda plan: ServerClient(
        plan.url,
        api_key=api_key,
        timeout_s=config.request_timeout_s + 30.0,
        capabilities=plan.capabilities,
        loop_rule=config.loop_rule,
        entropy_top_k=config.entropy_top_k,
    )


@dataclass
class DispatchOutcome:
    status: str  # "complete", "interrupted", "halted"
    completed: int  # conversations (rows) stored
    failed: int
    started_at: float
    ended_at: float
    servers: list[ServerStats]
    error: BaseException | None = None
    in_flight_at_stop: int = 0
    turns: int = 0  # turn requests answered (a conversation of k answers is k turns)
    hedged: int = 0  # requests copied to an idle server at the tail
    hedge_wins: int = 0  # turns whose kept answer came from the copy
    set_aside: int = 0  # turns not sent: their prompt alone reached the trainer's max_length
    first_sent_at: float | None = None  # wall clock: the first request sent ...
    last_answer_at: float | None = (
        None  # ... and the last answer (or failure) received: the generation's span
    )

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at


class Dispatcher:
    """One session of a generation run. ``run`` returns a DispatchOutcome; it never raises for failures of
    individual requests (they are retried or reported as events) — only for bugs and for what a sink raises."""

    def __init__(
        self,
        config: GenerateConfig,
        servers: list[ServerPlan],
        events: DispatchEvents,
        *,
        clients: ClientFactory,
        skip: Container[str] = frozenset(),
        rng: random.Random | None = None,
        length_cap: LengthCap | None = None,
    ):
        self.config = config
        self.settings = TurnSettings(config, length_cap)
        self.events = events
        self.policy = RetryPolicy(config.max_attempts, config.backoff_base_s, config.backoff_max_s)
        self.rng = rng or random.Random()
        longest = self.settings.longest_max_tokens
        hang = HangPolicy(config.request_timeout_s, longest, config.hang_factor, config.hang_min_s)
        self.servers = [
            Server(i, client, ServerDeadline(hang), ServerStats(client.url))
            for i, client in enumerate(clients(plan) for plan in servers)
        ]
        self.health = FleetHealth(config, self.servers, events.note)
        self.hedger = TailHedger(HedgePolicy(config.hedge_slow_ratio), config.concurrency_per_server)
        self.halt: BaseException | None = None
        self.completed = self.turns = self.failed = self.hedged = self.hedge_wins = self.set_aside = 0
        self.trained_tokens = 0  # completion tokens the trainer keeps: each turn's up to train_max_length
        self.first_sent_at: float | None = None
        self.last_answer_at: float | None = None
        self._queue = WorkQueue(prefix_affinity(config, self.servers, self.hedger.rates))
        window = max(64, 2 * config.concurrency_per_server * len(servers))
        self._intake = Intake(self._queue, turns=config.turns, window=window, skip=skip)
        self._timers: RetryTimers[Work] = RetryTimers(self._requeue)
        self._keys = iter(range(1 << 62))  # in_flight keys

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    # ----- the session --------------------------------------------------------------------------------------
    async def run(self, prompts: Iterator[PromptRow | RejectedRow], stop: asyncio.Event) -> DispatchOutcome:
        started, status, in_flight = time.time(), "interrupted", 0
        for server in self.servers:
            server.last_answer = self._now()
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(job) for job in self._jobs(prompts)]
                status = await self._wait_for_end(stop)
                in_flight = sum(len(s.in_flight) for s in self.servers)
                for task in tasks:
                    task.cancel()
        except (
            BaseExceptionGroup
        ) as group_error:  # a bug in a worker, or a full disk: the first one, unwrapped
            errors = group_error.exceptions
            raise errors[0] if len(errors) == 1 else group_error from None
        finally:
            self._timers.cancel_all()
            self.health.close()
            for server in self.servers:
                await server.client.close()
        return DispatchOutcome(
            status=status,
            completed=self.completed,
            failed=self.failed,
            started_at=started,
            ended_at=time.time(),
            servers=[s.stats for s in self.servers],
            error=self.halt,
            in_flight_at_stop=in_flight,
            turns=self.turns,
            hedged=self.hedged,
            hedge_wins=self.hedge_wins,
            set_aside=self.set_aside,
            first_sent_at=self.first_sent_at,
            last_answer_at=self.last_answer_at,
        )

    def _jobs(self, prompts: Iterator[PromptRow | RejectedRow]) -> Iterator[Coroutine[Any, Any, None]]:
        yield self._intake.read(prompts)
        for server in self.servers:
            yield self.health.probe_while_down(server)
            if self.config.server_silence_s > 0:
                yield self.health.watch_silence(server)
            yield from (self._worker(server) for _ in range(self.config.concurrency_per_server))
        if self.hedger.policy.enabled and len(self.servers) > 1:
            yield self.hedger.watch(self.servers, self._nothing_left, self._send_copy, self.events.note)

    async def _wait_for_end(self, stop: asyncio.Event) -> str:
        while True:
            if self.halt is not None:
                return "halted"
            if self._intake.all_done.is_set():
                return "complete"
            if stop.is_set():
                return "interrupted"
            if (error := self.health.all_down_error()) is not None:
                self._stop_with(error)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MAIN_POLL_S):
                    await self._intake.all_done.wait()

    def _stop_with(self, error: BaseException) -> None:
        if self.halt is None:
            self.halt = error
            self._intake.all_done.set()  # wake the main loop now

    def _tell(self, event: Callable[..., None], *args: object) -> None:
        """Hand an event to the sink; one that must stop the run (the guard) raises StopRun."""
        try:
            event(*args)
        except StopRun as stop:
            self._stop_with(stop)

    # ----- workers -------------------------------------------------------------------------------
    async def _worker(self, server: Server) -> None:
        while True:
            if not server.up:
                await server.up_event.wait()
            work = await self._queue.get(server.url)
            self._intake.taken(work)
            if not server.up:  # went down while this worker waited for work
                self._requeue(work)
                continue
            if not self._limit(work):  # the turn could train nothing: set aside, not sent
                continue
            await self._send(server, work.launch(server.url, self._now()))

    async def _send(self, server: Server, flight: Flight) -> None:
        """One request for ``flight``'s turn to ``server`` (in its in-flight table while it runs), then settle it."""
        config, work = self.config, flight.work
        if not server.in_flight:
            server.last_answer = self._now()  # an idle spell is not silence
        key = next(self._keys)
        server.in_flight[key] = flight
        if self.first_sent_at is None:
            self.first_sent_at = time.time()
        result: ChatResult | None = None
        error: RequestError | None = None
        timeout_s = server.deadline.timeout_s(work.presumed_hung)
        try:
            async with asyncio.timeout(timeout_s) as scope:
                flight.scope = scope
                result = await server.client.chat(
                    work.conversation.wire_request(),
                    self.settings.sampling(work),
                    config.model,
                    stream=config.stream,
                    timeout_s=config.request_timeout_s + 30.0,
                    max_tokens=work.limit.max_tokens if work.limit is not None else None,
                    seed=self.settings.seed(work),
                    tools=work.conversation.tools,
                    on_first_token=self._queue.first_token_hook(work, server.url),
                )
        except TimeoutError:
            if flight.running:  # its own deadline, not cut short by an eviction or the other copy's answer
                error = server.deadline.timeout_error(timeout_s)
                if timeout_s < config.request_timeout_s:
                    work.presumed_hung += 1  # its next try gets twice as long
        except RequestError as exc:
            error = exc
        finally:
            del server.in_flight[key]
            work.land(flight)
            self.last_answer_at = time.time()
        if result is not None or (error is not None and error.kind in ("http", "protocol")):
            server.last_answer = self._now()  # it answered, if only with an error
        if flight.state is FlightState.LOST:  # the other copy of its turn answered first
            return
        if result is None and flight.state is FlightState.EVICTED:  # its server was benched under it
            work.attempts -= not flight.hedge  # not the prompt's fault: the attempt does not count
            if not work.running():  # else the other copy carries on
                self._requeue(work)
            return
        self._settle(server, flight, result, error)

    # ----- the trainer's max_length ------------------------------------------------------------------------
    def _limit(self, work: Work) -> bool:
        """False when the turn is set aside, not sent: nothing it generated could train, or less than the run's
        floor (min_turn_budget)."""
        limit = self.settings.limit(work)
        if limit is None or limit.set_aside_by is None:
            return True
        self._set_aside(work, limit)
        return False

    def _set_aside(self, work: Work, limit: TurnLimit) -> None:
        conversation = work.conversation
        label, first = conversation.label(), conversation.turn == 0
        reason = self.settings.set_aside_reason(limit)
        conversation.set_aside_rest(limit.set_aside_by)
        work.state = TurnState.SET_ASIDE
        self.set_aside += 1
        row = None if first else conversation.output_row()
        self.completed += not first
        rejected = conversation.rejected_row(reason) if first else None
        self._tell(self.events.set_aside, label, reason, row, rejected, limit.set_aside_by)
        self._intake.ended()

    # ----- what an answer or a failure decides ---------------------------------------------------------------
    def _settle(
        self, server: Server, flight: Flight, result: ChatResult | None, error: RequestError | None
    ) -> None:
        """Keep an answer, or handle a failure (unless the turn's other copy still runs: that one decides)."""
        if result is not None and result.finish_reason == "abort":
            error = RequestError("protocol", "the server aborted the request (finish_reason 'abort')")
        work = flight.work
        if error is None:
            assert result is not None
            self._keep(server, flight, result)
        elif work.running():
            self.health.failed(server, error)
        else:
            self._fail(server, work, error)

    def _keep(self, server: Server, flight: Flight, result: ChatResult) -> None:
        config, work, stats = self.config, flight.work, server.stats
        work.answered(self._now())  # any other copy of this turn is cut short: its server aborts it
        if flight.hedge:
            self.hedge_wins += 1
            stats.hedge_wins += 1
        self.hedger.rates.observe(server.url, result.completion_tokens, result.latency_s)
        if server.deadline.observe(result.completion_tokens, result.latency_s):
            self.events.note(server.url, server.deadline.learned_note())
        self.health.answered(server)
        stats.count_answer(result)
        if (note := self.settings.count_differs(work, result)) is not None:
            self.events.note(server.url, note)
        conversation = work.conversation
        label = conversation.label()
        sent, budget_by = self.settings.sent(work)
        conversation.record(result, work.attempts, sent, budget_by)
        self.turns += 1
        self.trained_tokens += trained_part(result, config.train_max_length)
        row = None
        if conversation.finished:
            work.state = TurnState.STORED
            row = conversation.output_row()
            self.completed += 1
        else:  # the next turn goes back to the queue: whichever server pulls it next answers it
            work.next_turn()
            self._requeue(work)
        thinking = self.settings.sampling(work).enable_thinking
        self._tell(self.events.kept, server.url, label, result, row, thinking, budget_by)
        if row is not None:
            self._intake.ended()

    def _fail(self, server: Server, work: Work, error: RequestError) -> None:
        self.health.failed(server, error)
        if self.policy.should_retry(error, work.attempts):
            work.state = TurnState.BACKING_OFF
            self._timers.schedule(work, self.policy.delay(work.attempts, error, self.rng))
            return
        work.state = TurnState.FAILED
        self.failed += 1
        conversation = work.conversation
        row = conversation.failure_row(error, work.attempts, server.url)
        self._tell(self.events.failed, server.url, conversation.label(), row, error)
        self._intake.ended()

    def _requeue(self, work: Work) -> None:
        work.state = TurnState.QUEUED
        self._queue.put_nowait(work)

    # ----- hedging the tail ----------------------------------------------------------------------------------
    def _nothing_left(self) -> bool:
        return self._intake.reader_done and self._queue.empty() and not self._timers

    def _send_copy(self, work: Work, target: Server) -> Coroutine[Any, Any, None]:
        self.hedged += 1
        target.stats.hedges += 1
        return self._send(target, work.launch(target.url, self._now(), hedge=True))

    # ----- what the session shows ----------------------------------------------------------------------------
    def snapshot(self) -> FleetSnapshot:
        """The session's counters now, for progress.json and the progress bar."""
        return fleet_snapshot(self, len(self._timers))


def trained_part(result: ChatResult, max_length: int) -> int:
    """The tokens of an answer the trainer keeps: at most max_length − its prompt (all of a capped turn's)."""
    made = result.completion_tokens or 0
    if not max_length or result.prompt_tokens is None:
        return made
    return min(made, max(0, max_length - result.prompt_tokens))


def fleet_snapshot(dispatcher: Dispatcher, retrying: int) -> FleetSnapshot:
    """The dispatcher's counters and its servers' (``retrying``: requests waiting out a backoff)."""
    shown = tuple(
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
            cached_tokens=s.stats.cached_tokens,
            cache_prompt_tokens=s.stats.cache_prompt_tokens,
        )
        for s in dispatcher.servers
    )
    return FleetSnapshot(
        completed=dispatcher.completed,
        failed=dispatcher.failed,
        completion_tokens=sum(s.completion_tokens for s in shown),
        retrying=retrying,
        servers=shown,
        turns_completed=dispatcher.turns,
        trained_tokens=dispatcher.trained_tokens,
    )
