"""One session of a run folder: the store, the status file, the progress bar, the guard and the event log, fed
by dispatch's events, and ended exactly once.

Every way a session can end — finished, interrupted, halted by the guard or by an all-down fleet, failed by an
error, stopped by a full disk — goes through ``end`` (or ``end_disk_full``), which writes the status file's last
state and the manifest's session record together with the same detail.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftgen.client.errors import RequestError
from draftgen.client.records import ChatResult
from draftgen.display.humanize import human_bytes, short_label
from draftgen.generate.cache_share import CacheTally
from draftgen.generate.config import GenerateConfig
from draftgen.generate.dispatch import Dispatcher, DispatchOutcome
from draftgen.generate.guard import CUT_AT_MAX_LENGTH, Guard, GuardSettings
from draftgen.generate.length_cap import BY_MAX_TOKENS, NO_ROOM
from draftgen.generate.preflight import Plan
from draftgen.generate.progress import Progress, ServerView
from draftgen.generate.status_file import StatusWriter
from draftgen.generate.store import RunStore, server_entry
from draftgen.rundir import DiskFull, free_bytes
from draftgen.watch.progress_file import set_state

EVENT_LOG_LIMIT = 1000
RECENT_EVENTS = 20  # the last events, for progress.json
SET_ASIDE_NOTES = 5  # turns set aside at the trainer's max_length that are noted one by one

# How a session ended, in the manifest → in progress.json (with its detail).
ENDINGS = {
    "complete": "finished",
    "complete_with_failures": "finished",
    "interrupted": "interrupted",
    "halted": "halted",
    "failed": "failed",
}


class RunInterrupted(RuntimeError):
    """Stopped by a signal; finished work is on disk."""


class DiskFullStop(RunInterrupted):
    """The run folder's filesystem filled up: stopped as on an interrupt, finished shards kept."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path

    def _render_traceback_(self) -> list[str]:  # IPython/Jupyter: the one line, not a traceback
        return [f"DiskFullStop: {self}"]


def guard_settings(config: GenerateConfig) -> GuardSettings:
    return GuardSettings(
        window=config.guard_window,
        min_results=config.guard_min_results,
        max_rates={
            "empty_answer": config.max_empty_answer_rate,
            "empty_reasoning": config.max_empty_reasoning_rate,
            "truncated": config.max_truncated_rate,
            "repetition_loop": config.max_loop_rate,
            "failed": config.max_failed_rate,
        },
        thinking=config.enable_thinking,
    )


