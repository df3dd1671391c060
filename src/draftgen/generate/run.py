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
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from draftgen.diskspace import free_bytes, human_bytes
from draftgen.generate.acceptance import AcceptanceSampler, metrics_targets, write_samples
from draftgen.generate.config import GenerateConfig
from draftgen.generate.dispatch import Dispatcher, DispatchOutcome
from draftgen.generate.guard import Guard, GuardSettings
from draftgen.generate.preflight import Plan
from draftgen.generate.progress import Progress
from draftgen.generate.source import prompt_source
from draftgen.generate.status_file import StatusWriter
from draftgen.generate.store import DiskFull, RunStore
from draftgen.watch.progress_file import set_state

T = TypeVar("T")


class RunInterrupted(RuntimeError):
    """Stopped by a signal; finished work is on disk."""


class DiskFullStop(RunInterrupted):
    """The run folder's filesystem filled up: stopped as on an interrupt, finished shards kept."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path

    def _render_traceback_(self) -> list[str]:  # IPython/Jupyter: the one line, not a traceback
        return [f"DiskFullStop: {self}"]


def _disk_full_in(exc: BaseException | None, seen: set[int] | None = None) -> DiskFull | None:
    """The DiskFull behind ``exc``: itself, inside an exception group (several workers failed), or what a later
    error (e.g. acceptance.parquet failing on the same full disk) was raised while handling.

    ``seen`` is shared by the whole search: a group member's context can lead back to the group itself.
    """
    seen = set() if seen is None else seen
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                found = _disk_full_in(inner, seen)
                if found is not None:
                    return found
        exc = exc.__cause__ or exc.__context__
    return None


def _disk_full(config: GenerateConfig, store: RunStore, error: DiskFull) -> DiskFullStop:
    """Record the stop in the manifest (as far as space allows) and say what is kept and what to do."""
    recorded = store.close_disk_full(error)
    with contextlib.suppress(OSError):  # progress.json is rewritten in place when no temporary file fits
        set_state(config.out_dir, "interrupted", f"disk full: {error.path}")
    shards = len(store.manifest.get("shards", []))
    message = (
        f"disk full: {error}. {store.stored_rows:,} rows are safe in {shards:,} shards in {config.out_dir}"
        + ("" if recorded else " (manifest.json could not be updated: no space even for it)")
        + f"; {human_bytes(free_bytes(config.out_dir))} free now. Free space, then run again with the same out_dir "
        "(draftgen run generate --name RUN --resume) to continue."
    )
    return DiskFullStop(message, error.path)


@dataclass(frozen=True)
class RunResult:
    status: str  # "complete", "complete_with_failures"
    out_dir: Path
    completed: int  # rows (conversations) stored by this session
    failed: int  # prompts that went to failed.parquet in this session
    stored: int  # rows in the run folder now
    outcome: DispatchOutcome

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


def guard_settings(config: GenerateConfig) -> GuardSettings:
    return GuardSettings(
        window=config.guard_window,
        min_results=config.guard_min_results,
        max_rates={
            "empty_answer": config.max_empty_answer_rate,
            "empty_reasoning": config.max_empty_reasoning_rate,
            "truncated": config.max_truncated_rate,
            "failed": config.max_failed_rate,
        },
        thinking=config.enable_thinking,
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
    api_key = config.api_key() if config.api_key_env else "EMPTY"
    return AcceptanceSampler(targets, config.acceptance_interval_s, api_key=api_key)


async def _with_sampler(sampler: AcceptanceSampler | None, work: Awaitable[T], out_dir: str) -> T:
    """Await ``work`` while ``sampler`` scrapes the workers' /metrics; the windows go to acceptance.parquet."""
    if sampler is None:
        return await work
    task = asyncio.create_task(sampler.run())
    try:
        return await work
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        write_samples(out_dir, sampler.samples)


async def generate(
    config: GenerateConfig, plan: Plan, *, progress: bool = True, rng: random.Random | None = None
) -> RunResult:
    """Run (or resume) the generation described by ``config`` on the servers preflight approved."""
    store = RunStore.open(config)
    try:
        store.clock = plan.clock
        store.prompt_stats = plan.scan.as_dict()
        store.rejected_count = plan.scan.rejected
        store.flush()
        guard = Guard(guard_settings(config))
        bar = Progress(plan.todo, enabled=progress)
        status = StatusWriter(
            config.out_dir,
            interval_s=config.status_interval_s,
            total=plan.scan.valid,
            done_at_start=plan.scan.stored,
            max_rates=guard.settings.max_rates,
            note=bar.note,
        )
        stop = asyncio.Event()
        received: list[str] = []
        dispatcher = Dispatcher(
            config,
            plan.servers,
            store,
            guard,
            bar,
            api_key=config.api_key() if config.api_key_env else "EMPTY",
            rng=rng,
            status=status,
        )
        sampler = _acceptance_sampler(config, plan)
        try:
            with _stop_on_signals(stop, received):
                outcome = await _with_sampler(
                    sampler, dispatcher.run(prompt_source(config), stop), config.out_dir
                )
            store.session.hedged, store.session.hedge_wins = outcome.hedged, outcome.hedge_wins
        except BaseException as exc:
            full = _disk_full_in(exc)
            if full is not None:
                raise full from None  # nothing more can be written: recorded below
            state = "failed" if isinstance(exc, Exception) else "interrupted"
            detail = f"{type(exc).__name__}: {exc}"
            status.finish(state, detail)
            store.close(state, detail)
            raise
        finally:
            bar.close()
        if outcome.status == "halted":
            assert outcome.error is not None
            status.finish("halted", str(outcome.error))
            store.close("halted", str(outcome.error))
            raise outcome.error
        if outcome.status == "interrupted":
            why = received[0] if received else "stop"
            status.finish("interrupted", f"stopped by {why}")
            store.close("interrupted", why)
            message = (
                f"stopped by {why}: {outcome.completed:,} rows stored this session ({store.stored_rows:,} in "
                f"{config.out_dir}); {outcome.in_flight_at_stop} in-flight requests abandoned. Run again with the "
                "same out_dir (draftgen run generate --name RUN --resume) to continue."
            )
            if why == "SIGINT":
                raise KeyboardInterrupt(message)
            raise RunInterrupted(message)
        ending = "complete" if store.failed_count == 0 else "complete_with_failures"
        store.close(ending)
        status.finish("finished", ending.replace("_", " "))
        return RunResult(
            status=ending,
            out_dir=Path(config.out_dir),
            completed=outcome.completed,
            failed=outcome.failed,
            stored=store.stored_rows,
            outcome=outcome,
        )
    except DiskFull as full:
        disk_full = _disk_full(config, store, full)
    finally:
        store.release()
    # Raised outside the handler: no chained context, so a notebook shows DiskFullStop's one line (IPython prints
    # a native traceback for anything whose context holds the dispatcher's exception group).
    raise disk_full
