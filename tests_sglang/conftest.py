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
  All three serve under one name (``SERVED_MODEL``, ``--served-model-name``), so one generate run can use any
  of them, as a fleet of GPUs serves one model.
* the notebook runs (support/tier_runs.py), run the production way (``draftgen run``) and started two or three
  at a time where they use different servers, each only when a collected test needs it: first the streamed
  multi-turn generate on plain (``stream_run``), the benchmark on ngram and standalone (``benchmark_run``) and
  tune on servers of its own (``tune_run``); then validate (``validate_run``), the client-kill-and-resume run
  on plain (``resume_run``) and the hedged run on ngram and standalone (``hedged_run``); last, once nothing
  else uses plain, the run during which plain's SGLang is SIGKILLed (``plain_killed_mid_run``).
* tests marked ``stops_servers`` (they SIGKILL or stop a server) run after every other test.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
sys.path.insert(0, str(SUPPORT))  # our sgl_kernel stand-in and the tier's helpers, as the servers see them
# tests_real's recording proxy (a pass-through that keeps every exchange), after this tier's own helpers
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests_real"))

from serve_runs import ServeRun, start_serve  # noqa: E402
from tier_runs import (  # noqa: E402
    SERVED_MODEL,
    BenchmarkRun,
    GenerateRun,
    HedgedRun,
    KilledRun,
    ResumeRun,
    TuneRun,
    benchmark_spec,
    failover_generate,
    hedged_generate,
    resume_after_kill,
    stream_generate,
    tune_then_relaunch,
    validate_stream,
)
from tiny_qwen3 import build_model, build_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = float(os.environ.get("SGLANG_TIER_START_S", "420"))  # three servers share two cores
NGRAM_ARGS = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4")
STANDALONE_STEPS = 3
# The speculative servers compute in float32 so that their greedy answers can be compared token for token with
# transformers' (in bf16 the two stacks round differently, and a random model's near-tied logits then flip).
EXACT_DTYPE = "float32"
NAME_ARGS = ("--served-model-name", SERVED_MODEL)


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
            server_args=NAME_ARGS,
        )
        started.append(plain)
        ngram = start_serve(
            draftgen, "ngram", models.random, runs, server_args=(*NGRAM_ARGS, *NAME_ARGS), dtype=EXACT_DTYPE
        )
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
            *NAME_ARGS,
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


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tier's notebook runs go (``draftgen run --out-root``)."""
    return tmp_path_factory.mktemp("notebook-runs")


# ----- notebook runs, started two or three at a time on different servers -----------------------------------------
# Which run each fixture reads; a run starts only when a collected test needs it (so `-k` stays quick).
FIRST_RUNS = {"stream_run": "stream", "benchmark_run": "benchmark", "tune_run": "tune"}
SECOND_RUNS = {"validate_run": "validate", "resume_run": "resume", "hedged_run": "hedge"}
NEEDED = pytest.StashKey[set]()


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[NEEDED] = {
        name for item in session.items for name in getattr(item, "fixturenames", ())
    }


def needed(request: pytest.FixtureRequest, fixtures: dict[str, str]) -> set[str]:
    wanted = request.config.stash.get(NEEDED, set())
    return {run for fixture, run in fixtures.items() if fixture in wanted}


@pytest.fixture(scope="session")
def background() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(6, thread_name_prefix="notebook-run") as pool:
        yield pool


def wait_all(futures: dict[str, Future]) -> None:
    """Until every run has ended, pass or fail (a test that needs one reads its result)."""
    for future in futures.values():
        with contextlib.suppress(BaseException):
            future.result()


@pytest.fixture(scope="session")
def first_runs(
    request: pytest.FixtureRequest,
    draftgen: str,
    fleet: Fleet,
    models: Models,
    runs_root: Path,
    background: ThreadPoolExecutor,
) -> Iterator[dict[str, Future]]:
    """At once, once the fleet is ready: streamed generate on plain, the benchmark on ngram and standalone, and
    tune on servers of its own."""
    want = needed(request, FIRST_RUNS)
    if "validate" in needed(request, SECOND_RUNS):
        want.add("stream")  # validate reads the streamed run
    jobs = {
        "stream": lambda: stream_generate(draftgen, fleet.plain, runs_root),
        "benchmark": lambda: benchmark_spec(draftgen, fleet.ngram, fleet.standalone, runs_root),
        "tune": lambda: tune_then_relaunch(draftgen, models.random, models.draft, runs_root, READY_TIMEOUT_S),
    }
    futures = {name: background.submit(job) for name, job in jobs.items() if name in want}
    yield futures
    wait_all(futures)
    bench = futures.get("benchmark")
    if bench is not None and bench.exception() is None:
        for proxy in bench.result().proxies.values():
            proxy.stop()


@pytest.fixture(scope="session")
def second_runs(
    request: pytest.FixtureRequest,
    draftgen: str,
    fleet: Fleet,
    models: Models,
    runs_root: Path,
    background: ThreadPoolExecutor,
    first_runs: dict[str, Future],
) -> Iterator[dict[str, Future]]:
    """Once the first runs on the fleet's servers have ended: validate on the streamed run (no server), the
    client-kill-and-resume run on plain, and the hedged run on ngram and standalone."""
    wait_all({k: v for k, v in first_runs.items() if k != "tune"})
    want = needed(request, SECOND_RUNS)
    jobs = {
        "validate": lambda: validate_stream(
            draftgen, first_runs["stream"].result(), models.designed, runs_root
        ),
        "resume": lambda: resume_after_kill(draftgen, fleet.plain, runs_root),
        "hedge": lambda: hedged_generate(draftgen, fleet.ngram, fleet.standalone, runs_root),
    }
    futures = {name: background.submit(job) for name, job in jobs.items() if name in want}
    yield futures
    wait_all(futures)


@pytest.fixture(scope="session")
def stream_run(first_runs: dict[str, Future]) -> GenerateRun:
    return first_runs["stream"].result()


@pytest.fixture(scope="session")
def benchmark_run(first_runs: dict[str, Future]) -> BenchmarkRun:
    return first_runs["benchmark"].result()


@pytest.fixture(scope="session")
def tune_run(first_runs: dict[str, Future]) -> TuneRun:
    return first_runs["tune"].result()


@pytest.fixture(scope="session")
def validate_run(second_runs: dict[str, Future]) -> Path:
    return second_runs["validate"].result()


@pytest.fixture(scope="session")
def resume_run(second_runs: dict[str, Future]) -> ResumeRun:
    return second_runs["resume"].result()


@pytest.fixture(scope="session")
def hedged_run(second_runs: dict[str, Future]) -> HedgedRun:
    return second_runs["hedge"].result()


@pytest.fixture(scope="session")
def plain_killed_mid_run(
    draftgen: str,
    fleet: Fleet,
    runs_root: Path,
    first_runs: dict[str, Future],
    second_runs: dict[str, Future],
) -> KilledRun:
    """Once nothing else uses plain: generate on plain and ngram, plain's SGLang SIGKILLed after the first shard.
    serve (``--restart``) brings it back; the failover test and the restart test read this."""
    wait_all({name: run for name, run in first_runs.items() if name != "tune"})
    wait_all(second_runs)
    return failover_generate(draftgen, fleet.plain, fleet.ngram, runs_root)
