"""serve's check of SGLang's environment against the real one: the tier's SGLang 0.5.23 (its openai==2.8.0 pin
kept) passes, draftgen's own environment (no SGLang) is refused naming the fix, both in seconds and before a server
starts. The check's other answers (SGLang's environment with draftgen's openai in it) are tests/test_two_environments.py.

The passing start is stopped by the next check instead of starting a server: its port is held here, so serve ends
at "port ... already in use" (exit 3, refused), which it reaches only past the environment's check.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from serve_runs import SGLANG_PYTHON, free_ports


def _serve(
    draftgen: str, python: str, model: Path, port: int, out: Path
) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "DRAFTGEN_SGLANG_PYTHON"}
    started = time.perf_counter()
    done = subprocess.run(
        [
            *(draftgen, "serve", "--model", str(model), "--gpus", "0", "--base-port", str(port)),
            *("--python", python, "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return done, time.perf_counter() - started


def test_sglangs_environment_passes_and_draftgens_is_refused(draftgen, tmp_path) -> None:
    port = free_ports(1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        done, took = _serve(draftgen, str(SGLANG_PYTHON), tmp_path, port, tmp_path / "a")
        assert done.returncode == 3 and took < 30, done.stderr  # refused: nothing started
        assert f"port {port} on 127.0.0.1 already in use" in done.stderr, done.stderr  # past the environment

        own = str(Path(draftgen).with_name("python"))  # draftgen's environment: no SGLang there
        done, took = _serve(draftgen, own, tmp_path, port, tmp_path / "b")
    assert done.returncode == 3 and took < 30, done.stderr  # refused: nothing started
    assert (
        f"this Python ({own}, draftgen's environment) has no sglang" in done.stderr
        and "pass --python /path/to/sglang-env/bin/python" in done.stderr
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
