"""Fixtures of the real-server tier (``make test-real``): one tiny model, one vLLM and one transformers-serve server.

* ``tiny_model`` — a random-weight Qwen3 folder with draftgen's tiny tokenizer and chat template (seconds).
* ``real_servers`` — {"vllm": ..., "transformers": ...}: both servers started at once on free ports (vLLM's CPU
  build with n-gram speculative decoding and the qwen3 reasoning parser; ``transformers serve`` pinned to the
  model), waited for with a time limit (the error quotes the server's log), and stopped as process groups at the
  end of the session, pass or fail.
* ``recording_proxy`` — a factory: ``proxy = recording_proxy(server)`` puts a pass-through proxy in front of a
  server that records every exchange; closed when the test ends.
* ``generate_run`` — generate.ipynb run once (``draftgen run``) against both servers through recording proxies,
  with vLLM's /metrics scraped before and after; the generate and validate tests read it.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from machine_lock import hold_for_test_session
from notebook_runs import draftgen_run
from real_servers import RealServer, ServerStartError, start_server, stop_server, wait_ready
from recording_proxy import RecordingProxy
from tiny_model import build_tiny_qwen3

from draftgen.prompts.rows import PromptRow, iter_prompts
from draftgen.prompts.synthetic import BUNDLED_PROMPTS, LONG_CHAT

# vLLM took 30-80 s to start here (loaded machine), transformers serve 7-12 s: generous limits, clear failures.
READY_TIMEOUT_S = {"vllm": float(os.environ.get("REAL_VLLM_START_S", "600")), "transformers": 300.0}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Wait for another real-server tier on this machine (another clone's, or SGLang's) to end: machine_lock.py."""
    hold_for_test_session(session)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("model") / "tiny-qwen3")


@pytest.fixture(scope="session")
def real_servers(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RealServer]]:
    log_dir = tmp_path_factory.mktemp("server-logs")
    started: dict[str, RealServer] = {}
    try:
        for engine in ("vllm", "transformers"):
            started[engine] = start_server(engine, tiny_model, log_dir)
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(started)) as pool:
            waits = {e: pool.submit(wait_ready, s, READY_TIMEOUT_S[e]) for e, s in started.items()}
            problems = []
            for future in waits.values():
                try:
                    future.result()
                except ServerStartError as exc:
                    problems.append(str(exc))
        if problems:
            raise ServerStartError("\n\n".join(problems))
        print(
            "\nreal servers ready: "
            + ", ".join(f"{e} {s.url} after {s.ready_after_s:.0f} s" for e, s in started.items())
            + f" (both within {time.monotonic() - t0:.0f} s)"
        )
        yield started
    finally:
        for server in started.values():
            stop_server(server)


@pytest.fixture(scope="session")
def vllm_server(real_servers: dict[str, RealServer]) -> RealServer:
    return real_servers["vllm"]


@pytest.fixture(scope="session")
def transformers_server(real_servers: dict[str, RealServer]) -> RealServer:
    return real_servers["transformers"]


@pytest.fixture
def recording_proxy() -> Iterator[Callable[[RealServer], RecordingProxy]]:
    made: list[RecordingProxy] = []

    def make(server: RealServer) -> RecordingProxy:
        proxy = RecordingProxy(server.url)
        made.append(proxy)
        proxy.start()
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


# ----- one generate.ipynb run against both servers, shared by the generate and validate tests --------------------
GENERATE_LIMIT = 24


@dataclass
class GenerateRun:
    run_dir: Path
    params: dict
    proxies: dict[
        str, RecordingProxy
    ]  # engine → the proxy the notebook talked to (its URL is the row's server)
    vllm_metrics_before: str
    vllm_metrics_after: str
    expected_ids: list[str]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        return reply.read().decode()


def fitting_bundled_rows(count: int) -> list[dict]:
    """The bundled set's first ``count`` rows that fit the tiny servers' 2,048-token context: its long multi-turn
    chats do not (a server refuses such a prompt with a 400 and generate fails it with the server's reason, as
    tests/test_generate_multiturn.py checks on the simulator), and these tests check what the servers answered."""
    rows = (json.loads(line) for line in BUNDLED_PROMPTS.read_text().splitlines())
    return [row for row in rows if row.get("category") != LONG_CHAT][:count]


@pytest.fixture(scope="session")
def generate_run(
    real_servers: dict[str, RealServer], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GenerateRun]:
    """generate.ipynb over 24 synthetic prompts on one vLLM and one transformers-serve server at once.

    Thinking off: a random model never closes </think>, so with thinking on every completion would be reasoning
    cut at max_tokens. The garbage guard stays on with its production thresholds except max_truncated_rate: a
    random model rarely emits <|im_end|> before max_tokens, so nearly every row is truncated by design.
    """
    proxies = {engine: RecordingProxy(server.url) for engine, server in real_servers.items()}
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    fitting = fitting_bundled_rows(GENERATE_LIMIT)
    prompts.write_text("".join(json.dumps(row) + "\n" for row in fitting))
    try:
        for proxy in proxies.values():
            proxy.start()
        params = {
            "servers": [proxies["vllm"].url, proxies["transformers"].url],
            "model": str(tiny_model),
            "prompts": str(prompts),
            "max_tokens": 48,
            "enable_thinking": False,
            "stream": True,
            "concurrency_per_server": 4,
            "batch_save_size": 8,
            "request_timeout_s": 300.0,
            "guard_window": GENERATE_LIMIT,
            "guard_min_results": 20,  # one stray empty answer (a sampled <|im_end|> first) is 5%: not above
            "max_truncated_rate": 1.0,
            "progress_interval_s": 5.0,
            # No tail hedging: the tests compare vLLM's token counters with the answers stored, and a cancelled
            # copy generates tokens no stored row accounts for (hedging has its own test, on the simulator).
            "hedge_slow_ratio": 0.0,
        }
        before = scrape(real_servers["vllm"].url)
        run_dir = draftgen_run("generate", tmp_path_factory.mktemp("runs"), "real", params)
        after = scrape(real_servers["vllm"].url)
        expected = [r.id for r in iter_prompts(prompts) if isinstance(r, PromptRow)]
        assert len(expected) == GENERATE_LIMIT
        yield GenerateRun(run_dir, params, proxies, before, after, expected)
    finally:
        for proxy in proxies.values():
            proxy.stop()
