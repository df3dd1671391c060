"""SMG, SGLang's gateway, in front of two real SGLang 0.5.23 servers: per-request acceptance survives it.

The gateway is the command ``draftgen serve --router`` prints (read from its ``--dry-run``, so this is the line
serve runs), started from the project's venv (where the pinned ``smg`` lives) in front of the tier's shared
``ngram`` and ``standalone`` servers, which serve the same random model. A chat through it is answered by each
worker in turn (``round_robin``) with the worker's own ``sglext.spec_tokens_details`` and the same greedy answer
as the worker gives directly.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from chat import chat
from serve_runs import free_ports
from tier_runs import SERVED_MODEL

PROMPT = "Tell me something about the weather today."
TOKENS = 16
READY_S = 120.0  # a wait for SMG to register both workers, never a measured bound


def _gateway_argv(draftgen: str, first: int, second: str, port: int) -> tuple[dict[str, str], list[str]]:
    """SMG's command as ``draftgen serve --router --dry-run`` prints it for these two workers: the environment
    it sets first (``PYTHONUNBUFFERED=1``), then the command line."""
    python = str(Path(draftgen).with_name("python"))
    dry = subprocess.run(
        [
            *(draftgen, "serve", "--engine", "sim", "--gpus", "0", "--base-port", str(first)),
            *("--router", "--router-port", str(port), "--router-policy", "round_robin"),
            *("--router-worker", second, "--python", python, "--dry-run"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    words = shlex.split(dry.stdout.strip().splitlines()[-1])
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[1:4] == ["-m", "smg", "launch"], words
    return env, words


@pytest.fixture(scope="module")
def gateway(fleet, draftgen: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_ports(2)
    env, argv = _gateway_argv(draftgen, fleet.ngram.port, fleet.standalone.url, port)
    log = tmp_path_factory.mktemp("smg") / "smg.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            assert process.poll() is None, log.read_text(errors="replace")
            try:
                workers = requests.get(f"{url}/workers", timeout=5).json()["workers"]
                if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def test_a_chat_through_smg_keeps_each_real_workers_sglext(gateway: str, fleet) -> None:
    # SMG routes by the name its workers serve (--served-model-name); SGLang itself answers any name
    model = SERVED_MODEL
    assert requests.get(f"{gateway}/readiness", timeout=10).json()["healthy_workers"] == 2
    listed = {w["url"] for w in requests.get(f"{gateway}/workers", timeout=10).json()["workers"]}
    assert listed == {fleet.ngram.url, fleet.standalone.url}

    def ask(url: str) -> dict:
        return chat(
            url,
            model,
            PROMPT,
            thinking=False,
            max_tokens=TOKENS,
            return_spec_tokens_details=True,
            ignore_eos=True,
        )

    direct = ask(fleet.ngram.url)["choices"][0]["message"]["content"]
    through = [ask(gateway) for _ in range(2)]  # round_robin: one answer from each worker
    for reply in through:
        assert reply["usage"]["completion_tokens"] == TOKENS
        assert reply["choices"][0]["message"]["content"] == direct  # greedy: the same answer on both
        details = reply["sglext"]["spec_tokens_details"]  # the worker's own, through the gateway
        assert details["spec_verify_ct"] >= 1
        assert details["spec_accept_length"] == pytest.approx(TOKENS / details["spec_verify_ct"])
