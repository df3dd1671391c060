"""Run ``draftgen serve --engine sglang`` as a subprocess for the tests, the way an operator runs it.

Each run is serve itself (from the project's venv) supervising one real SGLang server, started through
``support/sglang-python`` so SGLang runs on this CPU. serve runs in its own session with PR_SET_PDEATHSIG, so it
stops its servers if the test process dies; ``stop()`` sends it a signal like Ctrl-C and, whatever happens,
leaves no process behind (every descendant is collected with psutil first and killed if still there after the
grace period). Readiness is a 200 from the server's ``/health``, within a time limit; a run that exits or never
gets there fails with serve's own output and the tail of the server's log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SUPPORT = Path(__file__).resolve().parent
SGLANG_PYTHON = SUPPORT / "sglang-python"
SLOW_DIR = "slow"  # beside the serve runs: the flag files of ServeRun.slowed
# What SGLang needs on these CPUs, after serve's own flags (serve adds --reasoning-parser qwen3 --enable-metrics).
CPU_ARGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "intel_amx",  # kept by sitecustomize.py; our stand-in provides its two ops
    # On the CPU SGLang sizes memory from the machine's available memory (psutil), so memory other processes take
    # while a server loads counts as its weights: at 0.3, starts beside others on a shared machine failed with
    # "Loaded weights leave no GPU memory for the KV cache" (speculation needs > 0.101 in any case). The KV cache
    # itself is capped by --max-total-tokens, so the high fraction allocates nothing more.
    "--mem-fraction-static",
    "0.9",
    "--max-total-tokens",
    "8192",
    "--skip-server-warmup",
    "--sleep-on-idle",  # an idle scheduler otherwise polls flat out: three of them starve a restart on 2 cores
)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# SGLang picks its internal (torch.distributed) ports in 22000-29999
SGLANG_OWN_INTERNAL_FROM, SGLANG_OWN_PORTS_BELOW = 22000, 30000
_handed_out: set[int] = set()
_handing_out = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _can_listen(port: int) -> bool:
    """Whether a server could bind ``port`` now (with SO_REUSEADDR, as servers bind: TIME_WAIT is no obstacle)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1) -> int:
    """A port P with P .. P + count - 1 free for servers to listen on later (tune's GPU groups listen on
    base_port + i), never handed out before in this process.

    Below the kernel's ephemeral range, where no client connection's own port can take one before its server
    binds it: a tune candidate once failed to start ("address already in use") on a port the OS had given a
    client connection meanwhile. Above SGLang's own internal ports (below them if the ephemeral range leaves no
    room). Production's default base port (30000) is in the same band."""
    low, high = SGLANG_OWN_PORTS_BELOW, _ephemeral_low() - count
    if high <= low:
        low, high = 10000, SGLANG_OWN_INTERNAL_FROM - count
    with _handing_out:
        for _ in range(500):
            port = random.randint(low, high)
            run = range(port, port + count)
            if not _handed_out & set(run) and all(map(_can_listen, run)):
                _handed_out.update(run)
                return port
    raise RuntimeError(f"no {count} consecutive free ports for servers in {low}-{high + count - 1}")


