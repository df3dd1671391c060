"""Fixtures of the SGLang tier (``make test-sglang``): real SGLang 0.5.23 on the CPU, started by ``draftgen serve``.

This pytest runs in ``.venv-sglang`` (SGLang, CPU torch, our ``sgl_kernel`` stand-in on the path); draftgen runs
from the project's own venv (``DRAFTGEN_BIN``, default ``.venv/bin/draftgen``), as an operator runs it beside an
SGLang environment.

* ``models`` — the tiny Qwen3 checkpoints (designed, random, draft) and the tiny ``qwen3_5`` hybrid with its MTP
  head (support/tiny_qwen3_5.py), built once per session (seconds).
* ``fleet`` — four ``draftgen serve`` runs started at the session's start (``fleet_launch``), each supervising
  one real server, waited for in parallel (``/health`` 200) by the first test that needs them: ``plain``
  (designed model, ``--restart``), ``ngram`` (random model, NGRAM speculation) and ``standalone`` (random model,
  STANDALONE speculation with the draft model), those two in float32 (``EXACT_DTYPE``), plus ``crash``, a serve
  run whose server cannot start. Shared by every test; stopped at the end of the session, pass or fail. All
  three serve under one name (``SERVED_MODEL``, ``--served-model-name``), so one generate run can use any of
  them, as a fleet of GPUs serves one model.
* the notebook runs (support/tier_runs.py), run the production way (``draftgen run``) as background jobs
  (``NotebookRuns``), each only when a collected test needs it, at the same time where they use different
  servers: tune (servers of its own) from the session's start; once the fleet is ready the streamed multi-turn
  generate and the client-kill-and-resume run on plain, the benchmark alone on ngram and standalone, validate
  after the streamed run; the hedged run on ngram and standalone after the benchmark; last the run during which
  plain's SGLang is SIGKILLed. The last two also wait until the tests that talk to the servers directly have
  run (``collection_rank`` orders the session so).
* ``mtp_server`` — ``draftgen serve`` of the hybrid with serve's default MTP flags (NEXTN 3/1/4), started at the
  session's start when a collected test needs it (support/mtp_runs.py); its runs: the benchmark alone on it, then
  generate, validate and the estimate; tune's race over two MTP settings on candidates of its own.
* tests marked ``stops_servers`` (they SIGKILL or stop a server) run after every other test but tune's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
sys.path.insert(0, str(SUPPORT))  # our sgl_kernel stand-in and the tier's helpers, as the servers see them
# tests_real's recording proxy (a pass-through that keeps every exchange) and the machine's lock for real-server
# tiers, after this tier's own helpers
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests_real"))
# draftgen's SSE decoder (draftgen.client.sse, standard library only), which this tier's recorders use; the rest of
# draftgen runs from the project's venv and is not imported here
sys.path.append(str(Path(__file__).resolve().parent.parent / "src"))

from machine_lock import hold_for_test_session  # noqa: E402
from mtp_runs import (  # noqa: E402
    EXACT_HYBRID_ENV,
    HYBRID_ARGS,
    MTP_SERVED_MODEL,
    MtpBenchmark,
    MtpGenerate,
    mtp_benchmark,
    mtp_estimate,
    mtp_generate,
    mtp_tune,
    mtp_validate,
)
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
from tiny_qwen3_5 import build_hybrid  # noqa: E402

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


def pytest_sessionstart(session: pytest.Session) -> None:
    """Wait for another real-server tier on this machine (another clone's, or vLLM's) to end:
    tests_real/machine_lock.py."""
    hold_for_test_session(session)


def collection_rank(item: pytest.Item) -> int:
    """The session's order (a stable sort: file order kept within a rank). Tests needing no server run while the
    fleet starts; the benchmark's tests next (its run is alone on ngram and standalone); then the tests that talk
    to the fleet's servers directly; then those reading the other runs (reading one lets the hedged and failover
    runs go); the tests that stop shared servers; tune's last (its candidates are servers of its own)."""
    names = set(getattr(item, "fixturenames", ()))
    if names & {"tune_run", "mtp_tune_run"}:
        return 5
    if item.get_closest_marker("stops_servers") is not None:
        return 4
    if names & (set(RUN_FIXTURES) - BENCHMARK_FIXTURES):
        return 3
    if names & BENCHMARK_FIXTURES:
        return 1
    return 2 if names & {"fleet", "mtp_server"} else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=collection_rank)


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
    hybrid: Path  # qwen3_5 with its MTP head
    tools: Path  # the designed model that answers with a tool call (support/tiny_qwen3.py)


