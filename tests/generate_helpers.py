"""Helpers for the generate tests: a stored completion row, the ``draftgen run generate`` command line, and
generate's ``run(config)`` (what generate.ipynb's cell calls) in a plain client process or in this one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from draftgen.defaults import MODEL
from draftgen.generate.config import GenerateConfig
from draftgen.generate.step import GenerateResult, run
from draftgen.params import build_config

URL = "http://127.0.0.1:9"


def finished_run(config: GenerateConfig, rows: int = 10, tokens: int = 1000) -> Path:
    """A complete run folder of ``rows`` stored rows of ``tokens`` each, written by RunStore with no server; returns
    its manifest's path (for tests that then set the session's times)."""
    from draftgen.generate.store import RunStore

    with RunStore.open(config) as store:
        for index in range(rows):
            store.add(row(f"p{index}", tokens=tokens))
        store.close("complete")
    return Path(config.out_dir) / "manifest.json"


def row(prompt_id: str, tokens: int = 5) -> dict:
    """One completed prompt as generate stores it (for RunStore tests that need no server)."""
    return {
        "id": prompt_id,
        "messages": [{"role": "user", "content": "q " + prompt_id}],
        "reasoning_content": "thought",
        "content": "answer",
        "finish_reason": "stop",
        "prompt_tokens": 3,
        "completion_tokens": tokens,
        "spec_accept_length": None,
        "spec_verify_ct": None,
        "server": URL,
        "latency_s": 0.1,
        "attempts": 1,
        "response_id": "r-" + prompt_id,
        "started_at": 1.0,
        "usage_reported": True,
        "ttft_s": None,
        "source_row": 1,
    }


def run_command(out_root: Path, name: str, params: dict, *extra: str) -> list[str]:
    """``python -m draftgen run generate --name NAME --out-root ROOT -p KEY VALUE ...`` as an argv list."""
    command = [
        sys.executable,
        "-m",
        "draftgen",
        "run",
        "generate",
        "--name",
        name,
        "--out-root",
        str(out_root),
    ]
    for key, value in params.items():
        command += ["-p", key, json.dumps(value) if not isinstance(value, str) else value]
    return [*command, *extra]


# ----- generate's run(config) without a kernel ----------------------------------------------------------------
# A test whose claim is about the run (what a SIGKILLed client leaves, what its resume sends) runs the function the
# notebook's cell calls in a plain process, and resumes it in the test's own: a notebook run costs a kernel and
# `draftgen run` around it (about 5 CPU-seconds); the notebook itself is tested in tests/test_generate_notebook.py.
CLIENT = """
import asyncio, json, sys
from draftgen.generate.config import GenerateConfig
from draftgen.generate.step import run
from draftgen.params import build_config
asyncio.run(run(build_config(GenerateConfig, json.loads(sys.argv[1])), show=lambda shown: None))
"""


def generate_config(out_dir: Path, params: dict) -> GenerateConfig:
    """The config ``draftgen run generate -p ...`` would build: the notebook's model, ``params``, ``out_dir``."""
    return build_config(GenerateConfig, {"model": MODEL, **params, "out_dir": str(out_dir)})


def generate_here(out_dir: Path, params: dict, shown: list | None = None) -> GenerateResult:
    """generate's ``run(config)`` in this process (a resume when ``out_dir`` holds a run); what it shows is
    appended to ``shown``."""
    return asyncio.run(
        run(generate_config(out_dir, params), show=(shown if shown is not None else []).append)
    )


def start_client(out_dir: Path, params: dict) -> subprocess.Popen:
    """generate's ``run(config)`` in a client process of its own (its own session, so a kill reaches only it)."""
    config = generate_config(out_dir, params).model_dump(mode="json")
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=os.environ.copy(),
    )


def wait_for_shards(run_dir: Path, count: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``count`` shards are stored in ``run_dir`` (fails if ``proc`` ends first)."""
    deadline = time.monotonic() + timeout
    while len(list((run_dir / "shards").glob("part-*.parquet"))) < count:
        if proc.poll() is not None:
            raise AssertionError(
                f"run ended before {count} shards:\n{proc.stdout.read() if proc.stdout else ''}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} shards after {timeout} s")
        time.sleep(0.05)


def kill_client(proc: subprocess.Popen) -> float:
    """SIGKILL the client (no flush, no goodbye) and reap it; when it was killed (time.time())."""
    proc.send_signal(signal.SIGKILL)
    killed_at = time.time()
    proc.communicate(timeout=60)
    return killed_at


def sigkill_client_after_shards(out_dir: Path, params: dict, shards: int) -> float:
    """Start a client on ``out_dir``, SIGKILL it once ``shards`` shards are stored; when it was killed."""
    proc = start_client(out_dir, params)
    try:
        wait_for_shards(out_dir, shards, proc)
        return kill_client(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
