"""Run one process per GPU group, follow each through SGLang's start-up stages, and keep them running.

Each process gets its own task: start it, probe its health endpoint until 200 (or the start-up timeout:
``startup.wait_until_ready``, the loop tune's launcher runs too), then wait for it to exit. An exit or a timeout is reported with the tail of the process's log; with
``restart`` the process comes back after a growing back-off, up to ``max_restarts`` failures in a row.
A coordinator task writes ``servers.yaml`` once every server has settled (ready or failed for good), starts
the router if there is one, and rewrites the file when the set of ready servers changes; then it prints the start's
outcome as grouped checks ("ready: 7/7 servers", a row per server that was not: ``serve.summary``). SIGINT, SIGTERM or SIGHUP
stops every process group (SIGTERM, then SIGKILL after the grace period); a second signal kills at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.client.introspect import Readiness, StartupStage
from draftgen.exit_codes import ExitCode
from draftgen.rundir.layout import SERVERS
from draftgen.serve.config import ServeConfig
from draftgen.serve.launch import LaunchSpec
from draftgen.serve.process import log_tail, signal_group, spawn, stop_group
from draftgen.serve.records import write_servers_yaml
from draftgen.serve.stages import ProcessStage, Stage
from draftgen.serve.startup import StartupWatch, wait_until_ready
from draftgen.serve.summary import ServerStart, startup_text
from draftgen.serve.view import LineView, StatusRow

EXIT_OK = ExitCode.OK  # stopped as asked
EXIT_ALL_FAILED = ExitCode.FAILED  # every server failed: nothing left to supervise
MAX_BACKOFF_S = 300.0
STABLE_AFTER_S = 600.0  # a server ready this long has its run of failures forgotten
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal or ssh session went away


@dataclass
class _Member:
    """One supervised process (private to the supervisor): its run-time state, how it is shown, what its failure
    says and when it may come back."""

    spec: LaunchSpec
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    stage: Stage = ProcessStage.STARTING
    detail: str = ""
    stage_since: float = 0.0
    started_at: float | None = None
    ready_at: float | None = None
    log_offset: int = 0  # where this attempt's output starts in the log
    restarts: int = 0
    failures_in_row: int = 0
    history: list[str] = field(default_factory=list)  # stages seen in this attempt, for messages
    failure: str = ""  # why the last failed attempt failed (the start's summary names it)

    def row(self, now: float) -> StatusRow:
        return StatusRow(
            name=self.spec.name,
            port=self.spec.port,
            gpus=self.spec.gpus,
            stage=self.stage,
            detail=self.detail,
            in_stage_s=now - self.stage_since,
            up_s=now - self.started_at
            if self.started_at is not None and self.stage != ProcessStage.FAILED
            else None,
            restarts=self.restarts,
            pid=self.process.pid if self.process is not None and self.process.returncode is None else None,
        )

    def summary(self) -> ServerStart:
        """This server in the start's outcome."""
        ready = self.stage == StartupStage.READY
        return ServerStart(
            url=self.spec.url,
            ready=ready,
            ready_s=self.ready_at - self.started_at
            if ready and self.ready_at is not None and self.started_at is not None
            else None,
            restarts=self.restarts,
            failure=self.failure,
            log_path=self.log_path,
        )

    def failure_lines(self, reason: str, config: ServeConfig) -> list[str]:
        """What a failed attempt says (``reason``: "timeout" or "exited"), its log's tail last; keeps the why in
        ``failure``."""
        process = self.process
        assert process is not None and self.started_at is not None
        after = time.monotonic() - self.started_at
        was = "was ready" if self.ready_at is not None else f"stages seen: {' → '.join(self.history)}"
        if reason == "timeout":
            why = (
                f"not ready after {config.startup_timeout_s:g}s "
                f"(stuck at {self.stage.value}: {self.stage.meaning})"
            )
            headline = f"{self.spec.label}: {why}; stopping it"
        else:
            why = f"exited with code {process.returncode} after {after:.1f}s ({was})"
            headline = f"{self.spec.label}: {why}"
        tail = log_tail(self.log_path, config.log_tail_lines, self.log_offset)
        if any("address already in use" in line.lower() for line in tail):
            taken = f"; port {self.spec.port} is taken by another process"
            why += taken
            headline += taken
        self.failure = why
        return [
            headline,
            f"  last {len(tail)} lines of {self.log_path}:",
            *(f"    | {line}" for line in tail),
        ]

    def restart_delay(self, config: ServeConfig) -> float | None:
        """The back-off before the next attempt, doubling with each failure in a row; None: not restarted."""
        if self.ready_at is not None and time.monotonic() - self.ready_at >= STABLE_AFTER_S:
            self.failures_in_row = 0
        self.failures_in_row += 1
        if not config.restart or self.failures_in_row > config.max_restarts:
            return None
        return min(MAX_BACKOFF_S, config.restart_backoff_s * 2 ** (self.failures_in_row - 1))


