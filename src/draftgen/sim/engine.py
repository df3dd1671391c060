"""The simulated scheduler: continuous batching with a running-request cap, one verify step at a time.

Each step admits waiting requests up to ``max_running_requests`` (their prefill, less what the prefix cache
holds, lengthens that step), lasts ``t0 + t1·batch`` simulated seconds (times the ``slow`` fault), and gives every
running request its next acceptance-length draw of tokens. A prefill-only request (the first half of SGLang's
``n``) finishes with the step that admits it. Steps are scheduled against a monotonic deadline so the aggregate rate
stays exact even when individual sleeps overshoot; ``speed`` divides every wait.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from draftgen.sim.adaptive import AdaptiveRuntime, step_seconds
from draftgen.sim.prefix_cache import PrefixCache
from draftgen.sim.profiles import Profile
from draftgen.sim.textgen import CompletionPlan

DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default: stats refresh every 40 decode steps
MAX_CATCH_UP_S = 0.05  # when late by more than this, stop trying to catch up (the process was starved)


@dataclass
class SimRequest:
    rid: str
    kind: str  # "chat", "generate", "warmup", "health"
    prompt_tokens: int
    plan: CompletionPlan
    draws: list[
        int
    ]  # tokens gained per verify step; sums to len(plan.tokens) + EOS (adaptive: filled as it runs)
    stream: bool
    seed: int | None = None  # what the completion was drawn from (a hash of the messages and sampling seed)
    rng: random.Random | None = None  # adaptive speculation: draws are made per step, at that step's count
    category: str | None = None  # the prompt's category (draftgen.sim.categories), which sets its acceptance
    temperature: float | None = (
        None  # as the request gave it (None: the model's default), which moves acceptance
    )
    accept_expected: float | None = None  # its expected acceptance length (None: adaptive, instant, MTP off)
    max_tokens: int | None = None  # the request's max_tokens (as the server took it), for the ground truth
    prompt_ids: tuple[int, ...] | None = None  # what the prefix cache matches and keeps (None: neither)
    cached_tokens: int = 0  # prompt tokens the prefix cache held at admission (not prefilled)
    prefill_only: bool = False  # SGLang's max_new_tokens=0 warm-up of n: prefilled, then finished, no tokens
    proposed_drafts: int = 0  # drafts proposed over its verifies (adaptive: the steps in force each time)
    arrival: float = field(default_factory=time.time)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    step_index: int = 0
    emitted: int = 0  # completion tokens produced so far (EOS included once produced)
    emit_times: list[float] = field(default_factory=list)
    emit_counts: list[int] = field(default_factory=list)
    outcome: str = "pending"
    finish_type: str | None = None
    # Streaming handlers wait on ``progress``; everyone waits on ``done``.
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def shown_tokens(self) -> int:
        """Visible tokens emitted so far (the EOS, when generated, is counted but not shown)."""
        return min(self.emitted, len(self.plan.tokens))

    @property
    def verify_steps(self) -> int:
        return self.step_index


def _kv_need(request: SimRequest) -> int:
    """KV tokens a request holds at its longest: its prompt and its whole completion (known to the simulator)."""
    return request.prompt_tokens + request.plan.completion_tokens


@dataclass
class EngineStats:
    """Counters a real server exposes, cumulative since start (warm-up included, like SGLang)."""

    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0  # of those, the ones the prefix cache held (not prefilled)
    generation_tokens_total: int = 0
    verify_steps_total: int = 0
    requests_total: int = 0
    aborted_total: int = 0
    decode_steps: int = 0
    # Values refreshed every DECODE_LOG_INTERVAL decode steps, as SGLang's scheduler logs them.
    avg_spec_accept_length: float | None = None
    interval_accept_length: float | None = None
    interval_throughput: float = 0.0
    _interval_tokens: int = 0
    _interval_verifies: int = 0
    _interval_started: float = field(default_factory=time.time)
    _all_step_tokens: int = 0
    _all_step_verifies: int = 0
    # How well the simulator kept its own clock: the wall seconds its steps should have taken (simulated ÷ speed)
    # and the wall seconds they took. On a starved machine the second grows; tests that compare timings read both.
    step_planned_s: float = 0.0
    step_actual_s: float = 0.0


class Engine:
    def __init__(
        self,
        profile: Profile,
        *,
        speed: float,
        slow: float,
        on_finish: Callable[[SimRequest], None],
        prefix_cache: PrefixCache | None = None,
    ):
        self.profile = profile
        self.prefix_cache = prefix_cache
        self.speed = speed
        self.slow = slow
        self.on_finish = on_finish
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self.ready = asyncio.Event()  # set after warm-up; before that only warm-up requests are admitted
        self._wake = asyncio.Event()
        self._next_deadline: float | None = None
        self.wedged = False
        self.last_step_at = 0.0  # time.time() of the last step that produced tokens (SGLang's "last receive")
        costs = profile.spec_costs
        self.adaptive = (
            AdaptiveRuntime(costs, profile.adaptive_steps)
            if profile.adaptive_steps is not None and costs is not None
            else None
        )

    def mark_ready(self) -> None:
        """Warm-up done: admit everything (and wake the loop, which may be idle with requests queued)."""
        self.ready.set()
        self._wake.set()

    def wedge(self) -> None:
        """Stop stepping for good, as a scheduler stuck in a collective or a CUDA fault would: every running
        and later request hangs (aborts still remove them), while the HTTP side keeps answering."""
        self.wedged = True

    def submit(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: SimRequest, outcome: str) -> None:
        """Remove a request wherever it is (client gone, or an injected abort)."""
        if request.done.is_set():
            return
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        self._finish(request, outcome, time.time())

    def kv_usage(self) -> float:
        used = sum(r.prompt_tokens + r.emitted for r in self.running)
        return min(1.0, used / self.profile.kv_capacity_tokens)

    def _admissible(self) -> list[SimRequest]:
        room = self.profile.max_running_requests - len(self.running)
        admitted: list[SimRequest] = []
        skipped: deque[SimRequest] = deque()
        reserved = sum(_kv_need(r) for r in self.running) if self.profile.kv_admission else 0
        while self.waiting and len(admitted) < room:
            request = self.waiting.popleft()
            if not (self.ready.is_set() or request.kind == "warmup"):
                skipped.append(request)
                continue
            if self.profile.kv_admission and (self.running or admitted):
                if reserved + _kv_need(request) > self.profile.kv_capacity_tokens:
                    self.waiting.appendleft(request)  # first in line waits for KV to free (FIFO)
                    break
            reserved += _kv_need(request)
            admitted.append(request)
        self.waiting.extendleft(reversed(skipped))
        return admitted

    async def run(self) -> None:
        while True:
            if self.wedged:
                await asyncio.Event().wait()  # never set: nothing moves again
            if not self.running and not self._has_admissible():
                self._wake.clear()
                self._next_deadline = None
                await self._wake.wait()
                continue
            cycle_started = time.monotonic()
            admitted = self._admissible()
            now = time.time()
            prefill_s = 0.0
            for request in admitted:
                request.admitted = now
                request.cached_tokens = self._cached_tokens(request)
                self.stats.prompt_tokens_total += request.prompt_tokens  # prefilled in this step
                self.stats.cached_tokens_total += request.cached_tokens
                prefill_s += self.profile.prefill_seconds(request.prompt_tokens - request.cached_tokens)
            # Admitted requests are running from now on, so an abort during the step (client gone) removes
            # them for good: the step's results go only to requests still in ``running`` when it ends.
            self.running.extend(r for r in admitted if not r.prefill_only)
            steps, sim_seconds = 0, 0.0
            if not self.running:
                pass  # a step of prefill-only requests: no decode
            elif self.adaptive is not None:  # the steps this batch size's slot is at now
                steps = self.adaptive.steps_for(len(self.running))
                assert self.profile.spec_costs is not None
                sim_seconds = step_seconds(self.profile.spec_costs, len(self.running), steps) * self.slow
            else:
                steps = self.profile.spec_steps
                sim_seconds = self.profile.step_seconds(len(self.running)) * self.slow
            sim_seconds += prefill_s
            await self._wait_step(sim_seconds / self.speed)
            self._checkpoint(admitted)
            if self.running and not self.wedged:  # every request of the step may have been aborted meanwhile
                self._apply_step(time.time(), steps)
            self.stats.step_planned_s += sim_seconds / self.speed
            self.stats.step_actual_s += time.monotonic() - cycle_started

    def _cached_tokens(self, request: SimRequest) -> int:
        if self.prefix_cache is None or request.prompt_ids is None:
            return 0
        return self.prefix_cache.match(request.prompt_ids)

    def _checkpoint(self, admitted: list[SimRequest]) -> None:
        """The step's prefills are done: their prompts go into the prefix cache (so two identical prompts
        admitted together were both prefilled in full), and prefill-only requests are finished."""
        if self.wedged:
            return
        for request in admitted:
            if self.prefix_cache is not None and request.prompt_ids is not None:
                self.prefix_cache.insert(request.prompt_ids)
            if request.prefill_only and not request.done.is_set():
                self._finish(request, "ok", time.time())

    def _has_admissible(self) -> bool:
        if self.ready.is_set():
            return bool(self.waiting)
        return any(r.kind == "warmup" for r in self.waiting)

    async def _wait_step(self, wall_seconds: float) -> None:
        now = time.monotonic()
        start = self._next_deadline if self._next_deadline is not None else now
        if now - start > MAX_CATCH_UP_S:
            start = now
        deadline = start + wall_seconds
        self._next_deadline = deadline
        delay = deadline - now
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            await asyncio.sleep(0)

    def _apply_step(self, now: float, steps: int) -> None:
        self.last_step_at = now
        stats = self.stats
        finished: list[SimRequest] = []
        step_tokens = 0
        for request in self.running:
            if self.adaptive is not None and request.rng is not None:
                left = request.plan.completion_tokens - request.emitted
                request.draws.append(self.adaptive.draw(request.rng, steps, left))
            gained = request.draws[request.step_index]
            request.proposed_drafts += steps
            request.step_index += 1
            request.emitted += gained
            step_tokens += gained
            if request.first_token is None:
                request.first_token = now
            if request.stream:
                request.emit_times.append(now)
                request.emit_counts.append(gained)
                request.progress.set()
            if request.rng is not None:  # adaptive: its completion is whole
                done = request.emitted >= request.plan.completion_tokens
            else:
                done = request.step_index >= len(request.draws)
            if done:
                finished.append(request)
        verifies = len(self.running)
        if self.adaptive is not None:
            self.adaptive.observe(verifies, [r.draws[r.step_index - 1] - 1 for r in self.running])
        # Counted as produced, like SGLang's scheduler: aborted requests' tokens count too.
        stats.generation_tokens_total += step_tokens
        stats.verify_steps_total += verifies
        stats.decode_steps += 1
        stats._interval_tokens += step_tokens
        stats._interval_verifies += verifies
        stats._all_step_tokens += step_tokens
        stats._all_step_verifies += verifies
        if stats.decode_steps % DECODE_LOG_INTERVAL == 0:
            self._log_interval(now)
        for request in finished:
            self.running.remove(request)
            self._finish(request, "ok", now)

    def _log_interval(self, now: float) -> None:
        stats = self.stats
        elapsed = max(now - stats._interval_started, 1e-9)
        stats.interval_throughput = stats._interval_tokens / elapsed
        if self.profile.speculative and stats._interval_verifies:
            stats.interval_accept_length = stats._interval_tokens / stats._interval_verifies
            stats.avg_spec_accept_length = stats._all_step_tokens / stats._all_step_verifies
        stats._interval_tokens = 0
        stats._interval_verifies = 0
        stats._interval_started = now

    def _finish(self, request: SimRequest, outcome: str, now: float) -> None:
        request.outcome = outcome
        request.finished = now
        counted = request.kind != "health"  # SGLang sends its health probe with log_metrics=False
        if outcome == "ok":
            request.finish_type = request.plan.finish_type
        else:
            self.stats.aborted_total += counted
            request.finish_type = "abort"
        self.stats.requests_total += counted
        request.progress.set()
        request.done.set()
        self.on_finish(request)
