"""One session of a generation run: open the run folder, dispatch, flush, and say how it ended.

Ctrl-C (SIGINT, also a notebook's interrupt) and SIGTERM stop the session gracefully: requests in flight are
abandoned (they are redone on resume), every finished row is written, the manifest records the session, and
the error raised says how to resume. Anything else that ends the session early flushes the same way. A full
disk stops it the same way (``DiskFullStop``: finished shards kept, manifest ``disk full`` with the path, one line
in a notebook instead of a traceback); ``--resume`` continues once space is freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import threading
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from draftgen.client.clock import kept_share, read_clock_kept
from draftgen.client.server import ServerClient
from draftgen.generate.acceptance import AcceptanceSampler, metrics_targets, write_samples
from draftgen.generate.config import GenerateConfig
from draftgen.generate.dispatch import Dispatcher, DispatchOutcome, server_clients
from draftgen.generate.preflight import Plan
from draftgen.generate.ramp import measure_ramp
from draftgen.generate.session import DiskFullStop, RunInterrupted, RunSession, guard_settings
from draftgen.generate.source import prompt_source
from draftgen.rundir import DiskFull

__all__ = ["DiskFullStop", "RunInterrupted", "RunResult", "generate", "guard_settings"]

T = TypeVar("T")


def _disk_full_in(exc: BaseException | None, seen: set[int] | None = None) -> DiskFull | None:
    """The DiskFull that stopped the run, the earliest behind ``exc``: itself, inside an exception group (several
    workers failed), or the one a later error (e.g. acceptance.parquet failing on the same full disk, itself a
    DiskFull) was raised while handling.

    ``seen`` is shared by the whole search: a group member's context can lead back to the group itself.
    """
    seen = set() if seen is None else seen
    found = None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            found = exc
        elif isinstance(exc, BaseExceptionGroup):
            inner = (_disk_full_in(member, seen) for member in exc.exceptions)
            found = next((member for member in inner if member is not None), found)
        exc = exc.__cause__ or exc.__context__
    return found


@dataclass(frozen=True)
class RunResult:
    status: str  # "complete", "complete_with_failures"
    out_dir: Path
    completed: int  # rows (conversations) stored by this session
    failed: int  # prompts that went to failed.parquet in this session
    stored: int  # rows in the run folder now
    outcome: DispatchOutcome
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (time, server, what happened)

    def _turns(self) -> str:
        turns = self.outcome.turns
        return f" ({turns:,} turns answered)" if turns != self.completed else ""

    def __str__(self) -> str:
        return (
            f"{self.status}: {self.completed:,} rows stored this session{self._turns()} ({self.stored:,} in "
            f"{self.out_dir}), "
            f"{self.failed:,} failed, {self.outcome.wall_s:,.1f} s"
            + (f", {self.outcome.hedged:,} hedged at the tail" if self.outcome.hedged else "")
        )


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event, received: list[str]) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` while the session runs (main thread only); previous handlers restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):

        def handler(sig: signal.Signals = sig) -> None:
            received.append(sig.name)
            stop.set()

        previous[sig] = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError, ValueError):
            previous.pop(sig)
    try:
        yield
    finally:
        for sig, old in previous.items():
            loop.remove_signal_handler(sig)
            with contextlib.suppress(TypeError, ValueError):
                signal.signal(sig, old)


def _acceptance_sampler(config: GenerateConfig, plan: Plan) -> AcceptanceSampler | None:
    targets = metrics_targets([(s.url, s.capabilities) for s in plan.servers])
    if config.acceptance_interval_s <= 0 or not targets:
        return None
    return AcceptanceSampler(targets, config.acceptance_interval_s, api_key=_api_key(config))


def _api_key(config: GenerateConfig) -> str:
    return config.api_key() if config.api_key_env else "EMPTY"


async def _beside(work: Awaitable[T], *companions: Awaitable[object]) -> T:
    """Await ``work`` while ``companions`` run (the status ticker, the /metrics sampler); they stop with it."""
    tasks = [asyncio.ensure_future(c) for c in companions]
    try:
        return await work
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _clock_readings(config: GenerateConfig, plan: Plan) -> list[tuple[float, float] | None] | None:
    """Each simulated server's clock_kept counters now (None: the servers are real, on the wall clock)."""
    if not plan.clock.simulated:
        return None

    async def one(url: str) -> tuple[float, float] | None:
        async with ServerClient(url, api_key=_api_key(config)) as client:
            return await read_clock_kept(client)

    return list(await asyncio.gather(*(one(s.url) for s in plan.servers)))