def _clock_stamp() -> str:
    return time.strftime("%H:%M:%S")


class Supervisor:
    def __init__(
        self,
        config: ServeConfig,
        servers: list[LaunchSpec],
        router: LaunchSpec | None,
        view: LineView,
    ):
        self.config = config
        self.view = view
        run_dir = config.run_dir
        self._servers = [_Member(spec, run_dir / f"{spec.name}.log") for spec in servers]
        self._router = _Member(router, run_dir / f"{router.name}.log") if router else None
        self._router_started = False
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._result = EXIT_OK
        self._last_written: list[str] | None = None

    # ----- public ---------------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    for member in self._servers:
                        group.create_task(self._keep_running(member))
                    group.create_task(self._coordinate(group))
                    group.create_task(self._refresh())
            finally:
                await self._stop_all()
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
        return self._result

    # ----- signals ----------------------------------------------------------------------------------------
    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self._stop.is_set():
            self._event(f"{name} received: stopping every server (a second Ctrl-C kills at once)")
            self._stop.set()
            return
        self._event(f"{name} received again: killing every process group now")
        for member in self._members():
            if member.process is not None:
                signal_group(member.process.pid, signal.SIGKILL)

    # ----- helpers ------------------------------------------------------------------------------------------
    def _members(self) -> list[_Member]:
        return [*self._servers, *([self._router] if self._router and self._router_started else [])]

    def _event(self, text: str) -> None:
        self.view.event(f"{_clock_stamp()} {text}")

    def _rows(self) -> list[StatusRow]:
        now = time.monotonic()
        return [m.row(now) for m in self._members()]

    def _set_stage(self, member: _Member, stage: Stage, detail: str = "", announce: bool = True) -> None:
        if stage == member.stage and detail == member.detail:
            return
        now = time.monotonic()
        member.stage, member.detail, member.stage_since = stage, detail, now
        member.history.append(stage.value)
        if announce:
            running = member.started_at is not None and stage != ProcessStage.STARTING
            since = f" after {now - member.started_at:.1f}s" if running else ""
            extra = f" ({detail})" if detail else ""
            self._event(f"{member.spec.label}: {stage.value}{extra}{since}: {stage.meaning}")
        self._changed.set()

    async def _until_stopped(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when a stop was requested meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        return self._stop.is_set()

    async def _first_of(self, *awaitables: Awaitable[object]) -> None:
        tasks = [asyncio.ensure_future(a) for a in awaitables]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ----- one process --------------------------------------------------------------------------------------
    async def _keep_running(self, member: _Member) -> None:
        while not self._stop.is_set():
            try:
                await self._start(member)
            except OSError as exc:
                member.failure = str(exc)
                self._event(f"{member.spec.label}: {exc}")
                self._set_stage(member, ProcessStage.FAILED, announce=False)
                return
            reason = await self._watch(member)
            if reason == "stop":
                return
            assert member.process is not None
            self._event("\n".join(member.failure_lines(reason, self.config)))
            code = "timeout" if reason == "timeout" else f"code {member.process.returncode}"
            self._set_stage(member, ProcessStage.EXITED, code, announce=False)
            await stop_group(member.process, self.config.stop_grace_s)  # children left behind hold GPU memory
            delay = member.restart_delay(self.config)
            if delay is None:
                if self.config.restart:
                    why = f"gave up after {member.failures_in_row} failures in a row (--max-restarts)"
                else:
                    why = "not restarted (start with --restart to bring crashed servers back)"
                self._set_stage(member, ProcessStage.FAILED, announce=False)
                self._event(f"{member.spec.label}: {why}; its log: {member.log_path}")
                return
            self._set_stage(member, ProcessStage.BACKOFF, f"in {delay:g}s", announce=False)
            self._event(
                f"{member.spec.label}: restarting in {delay:g}s "
                f"(restart {member.failures_in_row} of at most {self.config.max_restarts} in a row)"
            )
            if await self._until_stopped(delay):
                return
            member.restarts += 1

    async def _start(self, member: _Member) -> None:
        member.log_offset = member.log_path.stat().st_size if member.log_path.exists() else 0
        member.process = await spawn(member.spec, member.log_path)
        member.started_at = time.monotonic()
        member.ready_at = None
        member.history = []
        self._set_stage(member, ProcessStage.STARTING, f"pid {member.process.pid}")

    async def _watch(self, member: _Member) -> str:
        """Follow one attempt until it exits ("exited"), misses the start-up deadline ("timeout") or stop."""
        process = member.process
        assert process is not None and member.started_at is not None
        watch = StartupWatch(
            self.config.startup_timeout_s, self.config.probe_timeout_s, self.config.poll_interval_s
        )

        def seen(reading: Readiness) -> None:
            self._set_stage(member, reading.stage, reading.detail)
            if reading.stage is StartupStage.READY:
                member.ready_at = time.monotonic()

        outcome = await wait_until_ready(
            process,
            member.spec.url,
            member.spec.health_path,
            watch,
            started_at=member.started_at,
            on_reading=seen,
            stop=self._stop,
        )
        if outcome.result != "ready":
            return outcome.result
        await self._first_of(process.wait(), self._stop.wait())
        return "stop" if self._stop.is_set() else "exited"

    # ----- the fleet ------------------------------------------------------------------------------------------
    async def _coordinate(self, group: asyncio.TaskGroup) -> None:
        announced = False
        started = time.monotonic()
        while not self._stop.is_set():
            await self._first_of(self._changed.wait(), self._stop.wait())
            self._changed.clear()
            if self._stop.is_set():
                return
            stages = [m.stage for m in self._servers]
            ready = [m.spec.url for m in self._servers if m.stage == StartupStage.READY]
            if all(stage == ProcessStage.FAILED for stage in stages):
                if announced:
                    self._publish([], "servers")
                    self._event("every server has failed: nothing left to supervise; stopping")
                else:  # the start's outcome, as a started fleet's would be shown
                    self._event(
                        "every server has failed: nothing left to supervise; stopping\n"
                        + startup_text(self._starts())
                    )
                self._result = EXIT_ALL_FAILED
                self._stop.set()
                return
            if not announced and all(stage in (StartupStage.READY, ProcessStage.FAILED) for stage in stages):
                announced = True
                self._announce(len(ready), time.monotonic() - started)
                if self._router is not None:
                    self._router_started = True
                    group.create_task(self._keep_running(self._router))
            if not announced:
                continue
            if self._router is None:
                self._publish(ready, "servers")
            elif self._router.stage == StartupStage.READY:
                self._publish([self._router.spec.url], "router")
            elif self._router.stage == ProcessStage.FAILED:
                self._publish(ready, "servers (the router failed)")

    def _announce(self, ready: int, elapsed: float) -> None:
        total = len(self._servers)
        failed = [m.spec.label for m in self._servers if m.stage == ProcessStage.FAILED]
        message = f"{ready} of {total} servers ready after {elapsed:.1f}s"
        if failed:
            message += f"; failed: {', '.join(failed)}"
        self._event(message + ". Ctrl-C stops every server.\n" + startup_text(self._starts()))

    def _starts(self) -> list[ServerStart]:
        return [m.summary() for m in self._servers]

    def _publish(self, urls: list[str], what: str) -> None:
        if urls == self._last_written:
            return
        path = self.config.run_dir / SERVERS
        try:
            write_servers_yaml(path, urls, self.config.served_model)
        except OSError as exc:
            self._event(f"cannot write {path}: {exc.strerror or exc}; the servers keep running")
            return
        self._last_written = list(urls)
        self._event(f"wrote {path}: {what} {', '.join(urls) or '(none ready)'}")

    async def _refresh(self) -> None:
        interval = max(self.config.poll_interval_s, 0.5)
        while not await self._until_stopped(interval):
            self.view.refresh(self._rows())

    async def _stop_all(self) -> None:
        running = [m for m in self._members() if m.process is not None]
        alive = [m for m in running if m.process is not None and m.process.returncode is None]
        if alive:
            self._event(
                f"stopping {len(alive)} process group(s): SIGTERM, SIGKILL after {self.config.stop_grace_s:g}s"
            )
        await asyncio.gather(
            *(stop_group(m.process, self.config.stop_grace_s) for m in running if m.process is not None)
        )
        for member in alive:
            self._set_stage(member, ProcessStage.STOPPED, announce=False)
        self.view.close(self._rows())
        if alive:
            self._event("every server stopped")
