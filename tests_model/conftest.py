"""Fixtures of the real-model tier (``make test-model``): SmolLM2-135M-Instruct, a real small model, served by vLLM's
CPU build, and one generate → validate run over real prompts that the tests share.

* ``smollm2`` — the converted model folder (support/smollm2.py: converted once per machine, cached by digest).
* ``vllm_server`` — vLLM serving it, started once, stopped as a process group at the end, pass or fail.
* ``prompts_file`` — GENERATE_LIMIT real conversations with their own answers (support/corpus.py).
* ``pipeline`` — ``draftgen run generate`` (through a recording proxy, vLLM's /metrics read before and after) then
  ``draftgen run validate``, the way a user runs them, with production-shaped parameters (``generate_params``).

Like the other real-server tiers it takes the machine's tier lock first (tests_real/machine_lock.py).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "support"), str(HERE.parent / "tests_real")]

import pytest  # noqa: E402
from corpus import write_prompts  # noqa: E402
from machine_lock import hold_for_test_session  # noqa: E402
from notebook_runs import draftgen_run  # noqa: E402
from real_servers import RealServer, stop_server, wait_ready  # noqa: E402
from recording_proxy import RecordingProxy  # noqa: E402
from serve import start_vllm  # noqa: E402
from smollm2 import cached_smollm2  # noqa: E402

VLLM_START_S = 900.0
GENERATE_LIMIT = 40
TRAINER = "specforge-lfm"  # SpecForge's ChatML entry without a system prompt of its own: SmolLM2's template
TRAIN_MAX_LENGTH = 2048
HOLDOUT_SHARE = 0.2  # ~8 of the 40 prompts: enough held-out answers to evaluate a drafter on


def pytest_sessionstart(session: pytest.Session) -> None:
    hold_for_test_session(session)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return cached_smollm2()


@pytest.fixture(scope="session")
def vllm_server(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    server = start_vllm(smollm2, tmp_path_factory.mktemp("server-logs"))
    try:
        wait_ready(server, VLLM_START_S)
        print(f"\nvLLM ready at {server.url} after {server.ready_after_s:.0f} s")
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("prompts") / "chat.jsonl", GENERATE_LIMIT)


@dataclass
class PipelineRun:
    generate_dir: Path
    validate_dir: Path
    params: dict
    prompts: list[dict]
    proxy: RecordingProxy  # what went over the wire between generate and vLLM
    metrics_before: str
    metrics_after: str


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        return reply.read().decode()


def generate_params(server: RealServer, model: Path, prompts: Path) -> dict:
    """Production's shape (streamed, the loop check live, every turn of a conversation regenerated, each turn capped
    at the trainer's max_length with the model's own tokenizer) with what a 135M model on two cores needs: thinking
    off (it has none), greedy decoding (T=0: a small model loops, the loop check's real case), max_tokens 1024."""
    return {
        "servers": [server.url],
        "model": str(model),
        "prompts": str(prompts),
        "max_tokens": 1024,
        "temperature": 0.0,
        "enable_thinking": False,
        "stream": True,
        "turns": "all",
        "concurrency_per_server": 16,
        "batch_save_size": 8,
        "request_timeout_s": 900.0,
        "tokenizer": str(model),
        "trainer": TRAINER,
        "train_max_length": TRAIN_MAX_LENGTH,
        "min_turn_budget": 256,
        "progress_interval_s": 5.0,
        "hedge_slow_ratio": 0.0,
    }


@pytest.fixture(scope="session")
def pipeline(
    vllm_server: RealServer, smollm2: Path, prompts_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> PipelineRun:
    runs = tmp_path_factory.mktemp("runs")
    proxy = RecordingProxy(vllm_server.url)
    proxy.start()
    before = scrape(vllm_server.url)
    params = generate_params(vllm_server, smollm2, prompts_file) | {"servers": [proxy.url]}
    try:
        generate_dir = draftgen_run("generate", runs, "model", params)
    finally:
        proxy.stop()
    after = scrape(vllm_server.url)
    validate_dir = draftgen_run(
        "validate",
        runs,
        "model",
        {
            "generation_dir": str(generate_dir),
            "tokenizer": str(smollm2),
            "trainer": TRAINER,
            "train_max_length": TRAIN_MAX_LENGTH,
            "enable_thinking": False,  # as generate ran: SmolLM2 has no thinking
            # A thinking model's empty think block is what the default 16 catches; a ChatML model's short answer
            # ("Cancer.<|im_end|>\\n") is a real one: only a mask of 4 tokens or fewer is tiny here.
            "min_assistant_tokens": 4,
            # A 135M model loops (a third of its greedy turns; fewer sampled): the gate's production 5% would stop the
            # export these runs are here to use. The looped turns are still flagged repetition_loop and dropped.
            "max_degenerate_share": 0.5,
            "holdout_share": HOLDOUT_SHARE,
            "export_tokens": True,
        },
    )
    prompts = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    return PipelineRun(generate_dir, validate_dir, params, prompts, proxy, before, after)
