"""A fleet of simulated servers, one OS process each, so one can be killed or restarted alone."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.defaults import MODEL
from draftgen.exit_codes import Refused
from draftgen.sglang_rules.parsers import DEFAULT_FAMILY, TOOL_CALL_PARSER
from draftgen.sim.defaults import EXIT_PORT_IN_USE, NO_CA_STORE, PARENT_PID_ENV
from draftgen.sim.faults import parse_faults
from draftgen.sim.profiles import get_profile
from draftgen.sim.tokenizer import SimTokenizer, TokenizerFolderError, default_tokenizer


class FleetError(RuntimeError):
    """A server could not be started; the message names it and quotes its log."""


class PortInUse(FleetError, Refused):
    """A server's port was taken by another process (exit code REFUSED)."""


PORT_PICKS = 5  # base ports a fleet that picks its own tries before giving up


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on ``port`` now. Like the servers, binds with SO_REUSEADDR, so a port
    whose last connections linger in TIME_WAIT (a fleet just stopped) counts as free; a listener does not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux default 32768-60999)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


# Where fleets pick ports by default: below SGLang's own internal ports (22000-29999) and the 30000 band where
# `draftgen serve` (and the SGLang tier) listen, so a fleet never takes a port a slower-starting server picked
# first and has not bound yet; the tiers that run beside the suite pick elsewhere (tests_real: REAL_PORTS).
FLEET_PORTS = (10_000, 22_000)


def find_free_base_port(
    count: int, low: int = FLEET_PORTS[0], high: int = FLEET_PORTS[1], attempts: int = 200
) -> int:
    """A base port P such that P..P+count-1 are all free now.

    Ports in the kernel's ephemeral range are avoided when the range leaves room: a health poll to a port there
    that nobody listens on yet can be given that same port as its source and connect to itself (TCP simultaneous
    open), reading its own request back as the answer ("BadStatusLine: GET /health HTTP/1.1").
    """
    ephemeral_low, ephemeral_high = ephemeral_port_range()
    if ephemeral_low - low > count * 50:
        high = min(high, ephemeral_low)
    elif ephemeral_high + 1 < high and high - (ephemeral_high + 1) > count * 50:
        low = max(low, ephemeral_high + 1)
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(low, high - count)
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise FleetError(f"no run of {count} free ports found between {low} and {high}")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when the connection is refused or times out."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError):
        return None


