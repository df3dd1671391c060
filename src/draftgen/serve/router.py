"""SMG, SGLang's gateway, as a child process on free ports, for tests and benchmarks (``draftgen serve --router``
runs the same command line under its supervisor), and the gateway's worker list.

``with RouterProcess(worker_urls, policy="round_robin") as router: router.url ...`` starts ``python -m smg launch``
in its own process group, waits until every worker is registered and healthy, and stops the whole group on exit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.client.server import METRICS_PATH, ServerClient
from draftgen.serve.launch import router_argv
from draftgen.sim.fleet import find_free_base_port

START_TIMEOUT_S = 60.0


class RouterError(RuntimeError):
    """The gateway did not come up; the message quotes its log."""


async def _gateway_workers(router_url: str, timeout_s: float) -> dict[str, bool]:
    async with ServerClient(router_url) as client:
        return await client.gateway_workers(timeout_s) or {}


def healthy_workers(router_url: str, timeout_s: float = 5.0) -> dict[str, bool]:
    """``GET /workers`` of a running gateway (the client's ``gateway_workers``): worker URL → healthy, empty when
    it does not answer. For synchronous callers (``RouterProcess``, tests, benchmarks), not from a running loop."""
    return asyncio.run(_gateway_workers(router_url, timeout_s))


@dataclass
class RouterProcess:
    workers: list[str]
    policy: str = "cache_aware"
    python: str = sys.executable
    log_dir: Path | None = None
    extra_args: tuple[str, ...] = ()
    port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}{METRICS_PATH}"

    def start(self, timeout_s: float = START_TIMEOUT_S, *, wait: bool = True) -> str:
        """Start SMG; with ``wait``, return once every worker is registered and healthy."""
        if not self.port:
            base = find_free_base_port(2)
            self.port, self.metrics_port = base, base + 1
        argv = router_argv(
            self.python,
            self.workers,
            host="127.0.0.1",
            port=self.port,
            metrics_port=self.metrics_port or self.port + 1,
            policy=self.policy,
        )
        self.metrics_port = self.metrics_port or self.port + 1
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="draftgen-router-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"router-{self.port}.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*argv, *self.extra_args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        if not wait:
            return self.url
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.stop()
                raise RouterError(f"SMG exited with code {code}:\n{self._tail()}")
            seen = healthy_workers(self.url)
            if len(seen) == len(self.workers) and all(seen.values()):
                return self.url
            time.sleep(0.2)
        self.stop()
        raise RouterError(f"SMG did not register {len(self.workers)} healthy workers:\n{self._tail()}")

    def _tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> RouterProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