class EventLog:
    """(time, server, what) of everything noted: the first ``EVENT_LOG_LIMIT`` kept, the last few for the status."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []
        self.recent: deque[tuple[float, str, str]] = deque(maxlen=RECENT_EVENTS)

    def add(self, server: str, what: str) -> None:
        event = (time.time(), server, what)
        if len(self.events) < EVENT_LOG_LIMIT:
            self.events.append(event)
        self.recent.append(event)


def session_store(config: GenerateConfig, plan: Plan) -> RunStore:
    """The store preflight opened and kept leased, now recording this session. A plan whose session has already
    ended (its generate ran once) has let go of the folder: the new session opens it again."""
    store = plan.store
    if store is None or not store.holds_lease:
        store = RunStore.open(config)
    elif store.config != config:
        raise ValueError(
            f"generate was given another config than preflight checked for {store.out_dir}: run "
            "preflight(config) again with the config to run"
        )
    store.begin_session(
        clock=plan.clock,
        prompt_scan=plan.scan.as_dict(),
        servers=[server_entry(s.url, s.capabilities) for s in plan.servers],
    )
    return store


class RunSession:
    """Takes dispatch's events (``DispatchEvents``) to the store, guard, progress bar and log; ends once."""

    def __init__(self, config: GenerateConfig, plan: Plan, *, progress: bool = True):
        self.config = config
        self.store = session_store(config, plan)
        self.guard = Guard(guard_settings(config))
        self.bar = Progress(plan.todo, enabled=progress)
        self.log = EventLog()
        self.status = StatusWriter(
            config.out_dir,
            interval_s=config.status_interval_s,
            total=plan.scan.valid,
            done_at_start=plan.scan.stored,
            max_rates=self.guard.settings.max_rates,
            note=self.bar.note,
            servers_clock=plan.clock.as_dict(),
        )
        self.ending: str | None = None
        self.set_aside_count = 0
        self.clock_kept: float | None = (
            None  # draftgen sim: the share of its clock the fleet kept this session
        )
        self.start_wave_idle_s: float | None = None  # wall seconds of capacity idle in the start-up wave
        self.cache = CacheTally()  # the prefix cache's share per turn index, over the conversations stored
        try:
            self.store.flush()
        except BaseException:
            self.close()
            raise

    # ----- dispatch's events ---------------------------------------------------------------------------------
    def kept(
        self,
        server: str,
        label: str,
        result: ChatResult,
        row: dict[str, Any] | None,
        thinking: bool | None = None,
        budget_by: str = BY_MAX_TOKENS,
    ) -> None:
        if row is not None:
            self.store.add(row)
            self.cache.add_row(row)
        self.bar.advance(result.completion_tokens or 0, conversation_done=row is not None)
        self.guard.observe(  # every turn is a sample; raises GuardTripped (a StopRun)
            id=label,
            server=server,
            content=result.content,
            reasoning=result.reasoning_content,
            finish_reason=result.finish_reason,
            thinking=thinking,
            budget_by=budget_by,
            calls=len(result.tool_calls),
        )

    def failed(self, server: str | None, label: str, row: dict[str, Any], error: RequestError) -> None:
        self.store.add_failure(row)
        self.bar.fail()
        self.guard.observe(id=label, server=server, error=str(error))

    def set_aside(
        self,
        label: str,
        reason: str,
        row: dict[str, Any] | None,
        rejected: dict[str, Any] | None,
        why: str = NO_ROOM,
    ) -> None:
        if row is not None:
            self.store.add(row)
        if rejected is not None:
            self.store.add_rejected(rejected)
        self.store.count_set_aside(why)
        self.bar.skip()
        self.set_aside_count += 1
        if self.set_aside_count <= SET_ASIDE_NOTES:
            more = " (further ones are counted, not shown)" if self.set_aside_count == SET_ASIDE_NOTES else ""
            self.note("", f"{label}, not sent: {reason}{more}")

    def note(self, server: str, what: str) -> None:
        self.log.add(server, what)
        self.bar.note(f"[{time.strftime('%H:%M:%S')}] {short_label(server)}: {what}")

    # ----- while it runs -------------------------------------------------------------------------------------
    def show(self, dispatcher: Dispatcher, *, force: bool = False) -> None:
        """Redraw the bar and hand the counters to the status file (written every ``status_interval_s``)."""
        snapshot = dispatcher.snapshot()
        views = [ServerView(short_label(s.url), s.in_flight, s.up) for s in snapshot.servers]
        self.bar.refresh(views, retrying=snapshot.retrying)
        full = replace(
            snapshot,
            guard_rates=self.guard.rates(),
            guard_totals=dict(self.guard.totals) | {CUT_AT_MAX_LENGTH: self.guard.cut_at_max_length},
            guard_seen=self.guard.seen,
            events=tuple(self.log.recent),
            cache_by_turn=self.cache.by_turn(),
        )
        self.status.update(full, force=force)

    async def watch(self, dispatcher: Dispatcher) -> None:
        """``show`` every ``progress_interval_s`` (status file: every ``status_interval_s``) until cancelled."""
        interval = max(0.05, min(self.config.progress_interval_s, self.config.status_interval_s))
        while True:
            self.show(dispatcher)
            await asyncio.sleep(interval)

    # ----- the one way to end --------------------------------------------------------------------------------
    def end(self, ending: str, detail: str = "", outcome: DispatchOutcome | None = None) -> None:
        """Record how the session ended in progress.json and the manifest, with the same detail."""
        if self.ending is not None:
            return
        self.ending = ending
        self.bar.close()
        state = ENDINGS[ending]
        self.status.finish(state, detail or ending.replace("_", " "))
        hedges = {"hedged": outcome.hedged, "hedge_wins": outcome.hedge_wins} if outcome else {}
        span = (outcome.first_sent_at, outcome.last_answer_at) if outcome else (None, None)
        self.store.close(
            ending,
            detail,
            clock_kept=self.clock_kept,
            generating=span,
            start_wave_idle_s=self.start_wave_idle_s,
            **hedges,
        )

    def end_disk_full(self, error: DiskFull) -> DiskFullStop:
        """The disk filled: record it as far as space allows and say what is kept and what to do."""
        self.ending = "disk full"
        self.bar.close()
        config, store = self.config, self.store
        recorded = store.close_disk_full(error)
        with contextlib.suppress(OSError):  # DiskFull too: progress.json is rewritten in place when it can be
            set_state(config.out_dir, "interrupted", f"disk full: {error.path}")
        shards = len(store.manifest.get("shards", []))
        message = (
            f"disk full: {error}. {store.stored_rows:,} rows are safe in {shards:,} shards in {config.out_dir}"
            + ("" if recorded else " (manifest.json could not be updated: no space even for it)")
            + f"; {human_bytes(free_bytes(config.out_dir))} free now. Free space, then run again with the same "
            "out_dir (draftgen run generate --name RUN --resume) to continue."
        )
        return DiskFullStop(message, error.path)

    def close(self) -> None:
        """Release the run folder's lock (after ``end``, or when the session could not start)."""
        self.store.release()