def _json(url: str, timeout: float = 5.0) -> dict:
    """A GET's JSON object ({} when there is none: refused, an error status, or not JSON)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


KILL_WAIT_S = 60.0  # SIGKILL cannot be refused; this only bounds how long reaping may take under load


@dataclass
class SimFleet:
    """Start with ``with SimFleet(servers=7) as fleet: fleet.urls ...`` or ``fleet.start()`` / ``fleet.stop()``."""

    servers: int = 7
    base_port: int | None = None
    profile: str = "b200-mtp"
    speed: float = 1.0
    faults: Sequence[str] = ()
    per_server_faults: Mapping[int, Sequence[str]] = field(default_factory=dict)
    model: str = MODEL
    seed: int = 0
    max_running_requests: int | None = None
    # SGLang flags every server gets, e.g. ("--speculative-num-steps", "2", ...)
    server_args: Sequence[str] = ()
    work_dir: Path | None = None  # truth files and logs; a temporary folder when None
    host: str = "127.0.0.1"
    # The servers' tokenizer folder (their ids, prompt_tokens, completion_tokens); None: the tiny Qwen3-format
    # tokenizer, built once into work_dir/tokenizer when the fleet starts.
    tokenizer: Path | None = None
    # --tool-call-parser, as `draftgen serve` starts the target's family (sglang_rules.parsers); None: no parser,
    # SGLang's default (tool calls stay text in content).
    tool_call_parser: str | None = TOOL_CALL_PARSER[DEFAULT_FAMILY]
    _procs: dict[int, subprocess.Popen] = field(default_factory=dict, init=False, repr=False)
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ValueError("servers must be >= 1")
        get_profile(self.profile)  # raises with the list of valid profiles
        parse_faults(list(self.faults))
        for specs in self.per_server_faults.values():
            parse_faults(list(specs))
        if self.speed <= 0:
            raise ValueError("speed must be > 0")

    # ----- addresses and files ----------------------------------------------------------------------------
    def port(self, index: int) -> int:
        assert self.base_port is not None, "fleet not started"
        return self.base_port + index

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{self.port(i)}" for i in range(self.servers)]

    @property
    def directory(self) -> Path:
        assert self.work_dir is not None, "fleet not started"
        return self.work_dir

    def truth_path(self, index: int) -> Path:
        return self.directory / f"truth-{self.port(index)}.jsonl"

    def log_path(self, index: int) -> Path:
        return self.directory / f"server-{self.port(index)}.log"

    # ----- lifecycle ------------------------------------------------------------------------------------
    def start(self, wait: str = "healthy", timeout: float = 60.0) -> SimFleet:
        """Spawn every server. ``wait``: "healthy" (/health 200), "listening" (port open) or "none"."""
        if self.work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="draftgen-sim-")
            self.work_dir = Path(self._tmp.name)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.tokenizer is None:
            self.tokenizer = default_tokenizer(self.work_dir / "tokenizer")
        else:
            try:
                SimTokenizer.load(self.tokenizer)
            except TokenizerFolderError as exc:
                raise FleetError(str(exc)) from exc
        picked = self.base_port is None
        for attempt in range(1, PORT_PICKS + 1):
            if picked:
                self.base_port = find_free_base_port(self.servers)
            try:
                self._start_on_ports(wait, timeout)
                return self
            except PortInUse:
                # Free when picked, taken before our server bound it (another process picked it too): ports we
                # chose are chosen again; ports the caller named are the caller's to change.
                if not picked or attempt == PORT_PICKS:
                    raise
        raise AssertionError("unreachable")

    def _start_on_ports(self, wait: str, timeout: float) -> None:
        busy = [self.port(i) for i in range(self.servers) if not port_is_free(self.port(i), self.host)]
        if busy:
            raise PortInUse(f"port{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))} already in use")
        try:
            for index in range(self.servers):
                self._spawn(index)
            self.wait(wait, timeout)
        except BaseException:
            self.stop()
            raise

    def _command(self, index: int, extra_faults: Iterable[str] = ()) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "draftgen.sim.server",
            "--port",
            str(self.port(index)),
            "--host",
            self.host,
            "--profile",
            self.profile,
            "--speed",
            repr(self.speed),
            "--model",
            self.model,
            "--seed",
            str(self.seed),
            "--truth",
            str(self.truth_path(index)),
            "--die-with-parent",
            "--tokenizer",
            str(self.tokenizer),
        ]
        if self.max_running_requests:
            command += ["--max-running-requests", str(self.max_running_requests)]
        if self.tool_call_parser:
            command += ["--tool-call-parser", self.tool_call_parser]
        command += list(self.server_args)
        for spec in [*self.faults, *self.per_server_faults.get(index, ()), *extra_faults]:
            command += ["--fault", spec]
        return command

    def _spawn(self, index: int, extra_faults: Iterable[str] = ()) -> None:
        log = open(self.log_path(index), "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{PARENT_PID_ENV: str(os.getpid())}, **NO_CA_STORE)
        self._procs[index] = subprocess.Popen(
            self._command(index, extra_faults),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()

    def wait(
        self, until: str = "healthy", timeout: float = 60.0, indices: Iterable[int] | None = None
    ) -> None:
        if until == "none":
            return
        pending = set(range(self.servers) if indices is None else indices)
        deadline = time.monotonic() + timeout
        while pending:
            for index in sorted(pending):
                proc = self._procs[index]
                if proc.poll() is not None:
                    self._raise_exited(index, proc.returncode)
                path = "/health" if until == "healthy" else "/v1/models"
                status = http_status(f"{self.urls[index]}{path}", timeout=1.0)
                if status == 200:
                    self._check_own(index, proc)
                    pending.discard(index)
            if pending and time.monotonic() > deadline:
                names = ", ".join(str(self.port(i)) for i in sorted(pending))
                raise FleetError(f"simulated servers on port(s) {names} not {until} after {timeout:.0f}s")
            if pending:
                time.sleep(0.05)

    def _check_own(self, index: int, proc: subprocess.Popen) -> None:
        """The server answering on our port is the process we started, not another fleet's that bound the port
        first (two test workers picking the same free ports at once): ours then exits 'port in use', but until it
        does the other one answers, and a run would go to servers another test stops under it."""
        answering = _json(f"{self.urls[index]}/sim/info").get("pid")
        if answering != proc.pid:
            raise PortInUse(
                f"port {self.port(index)} already in use (another server, pid {answering}, answers)"
            )

    def _raise_exited(self, index: int, code: int) -> None:
        port = self.port(index)
        if code == EXIT_PORT_IN_USE:
            raise PortInUse(f"port {port} already in use")
        raise FleetError(
            f"simulated server on port {port} exited with code {code}:\n{_log_tail(self.log_path(index))}"
        )

    def alive(self, index: int) -> bool:
        proc = self._procs.get(index)
        return proc is not None and proc.poll() is None

    def returncode(self, index: int) -> int | None:
        proc = self._procs.get(index)
        return None if proc is None else proc.poll()

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one server (SIGKILL by default: a crash, not a shutdown)."""
        proc = self._procs[index]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def restart(
        self, index: int, wait: str = "healthy", timeout: float = 60.0, faults: Iterable[str] = ()
    ) -> None:
        """Bring one server back on the same port (after a kill or a crash), optionally with extra faults."""
        self.kill(index)
        deadline = time.monotonic() + 10
        while not port_is_free(self.port(index), self.host) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._spawn(index, faults)
        self.wait(wait, timeout, indices=[index])

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every server, then SIGKILL what is left: no orphans. On a loaded machine a killed process can
        take seconds to be reaped, so the wait after SIGKILL is long (it ends as soon as the process is gone)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self._procs.values():
            remaining = max(0.0, deadline - time.monotonic())
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=KILL_WAIT_S)
        self._procs.clear()

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SimFleet:
        if not self._procs:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # ----- ground truth -----------------------------------------------------------------------------------
    def truth(self, index: int | None = None) -> list[dict]:
        """Every record the server(s) wrote, across restarts (files are appended to)."""
        indices = range(self.servers) if index is None else [index]
        records: list[dict] = []
        for i in indices:
            path = self.truth_path(i)
            if path.exists():
                with open(path) as handle:
                    records.extend(json.loads(line) for line in handle if line.strip())
        return records

    def info(self, index: int = 0) -> dict:
        with urllib.request.urlopen(f"{self.urls[index]}/sim/info", timeout=5) as response:
            return json.load(response)
