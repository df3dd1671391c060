"""Fixtures of the SGLang tier (``make test-sglang``): real SGLang 0.5.23 on the CPU, started by ``draftgen serve``.

This pytest runs in ``.venv-sglang`` (SGLang, CPU torch, our ``sgl_kernel`` stand-in on the path); draftgen runs
from the project's own venv (``DRAFTGEN_BIN``, default ``.venv/bin/draftgen``), as an operator runs it beside an
SGLang environment.

* ``models`` — the tiny Qwen3 checkpoints (designed, random, draft), built once per session (seconds).
* ``fleet`` — three ``draftgen serve`` runs started at once, each supervising one real server, waited for in
  parallel (``/health`` 200): ``plain`` (designed model, ``--restart``), ``ngram`` (random model, NGRAM
  speculation) and ``standalone`` (random model, STANDALONE speculation with the draft model), those two in
  float32 (``EXACT_DTYPE``), plus ``crash``, a
  serve run whose server cannot start. Shared by every test; stopped at the end of the session, pass or fail.
* tests marked ``stops_servers`` (they SIGKILL or stop a server) run after every other test.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
sys.path.insert(0, str(SUPPORT))  # our sgl_kernel stand-in and the tier's helpers, as the servers see them

from serve_runs import ServeRun, start_serve  # noqa: E402
from tiny_qwen3 import build_model, build_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = float(os.environ.get("SGLANG_TIER_START_S", "420"))  # three servers share two cores
NGRAM_ARGS = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4")
STANDALONE_STEPS = 3
# The speculative servers compute in float32 so that their greedy answers can be compared token for token with
# transformers' (in bf16 the two stacks round differently, and a random model's near-tied logits then flip).
EXACT_DTYPE = "float32"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stops_servers: SIGKILLs or stops a shared server; runs last")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("stops_servers") is not None)  # stable: order kept


@pytest.fixture(scope="session")
def draftgen() -> str:
    path = os.environ.get("DRAFTGEN_BIN", str(REPO / ".venv" / "bin" / "draftgen"))
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no draftgen at {path}: build the project venv (make .venv/.installed-stamp) or set DRAFTGEN_BIN"
        )
    return path


@dataclass(frozen=True)
class Models:
    designed: Path
    random: Path
    draft: Path


@pytest.fixture(scope="session")
def models(draftgen: str, tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("models")
    tokenizer = build_tokenizer(draftgen, root / "tokenizer")
    return Models(*(build_model(tokenizer, root / kind, kind) for kind in ("designed", "random", "draft")))


@dataclass
class Fleet:
    plain: ServeRun
    ngram: ServeRun
    standalone: ServeRun
    crash: ServeRun

    def runs(self) -> list[ServeRun]:
        return [self.plain, self.ngram, self.standalone, self.crash]


@pytest.fixture(scope="session")
def fleet(draftgen: str, models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    runs = tmp_path_factory.mktemp("serve-runs")
    started: list[ServeRun] = []
    try:
        plain = start_serve(
            draftgen,
            "plain",
            models.designed,
            runs,
            serve_args=("--restart", "--restart-backoff", "1", "--max-restarts", "2"),
        )
        started.append(plain)
        ngram = start_serve(draftgen, "ngram", models.random, runs, server_args=NGRAM_ARGS, dtype=EXACT_DTYPE)
        started.append(ngram)
        standalone_args = (
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            str(models.draft),
            "--speculative-num-steps",
            str(STANDALONE_STEPS),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(STANDALONE_STEPS + 1),
        )
        standalone = start_serve(
            draftgen, "standalone", models.random, runs, server_args=standalone_args, dtype=EXACT_DTYPE
        )
        started.append(standalone)
        # A typo in the server arguments: SGLang's own parser refuses it and the server exits at start.
        crash = start_serve(
            draftgen, "crash", models.designed, runs, server_args=("--attention-backend", "amx")
        )
        started.append(crash)
        t0 = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            waits = [pool.submit(run.wait_ready, READY_TIMEOUT_S) for run in (plain, ngram, standalone)]
            for future in waits:
                future.result()
        print(
            "\nSGLang servers ready (serve start -> /health 200): "
            + ", ".join(f"{r.name} {r.ready_after_s:.0f} s" for r in (plain, ngram, standalone))
            + f"; all within {time.monotonic() - t0:.0f} s"
        )
        yield Fleet(plain, ngram, standalone, crash)
    finally:
        for run in started:
            run.stop()