async def _none() -> None:
    return None


async def _dispatch(session: RunSession, config: GenerateConfig, plan: Plan, rng: random.Random | None):
    """Dispatch every prompt still to do, with the progress display and the /metrics sampler beside it."""
    dispatcher = Dispatcher(
        config,
        plan.servers,
        session,
        clients=server_clients(config, _api_key(config)),
        skip=session.store.done_ids,
        rng=rng,
        length_cap=plan.length_cap,
    )
    stop = asyncio.Event()
    received: list[str] = []
    sampler = _acceptance_sampler(config, plan)
    companions = [session.watch(dispatcher)] + ([sampler.run()] if sampler else [])
    clock_before = await _clock_readings(config, plan)
    gauges = [s.url for s in plan.servers if s.capabilities.metrics and not s.capabilities.workers]
    ramp = asyncio.ensure_future(
        measure_ramp(gauges, config.concurrency_per_server, api_key=_api_key(config)) if gauges else _none()
    )
    try:
        with _stop_on_signals(stop, received):
            outcome = await _beside(dispatcher.run(prompt_source(config), stop), *companions)
        if clock_before is not None:
            session.clock_kept = kept_share(clock_before, await _clock_readings(config, plan) or [])
    finally:
        ramp.cancel()  # long done on a run of more than one wave; a shorter one never filled its servers
        with contextlib.suppress(asyncio.CancelledError):
            session.start_wave_idle_s = await ramp
        session.show(dispatcher, force=True)
        if sampler is not None:
            write_samples(config.out_dir, sampler.samples)
    return outcome, (received[0] if received else "stop")


async def generate(
    config: GenerateConfig, plan: Plan, *, progress: bool = True, rng: random.Random | None = None
) -> RunResult:
    """Run (or resume) the generation described by ``config`` on the servers preflight approved (``config`` as
    given to preflight: what it filled in from the servers, the model and the tokenizer, is taken from the plan)."""
    config = plan.run_config(config)
    session = RunSession(config, plan, progress=progress)
    store = session.store
    try:
        try:
            outcome, why = await _dispatch(session, config, plan, rng)
        except BaseException as exc:
            full = _disk_full_in(exc)
            if full is not None:
                raise full from None
            session.end(
                "failed" if isinstance(exc, Exception) else "interrupted", f"{type(exc).__name__}: {exc}"
            )
            raise
        if outcome.status == "halted":
            assert outcome.error is not None
            session.end("halted", str(outcome.error), outcome)
            raise outcome.error
        if outcome.status == "interrupted":
            session.end("interrupted", f"stopped by {why}", outcome)
            message = (
                f"stopped by {why}: {outcome.completed:,} rows stored this session ({store.stored_rows:,} in "
                f"{config.out_dir}); {outcome.in_flight_at_stop} in-flight requests abandoned. Run again with the "
                "same out_dir (draftgen run generate --name RUN --resume) to continue."
            )
            raise KeyboardInterrupt(message) if why == "SIGINT" else RunInterrupted(message)
        ending = "complete" if store.failed_count == 0 else "complete_with_failures"
        session.end(ending, outcome=outcome)
        return RunResult(
            status=ending,
            out_dir=Path(config.out_dir),
            completed=outcome.completed,
            failed=outcome.failed,
            stored=store.stored_rows,
            outcome=outcome,
            events=session.log.events,
        )
    except DiskFull as full:
        disk_full = session.end_disk_full(full)
    finally:
        session.close()
    # Raised outside the handler: no chained context, so a notebook shows DiskFullStop's one line (IPython prints
    # a native traceback for anything whose context holds the dispatcher's exception group).
    raise disk_full
