"""vLLM's CPU build serving the converted SmolLM2 folder, started, awaited and stopped with the real-server tier's
own machinery (tests_real/real_servers.py: its own process group, a log file, SIGTERM then SIGKILL)."""

from __future__ import annotations

from pathlib import Path

from real_servers import REAL_PORTS, RealServer, launch, vllm_base_command

from draftgen.sim.fleet import find_free_base_port

MAX_MODEL_LEN = 4096  # SmolLM2's context is 8192; the tier's prompts and answers fit in far less


def vllm_command(model: Path, port: int) -> list[str]:
    """A ChatML model without reasoning or tool parsers; the rest as the real tier starts vLLM."""
    return vllm_base_command(model, port, max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=0.1)


def start_vllm(model: Path, log_dir: Path) -> RealServer:
    port = find_free_base_port(1, *REAL_PORTS)
    return launch("vllm", vllm_command(model, port), model, port, log_dir)
