"""Fake servers on a virtual clock, to drive dispatch's rules in unit tests without HTTP, threads or sleeps.

``VirtualClockLoop`` is an asyncio loop whose clock jumps to the next scheduled timer whenever nothing is ready,
so a test of a 30-minute request timeout or a doubling backoff runs in milliseconds of real time and always the
same way. A loop with nothing scheduled and nothing ready would wait forever: it raises instead, naming the
deadlock. ``FakeServer`` answers each chat request as its ``script`` says (an answer after some seconds, an error,
or a hang until cancelled) and records what happened to every request; ``Recorder`` is the events sink.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.client.errors import RequestError
from draftgen.client.records import Capabilities, ChatResult
from draftgen.generate import GenerateConfig
from draftgen.generate.dispatch import Dispatcher, DispatchOutcome, ServerPlan
from draftgen.generate.length_cap import LengthCap
from draftgen.params import build_config
from draftgen.prompts.rows import PromptRow

VIRTUAL_LIMIT_S = 30 * 24 * 3600.0  # a run still going after a virtual month is stuck


class _SkippingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError(
                "virtual clock: nothing is scheduled and nothing is ready — the loop would hang"
            )
        self.now += timeout
        if self.now > VIRTUAL_LIMIT_S:
            raise RuntimeError(f"virtual clock passed {VIRTUAL_LIMIT_S:.0f} s: the run never ends")
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._skipper = _SkippingSelector()
        super().__init__(self._skipper)

    def time(self) -> float:
        return self._skipper.now


def run_virtual(coroutine: Any) -> Any:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coroutine)


@dataclass(frozen=True)
class Reply:
    """How a fake server answers one request."""

    after_s: float = 1.0  # virtual seconds until the answer (or the error)
    error: RequestError | None = None
    hang: bool = False  # never answers; ends only when the client gives up
    content: str = "the answer"
    reasoning: str = "some thinking"
    finish_reason: str = "stop"
    completion_tokens: int = 100
    first_token_s: float = 0.0  # streamed: virtual seconds until the first token (its prompt prefilled)


@dataclass
class Request:
    """One request a fake server saw."""

    prompt_id: str
    turn: int  # answers already in its history
    sent_at: float
    outcome: str = "running"  # answered, error, cancelled
    max_tokens: int | None = None  # the max_tokens the request carried (None: the run's, not overridden)
    seed: int | None = None  # a sampling plan's sample: sample_seed(its id)


Script = Callable[["FakeServer", Request], Reply]


def always(reply: Reply) -> Script:
    return lambda server, request: reply


@dataclass(eq=False)
class FakeServer:
    url: str
    script: Script = field(default_factory=lambda: always(Reply()))
    health_status: int = 200  # what /health and /health_generate answer
    requests: list[Request] = field(default_factory=list)
    health_checks: int = 0
    closed: bool = False

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.requests)

    async def chat(
        self,
        messages,
        sampling,
        model,
        *,
        stream=False,
        timeout_s=None,
        max_tokens=None,
        seed=None,
        tools=None,
        on_first_token=None,
    ) -> ChatResult:
        loop = asyncio.get_running_loop()
        prompt_id = messages[0]["content"].split(" ", 1)[0]
        turn = sum(m["role"] == "assistant" for m in messages)
        request = Request(prompt_id, turn, loop.time(), max_tokens=max_tokens, seed=seed)
        self.requests.append(request)
        reply = self.script(self, request)
        first = None
        if stream and on_first_token is not None and not reply.hang and reply.error is None:
            first = loop.call_later(min(reply.first_token_s, reply.after_s), on_first_token)
        try:
            if reply.hang:
                await asyncio.Event().wait()
            await asyncio.sleep(reply.after_s)
        except asyncio.CancelledError:
            request.outcome = "cancelled"
            if first is not None:
                first.cancel()
            raise
        if reply.error is not None:
            request.outcome = "error"
            raise reply.error
        request.outcome = "answered"
        return ChatResult(
            server=self.url,
            response_id=f"{self.url}#{len(self.requests)}",
            reasoning_content=reply.reasoning,
            content=f"{reply.content} to {prompt_id} turn {request.turn}",
            finish_reason=reply.finish_reason,
            prompt_tokens=10,
            completion_tokens=reply.completion_tokens,
            usage_reported=True,
            spec_accept_length=None,
            spec_verify_ct=None,
            started_at=time.time(),
            latency_s=loop.time() - request.sent_at,
        )

    async def get(self, path: str, timeout_s: float = 30.0) -> tuple[int | None, str]:
        self.health_checks += 1
        return self.health_status, ""

    async def close(self) -> None:
        self.closed = True


@dataclass
class Recorder:
    """The events sink: what dispatch kept, gave up on and noted."""

    kept_turns: list[tuple[str, str, ChatResult]] = field(default_factory=list)
    stored: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    notes: list[tuple[float, str, str]] = field(default_factory=list)
    aside: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]] = field(default_factory=list)
    budgets: list[str] = field(default_factory=list)  # per kept turn: which limit set its max_tokens
    aside_why: list[str] = field(default_factory=list)  # per set-aside conversation: why

    def kept(
        self,
        server: str,
        label: str,
        result: ChatResult,
        row: dict[str, Any] | None,
        thinking: bool | None = None,
        budget_by: str = "max_tokens",
    ) -> None:
        self.kept_turns.append((server, label, result))
        self.budgets.append(budget_by)
        if row is not None:
            self.stored.append(row)

    def failed(self, server: str | None, label: str, row: dict[str, Any], error: RequestError) -> None:
        self.failures.append(row)

    def set_aside(
        self,
        label: str,
        reason: str,
        row: dict[str, Any] | None,
        rejected: dict[str, Any] | None,
        why: str = "max_length",
    ) -> None:
        self.aside.append((label, reason, row, rejected))
        self.aside_why.append(why)
        if row is not None:
            self.stored.append(row)

    def note(self, server: str, what: str) -> None:
        self.notes.append((asyncio.get_running_loop().time(), server, what))

    def noted(self, text: str) -> list[tuple[float, str, str]]:
        return [n for n in self.notes if text in n[2]]


def prompts(count: int, *, questions: int = 1) -> list[PromptRow]:
    """``count`` prompt rows named p0000…; with ``questions`` > 1, conversations of that many user turns."""
    rows = []
    for i in range(count):
        messages: list[dict[str, str]] = []
        for q in range(questions):
            if q:
                messages.append({"role": "assistant", "content": "an older answer"})
            messages.append({"role": "user", "content": f"p{i:04d} question {q}"})
        rows.append(PromptRow(f"p{i:04d}", tuple(messages), i + 1))
    return rows


def dispatch(
    config: Any,
    servers: Iterable[FakeServer],
    rows: list[PromptRow],
    *,
    seed: int = 0,
    during: Callable[[Dispatcher], Any] | None = None,
    length_cap: LengthCap | None = None,
) -> tuple[DispatchOutcome, Recorder, Dispatcher]:
    """Run one dispatch session on the virtual clock; ``during(dispatcher)`` runs beside it (a scenario)."""
    import random

    fakes = {s.url: s for s in servers}
    recorder = Recorder()
    plans = [ServerPlan(url, Capabilities(engine="fake")) for url in fakes]
    dispatcher = Dispatcher(
        config,
        plans,
        recorder,
        clients=lambda plan: fakes[plan.url],
        rng=random.Random(seed),
        length_cap=length_cap,
    )

    async def session() -> DispatchOutcome:
        stop = asyncio.Event()
        if during is None:
            return await dispatcher.run(iter(rows), stop)
        async with asyncio.TaskGroup() as group:
            side = group.create_task(during(dispatcher))
            outcome = await dispatcher.run(iter(rows), stop)
            side.cancel()
        return outcome

    return run_virtual(session()), recorder, dispatcher


# The randomized fault tests' tolerances, on the virtual clock: hangs found in tens of seconds, a server down after
# two failures and probed every few seconds, the fleet never given up on, a slow server's tail hedged.
FAULT_TOLERANCE: dict[str, object] = {
    "request_timeout_s": 120.0,
    "hang_factor": 3.0,
    "hang_min_s": 10.0,
    "max_attempts": 4,
    "server_down_after": 2,
    "server_silence_s": 30.0,
    "probe_interval_s": 1.0,
    "probe_max_interval_s": 4.0,
    "all_down_timeout_s": 10_000.0,
    "hedge_slow_ratio": 0.8,
}


def fake_config(folder: Path, **changes: object) -> GenerateConfig:
    """A GenerateConfig for a dispatch on fake servers: one prompt file in ``folder``, no canary, no hedging."""
    source = folder / "p.jsonl"
    source.write_text('{"id": "x", "messages": [{"role": "user", "content": "q"}]}\n')
    values: dict[str, object] = {
        "servers": ["http://fake:1"],
        "model": "m",
        "prompts": str(source),
        "out_dir": str(folder / "run"),
        "max_tokens": 100,
        "concurrency_per_server": 4,
        "hedge_slow_ratio": 0.0,
        "canary": False,
        **changes,
    }
    return build_config(GenerateConfig, values)
