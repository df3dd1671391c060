"""The one start-up watch of a spawned server, shared by ``draftgen serve`` (supervisor) and ``draftgen tune``
(launch): probe its health endpoint until it answers 200, it exits, the start-up deadline passes, or a stop is
asked. Each probe's answer is told to ``on_reading`` as it comes (serve shows it; tune keeps the last one)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from draftgen.client import introspect
from draftgen.client.introspect import Readiness, StartupStage
from draftgen.client.server import ServerClient


@dataclass(frozen=True)
class StartupWatch:
    """How long a start may take, how long one probe may wait for its answer, and how often to ask."""

    timeout_s: float
    probe_timeout_s: float
    poll_interval_s: float


@dataclass(frozen=True)
class StartupOutcome:
    result: str  # "ready", "exited", "timeout" or "stop"
    last: Readiness | None = None  # the last probe's answer (None: never probed)

    @property
    def last_stage(self) -> str:
        return self.last.stage.value if self.last is not None else "starting"


def _ignore(_: Readiness) -> None:
    return None


async def _first_of(
    process: asyncio.subprocess.Process, stop: asyncio.Event | None, timeout_s: float
) -> None:
    """Wait until the process exits, a stop is asked, or ``timeout_s`` passes, whichever comes first."""
    tasks = [asyncio.ensure_future(process.wait())]
    if stop is not None:
        tasks.append(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _launched_by(process: asyncio.subprocess.Process, pid: int) -> bool:
    """``pid`` is the spawned process or runs in its process group (spawn gives each server a session of its own)."""
    if pid == process.pid:
        return True
    try:
        return os.getpgid(pid) == process.pid
    except OSError:  # gone, or not a process of this machine
        return False


async def _unless_another_answers(
    client: ServerClient, process: asyncio.subprocess.Process, ready: Readiness, timeout_s: float
) -> Readiness:
    """A simulated server says which process it is; a 200 from another one is not this start's readiness (the watch
    keeps asking, and the started process exits 'port in use'). SGLang does not say, so its 200 stands."""
    pid = await introspect.simulator_pid(client, timeout_s)
    if pid is None or _launched_by(process, pid):
        return ready
    return Readiness(StartupStage.ERROR, f"another process (pid {pid}) answers on this port")


async def wait_until_ready(
    process: asyncio.subprocess.Process,
    url: str,
    health_path: str,
    watch: StartupWatch,
    *,
    started_at: float,
    on_reading: Callable[[Readiness], None] = _ignore,
    stop: asyncio.Event | None = None,
) -> StartupOutcome:
    """Probe ``url + health_path`` until ready; ``started_at`` (``time.monotonic()``) is when the process began."""
    deadline = started_at + watch.timeout_s
    last: Readiness | None = None
    async with ServerClient(url) as client:
        while True:
            if stop is not None and stop.is_set():
                return StartupOutcome("stop", last)
            if process.returncode is not None:
                return StartupOutcome("exited", last)
            remaining = deadline - time.monotonic()
            if remaining <= 0 and last is not None:  # probed at least once: a timeout names the stage it saw
                return StartupOutcome("timeout", last)
            probe_timeout = min(watch.probe_timeout_s, max(remaining, 0.5))
            reading = await introspect.startup_stage(client, health_path, probe_timeout)
            if process.returncode is not None or (stop is not None and stop.is_set()):
                continue  # an answer from a process that has gone says nothing
            if reading.stage is StartupStage.READY:
                reading = await _unless_another_answers(client, process, reading, probe_timeout)
            last = reading
            on_reading(reading)
            if reading.stage is StartupStage.READY:
                return StartupOutcome("ready", last)
            await _first_of(process, stop, min(watch.poll_interval_s, max(remaining, 0.05)))