def http_status(url: str, timeout: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return None


class ServeError(RuntimeError):
    """serve or its server did not get where a test needed it; the message quotes both outputs."""


@dataclass
class ServeRun:
    """One ``draftgen serve`` process and the single SGLang server it supervises."""

    name: str
    model: Path
    port: int
    run_dir: Path
    output_path: Path  # serve's own stdout and stderr
    process: subprocess.Popen
    command: list[str]
    started: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_log(self) -> Path:
        return self.run_dir / f"server-{self.port}.log"

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    @property
    def slow_flag(self) -> Path:
        """While this file exists, the server runs (its number + 1) times slower (support/sitecustomize.py)."""
        return self.run_dir.parent / SLOW_DIR / str(self.port)

    def slow_to(self, factor: float) -> None:
        """From the next pause on, ``factor`` + 1 times slower than itself (a huge factor holds it still)."""
        self.slow_flag.parent.mkdir(parents=True, exist_ok=True)
        self.slow_flag.write_text(f"{factor}\n")

    @contextmanager
    def slowed(self, factor: float) -> Iterator[None]:
        """The server ``factor + 1`` times slower than itself for the block's duration, at any machine speed."""
        self.slow_to(factor)
        try:
            yield
        finally:
            self.slow_flag.unlink(missing_ok=True)

    def describe(self, lines: int = 40) -> str:
        try:
            tail = "\n".join(self.server_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            tail = "(no server log yet)"
        return (
            f"$ {' '.join(self.command)}\n--- serve output ---\n{self.output()}\n"
            f"--- last {lines} lines of {self.server_log} ---\n{tail}"
        )

    def launchers(self) -> list[psutil.Process]:
        """The live ``sglang.launch_server`` processes serve started (serve's direct children)."""
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "sglang.launch_server" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child)
        return found

    def wait_ready(self, timeout_s: float) -> float:
        """Until the server's /health answers 200 (serve still running); seconds since serve started."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServeError(
                    f"{self.name}: serve exited with code {self.process.returncode}\n{self.describe()}"
                )
            if http_status(self.url + "/health") == 200:
                self.ready_after_s = time.monotonic() - self.started
                return self.ready_after_s
            time.sleep(1.0)
        raise ServeError(
            f"{self.name}: no 200 on {self.url}/health within {timeout_s:.0f} s\n{self.describe()}"
        )

    def wait_output(self, text: str, timeout_s: float, after: str | None = None) -> str:
        """Until serve's output contains ``text`` (after the first ``after``, when given); serve's own reporting
        is what such tests check. Returns the output from there on."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            output = self.output()
            if after is not None:
                output = output.partition(after)[2]
            if text in output:
                return output
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        where = f" after {after!r}" if after else ""
        raise ServeError(f"{self.name}: serve never printed {text!r}{where}\n{self.describe()}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 60.0) -> list[psutil.Process]:
        """Signal serve like an operator; return the processes still alive after it exited (killed then)."""
        family = self.descendants()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _, alive = psutil.wait_procs(family, timeout=2.0)
        left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        return left


def start_serve(
    draftgen: str,
    name: str,
    model: Path,
    runs: Path,
    server_args: tuple[str, ...] = (),
    serve_args: tuple[str, ...] = (),
    dtype: str = "bfloat16",
    settings: Path | None = None,
    env: dict[str, str] | None = None,
    mtp: bool = False,
) -> ServeRun:
    """``draftgen serve --engine sglang --python support/sglang-python --model MODEL --gpus 0 ... -- CPU ARGS``.

    Speculation comes from the CPU args (``--no-mtp``: serve's default MTP flags need the target's MTP heads), from
    ``settings``: ``--settings FILE``, a file ``draftgen tune`` wrote, or, with ``mtp``, is serve's own default
    (NEXTN with the model's MTP head, as on the GPU node). ``env``: more environment for serve and so for its
    server (e.g. ``DRAFTGEN_SGLANG_CHILDREN``)."""
    port = free_ports()
    if settings is not None:
        speculation = ["--settings", str(settings)]
    else:
        speculation = [] if mtp else ["--no-mtp"]
    command = [
        draftgen,
        "serve",
        "--engine",
        "sglang",
        "--python",
        str(SGLANG_PYTHON),
        "--model",
        str(model),
        "--gpus",
        "0",  # one server; CUDA_VISIBLE_DEVICES=0 means nothing to a CPU server
        "--base-port",
        str(port),
        *speculation,
        "--out",
        str(runs),
        "--run",
        name,
        "--plain",
        "--timeout",
        "600",
        *serve_args,
        "--",
        *CPU_ARGS,
        "--dtype",
        dtype,
        *server_args,
    ]
    runs.mkdir(parents=True, exist_ok=True)
    output_path = runs / f"{name}.serve.out"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DRAFTGEN_SGLANG_SLOW_DIR": str(runs / SLOW_DIR),  # ServeRun.slowed
        **(env or {}),
    }
    with output_path.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return ServeRun(name, model, port, runs / name, output_path, process, command)