@pytest.fixture(scope="session")
def models(draftgen: str, tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("models")
    tokenizer = build_tokenizer(draftgen, root / "tokenizer")
    dense = [build_model(tokenizer, root / kind, kind) for kind in ("designed", "random", "draft")]
    return Models(
        *dense, build_hybrid(tokenizer, root / "hybrid"), build_model(tokenizer, root / "tools", "tools")
    )


@dataclass
class Fleet:
    plain: ServeRun
    ngram: ServeRun
    standalone: ServeRun
    crash: ServeRun

    def runs(self) -> list[ServeRun]:
        return [self.plain, self.ngram, self.standalone, self.crash]


NEEDED = pytest.StashKey[set]()


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[NEEDED] = {
        name for item in session.items for name in getattr(item, "fixturenames", ())
    }


def wanted(request: pytest.FixtureRequest) -> set[str]:
    """Every fixture some collected test needs (directly or through other fixtures)."""
    return request.config.stash.get(NEEDED, set())


@pytest.fixture(scope="session")
def fleet_launch(draftgen: str, models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The four serve runs, started (not yet ready); stopped at the end of the session, pass or fail."""
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
        yield Fleet(plain, ngram, standalone, crash)
    finally:
        for run in started:
            run.stop()


@pytest.fixture(scope="session")
def mtp_launch(draftgen: str, models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeRun]:
    """serve of the hybrid with serve's default MTP flags (NEXTN 3/1/4) and the CPU's extras, started (not yet
    ready); stopped at the end of the session, pass or fail."""
    run = start_serve(
        draftgen,
        "mtp",
        models.hybrid,
        tmp_path_factory.mktemp("mtp-serve"),
        server_args=(*HYBRID_ARGS, "--served-model-name", MTP_SERVED_MODEL),
        dtype=EXACT_DTYPE,
        env=EXACT_HYBRID_ENV,
        mtp=True,
    )
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="session")
def mtp_server(mtp_launch: ServeRun) -> ServeRun:
    mtp_launch.wait_ready(READY_TIMEOUT_S)
    print(f"\nSGLang hybrid MTP server ready (serve start -> /health 200): {mtp_launch.ready_after_s:.0f} s")
    return mtp_launch


@pytest.fixture(scope="session", autouse=True)
def _start_early(request: pytest.FixtureRequest) -> None:
    """At the session's start, when a collected test needs them: the fleet's four starts, the hybrid MTP server,
    and tune (servers of its own), so the tests that need no server run while SGLang starts."""
    need = wanted(request)
    if "fleet" in need:
        request.getfixturevalue("fleet_launch")
    if "mtp_server" in need:
        request.getfixturevalue("mtp_launch")
    if "tune_run" in need:
        request.getfixturevalue("notebook_runs").start("tune")


@pytest.fixture(scope="session")
def fleet(fleet_launch: Fleet) -> Fleet:
    """The fleet, every server but ``crash`` ready (``/health`` 200), waited for in parallel."""
    t0 = time.monotonic()
    serving = (fleet_launch.plain, fleet_launch.ngram, fleet_launch.standalone)
    with ThreadPoolExecutor(3) as pool:
        for future in [pool.submit(run.wait_ready, READY_TIMEOUT_S) for run in serving]:
            future.result()
    print(
        "\nSGLang servers ready (serve start -> /health 200): "
        + ", ".join(f"{r.name} {r.ready_after_s:.0f} s" for r in serving)
        + f"; all within {time.monotonic() - t0:.0f} s of the first test that needed them"
    )
    return fleet_launch


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tier's notebook runs go (``draftgen run --out-root``)."""
    return tmp_path_factory.mktemp("notebook-runs")


# ----- notebook runs, in the background, each started once and only when a collected test needs it ---------------
class NotebookRuns:
    """The tier's notebook runs as background jobs. Each job waits for the runs it must not overlap (the same
    server's counters or slots), so runs on different servers go on at the same time; ``start`` is idempotent.

    Which server each uses, and why it waits:
      * ``tune``: servers of its own (at the session's start); its winner relaunched by serve once the race is
        saved, beside the verdict.
      * ``stream``, ``resume``: plain (no counters read there), beside each other.
      * ``validate``: no server; after ``stream``.
      * ``benchmark``: ngram and standalone, alone on them (its acceptance check reads their /metrics counter
        differences, which another client's request would change).
      * ``hedge``: ngram and standalone, after ``benchmark`` and once the tests that talk to those servers
        directly have run (``released``: set by the first test reading a notebook run; the collection order puts
        those tests before it).
      * ``failover``: plain and ngram, after every other run on them, and after ``released``: it SIGKILLs
        plain's SGLang.
    """

    def __init__(self, pool: ThreadPoolExecutor, jobs: dict[str, Callable[[], object]], after: dict) -> None:
        self._pool, self._jobs, self._after = pool, jobs, after
        self._futures: dict[str, Future] = {}
        self._lock = threading.RLock()  # start() starts what a run waits for, under the same lock
        self.released = threading.Event()
        self.fleet: Fleet | None = None
        self.mtp: ServeRun | None = None

    def start(self, name: str) -> Future:
        with self._lock:
            if name not in self._futures:
                needs = [self.start(other) for other in self._after.get(name, ())]
                self._futures[name] = self._pool.submit(self._run, name, needs)
            return self._futures[name]

    def _run(self, name: str, needs: list[Future]) -> object:
        for future in needs:
            with contextlib.suppress(BaseException):
                future.result()  # ended, pass or fail: a test that needs that run reads its own result
        if name in ("hedge", "failover"):
            self.released.wait()
        return self._jobs[name]()

    def result(self, name: str) -> object:
        return self.start(name).result()

    def wait_all(self) -> None:
        self.released.set()
        for future in list(self._futures.values()):
            with contextlib.suppress(BaseException):
                future.result()


RUN_FIXTURES = {
    "stream_run": "stream",
    "benchmark_run": "benchmark",
    "tune_run": "tune",
    "validate_run": "validate",
    "resume_run": "resume",
    "hedged_run": "hedge",
    "plain_killed_mid_run": "failover",
    "mtp_benchmark_run": "mtp_benchmark",
    "mtp_generate_run": "mtp_generate",
    "mtp_validate_run": "mtp_validate",
    "mtp_estimate_run": "mtp_estimate",
    "mtp_tune_run": "mtp_tune",
}
BENCHMARK_FIXTURES = {"benchmark_run", "mtp_benchmark_run"}  # alone on their servers: read first
MTP_RUNS = {"mtp_benchmark", "mtp_generate", "mtp_validate", "mtp_estimate", "mtp_tune"}


@pytest.fixture(scope="session")
def notebook_runs(
    request: pytest.FixtureRequest, draftgen: str, models: Models, runs_root: Path
) -> Iterator[NotebookRuns]:
    """The registry; once the fleet is ready (when a test needs a run on it), every needed run on the fleet
    starts at once, each waiting in its job for what it must not overlap."""

    def on_fleet(job: Callable[[Fleet], object]) -> Callable[[], object]:
        return lambda: job(runs.fleet)  # set by fleet_runs, in the main thread, before any of these starts

    def on_mtp(job: Callable[[ServeRun], object]) -> Callable[[], object]:
        return lambda: job(runs.mtp)  # set by mtp_runs, likewise

    jobs: dict[str, Callable[[], object]] = {
        "tune": lambda: tune_then_relaunch(draftgen, models.random, models.draft, runs_root, READY_TIMEOUT_S),
        "stream": on_fleet(lambda f: stream_generate(draftgen, f.plain, runs_root)),
        "resume": on_fleet(lambda f: resume_after_kill(draftgen, f.plain, runs_root)),
        "benchmark": on_fleet(lambda f: benchmark_spec(draftgen, f.ngram, f.standalone, runs_root)),
        "hedge": on_fleet(lambda f: hedged_generate(draftgen, f.ngram, f.standalone, runs_root)),
        "failover": on_fleet(lambda f: failover_generate(draftgen, f.plain, f.ngram, runs_root)),
        "mtp_benchmark": on_mtp(lambda m: mtp_benchmark(draftgen, m, runs_root)),
        "mtp_generate": on_mtp(lambda m: mtp_generate(draftgen, m, runs_root)),
        "mtp_tune": lambda: mtp_tune(draftgen, models.hybrid, runs_root, READY_TIMEOUT_S),
    }
    after = {
        "validate": ("stream",),
        "hedge": ("benchmark",),
        "failover": ("stream", "resume", "benchmark", "hedge"),
        "mtp_generate": ("mtp_benchmark",),  # the benchmark alone on the hybrid server
        "mtp_validate": ("mtp_generate",),
        "mtp_estimate": ("mtp_benchmark",),
        "mtp_tune": ("mtp_generate",),  # its candidate after the hybrid server's busy part: memory
    }
    with ThreadPoolExecutor(8, thread_name_prefix="notebook-run") as pool:
        runs = NotebookRuns(pool, jobs, after)
        jobs["validate"] = lambda: validate_stream(
            draftgen, runs.result("stream"), models.designed, runs_root
        )
        jobs["mtp_validate"] = lambda: mtp_validate(
            draftgen, runs.result("mtp_generate"), models.hybrid, runs_root
        )
        jobs["mtp_estimate"] = lambda: mtp_estimate(
            draftgen, runs.result("mtp_benchmark"), runs.result("mtp_generate").prompts, runs_root
        )
        try:
            yield runs
        finally:
            runs.wait_all()
            bench = runs._futures.get("benchmark")
            if bench is not None and bench.exception() is None:
                for proxy in bench.result().proxies.values():
                    proxy.stop()
            mtp_bench = runs._futures.get("mtp_benchmark")
            if mtp_bench is not None and mtp_bench.exception() is None:
                mtp_bench.result().proxy.stop()


@pytest.fixture(scope="session")
def fleet_runs(request: pytest.FixtureRequest, fleet: Fleet, notebook_runs: NotebookRuns) -> NotebookRuns:
    """Every needed run on the fleet started (the fleet is ready): the first test that reads a run needs this."""
    need = wanted(request)
    notebook_runs.fleet = fleet
    for fixture, name in RUN_FIXTURES.items():
        if fixture in need and name != "tune" and name not in MTP_RUNS:
            notebook_runs.start(name)
    return notebook_runs


@pytest.fixture(scope="session")
def mtp_runs(
    request: pytest.FixtureRequest, mtp_server: ServeRun, notebook_runs: NotebookRuns
) -> NotebookRuns:
    """Every needed run on the hybrid started (its server is ready): the first test reading one needs this."""
    need = wanted(request)
    notebook_runs.mtp = mtp_server
    for fixture, name in RUN_FIXTURES.items():
        if fixture in need and name in MTP_RUNS:
            notebook_runs.start(name)
    return notebook_runs


def read_run(runs: NotebookRuns, name: str) -> object:
    """A run's result. Reading any but the benchmark's means the tests that talk to the fleet's servers directly
    have run (the collection order puts them before), so the runs that wait for that may go."""
    if name not in ("benchmark", "mtp_benchmark"):
        runs.released.set()
    return runs.result(name)


@pytest.fixture(scope="session")
def stream_run(fleet_runs: NotebookRuns) -> GenerateRun:
    return read_run(fleet_runs, "stream")


@pytest.fixture(scope="session")
def benchmark_run(fleet_runs: NotebookRuns) -> BenchmarkRun:
    return read_run(fleet_runs, "benchmark")


@pytest.fixture(scope="session")
def tune_run(notebook_runs: NotebookRuns) -> TuneRun:
    return read_run(notebook_runs, "tune")


@pytest.fixture(scope="session")
def validate_run(fleet_runs: NotebookRuns) -> Path:
    return read_run(fleet_runs, "validate")


@pytest.fixture(scope="session")
def resume_run(fleet_runs: NotebookRuns) -> ResumeRun:
    return read_run(fleet_runs, "resume")


@pytest.fixture(scope="session")
def hedged_run(fleet_runs: NotebookRuns) -> HedgedRun:
    return read_run(fleet_runs, "hedge")


@pytest.fixture(scope="session")
def plain_killed_mid_run(fleet_runs: NotebookRuns) -> KilledRun:
    """generate on plain and ngram, plain's SGLang SIGKILLed once a shard holds one of its answers, once nothing
    else uses plain. serve (``--restart``) brings it back; the failover test and the restart test read this."""
    return read_run(fleet_runs, "failover")


@pytest.fixture(scope="session")
def mtp_benchmark_run(mtp_runs: NotebookRuns) -> MtpBenchmark:
    return read_run(mtp_runs, "mtp_benchmark")


@pytest.fixture(scope="session")
def mtp_generate_run(mtp_runs: NotebookRuns) -> MtpGenerate:
    return read_run(mtp_runs, "mtp_generate")


@pytest.fixture(scope="session")
def mtp_validate_run(mtp_runs: NotebookRuns) -> Path:
    return read_run(mtp_runs, "mtp_validate")


@pytest.fixture(scope="session")
def mtp_estimate_run(mtp_runs: NotebookRuns) -> Path:
    return read_run(mtp_runs, "mtp_estimate")


@pytest.fixture(scope="session")
def mtp_tune_run(mtp_runs: NotebookRuns) -> Path:
    return read_run(mtp_runs, "mtp_tune")
