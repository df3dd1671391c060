"""The tier's notebook runs, each a plain function from the shared servers to the run folder it leaves.

conftest.py starts runs that use different servers at the same time (real SGLang on two cores leaves a core idle
whenever one run's kernel starts or waits), and the tests read what each left. Each function's docstring says
why its parameters differ from production, where they do.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml
from chat import chat
from notebook_runs import (
    draftgen_run,
    finish,
    kernel_of,
    start_run,
    stored_rows,
    wait_for_a_row_from,
    wait_for_rows_from,
    wait_for_shards,
)
from prompt_files import single_turn, three_turns, too_long, write_rows
from recording_proxy import RecordingProxy
from serve_runs import CPU_ARGS, SGLANG_PYTHON, ServeRun, free_ports, start_serve

SERVED_MODEL = "tiny-qwen3"  # --served-model-name of the fleet's three servers
STREAM_PROMPTS = 6  # single-turn rows beside three three-turn ones: 9 rows, 15 answers. Under 10 prompts, so
# validate's duplicate_answer flag (the same answer to >= 10 prompts) stays quiet for the designed model.
RESUME_PROMPTS = 8
# The hedged run's servers are set by construction, whatever the machine's speed or load (ServeRun.slowed): STANDALONE
# runs HEDGE_SLOWDOWN + 1 times slower than itself throughout, so the hedger judges it slow; NGRAM is held still from
# the run's first shard until STANDALONE has HEDGE_JUDGED answers stored (the hedger judges a server once it has 10),
# then STANDALONE is held still to the end. So its last requests are still running when NGRAM empties the queue,
# and each is hedged onto NGRAM. Answers of HEDGE_TOKENS: a held loser is mid-answer when its copy lands, so SGLang
# aborts it once released.
HEDGE_PROMPTS = 120
HEDGE_TOKENS = 16
HEDGE_SLOWDOWN = 3.0
HEDGE_JUDGED = 11
HELD = 1e9  # a pause of this many forward passes: the server is still until its flag goes
FAILOVER_PROMPTS = 24  # ngram answers ~4 a second: enough left for it after plain's first shard
# The kill tests' other server runs KILL_SLOWDOWN + 1 times slower than itself until the kill (ServeRun.slowed), so
# the run is mid-way when the kill lands, by construction rather than by the day's relative speeds.
KILL_SLOWDOWN = 4.0
TUNE_GROUPS = 2  # two candidates at a time (four at once, beside the fleet, ran the machine out of memory)
TUNE_CONCURRENCY = 2
VERDICT_LEVELS = (1, 2)  # the verdict's concurrencies; the production one is the largest
# What every generate and benchmark run of the tier sends: the one served name, greedy, a CPU-sized time limit.
GREEDY = {"model": SERVED_MODEL, "temperature": 0.0, "top_p": 1.0, "request_timeout_s": 300.0}
ABORTED = "sglang:num_aborted_requests_total"
FINISHED = "sglang:num_requests_total"


def metric(url: str, name: str) -> float:
    """Sum of the samples called exactly ``name`` (any labels) in a server's /metrics, read with a plain regex."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


@dataclass(frozen=True)
class GenerateRun:
    run_dir: Path
    params: dict
    prompts: Path


def stream_generate(draftgen: str, plain: ServeRun, root: Path) -> GenerateRun:
    """generate.ipynb on the plain server: streamed, ``turns: all`` over multi-turn rows, thinking on, greedy.

    The designed model's answer to every turn is known, and it closes its thinking and stops, so the garbage
    guard and the canary keep their production thresholds."""
    prompts = write_rows(
        root / "prompts" / "stream.jsonl", single_turn("single", STREAM_PROMPTS) + three_turns("multi", 3)
    )
    params = {
        **GREEDY,
        "servers": [plain.url],
        "prompts": str(prompts),
        "stream": True,
        "turns": "all",
        "enable_thinking": True,
        "max_tokens": 64,
        "concurrency_per_server": 4,
        "batch_save_size": 4,
    }
    return GenerateRun(draftgen_run(draftgen, "generate", root, "stream", params), params, prompts)


def validate_stream(draftgen: str, stream: GenerateRun, tokenizer_dir: Path, root: Path) -> Path:
    """validate.ipynb on the streamed run, with the model folder's tokenizer. ``min_assistant_tokens`` 4: the
    designed answer is 13 tokens, and the production floor (16) would flag every sample ``tiny_mask``."""
    params = {
        "generation_dir": str(stream.run_dir),
        "tokenizer": str(tokenizer_dir),
        "enable_thinking": True,
        "export_tokens": True,
        "min_assistant_tokens": 4,
    }
    return draftgen_run(draftgen, "validate", root, "stream", params)


BENCH_LEVELS = [1, 2]
BENCH_PER_LEVEL = 2
BENCH_MAX_TOKENS = 12


@dataclass(frozen=True)
class BenchmarkRun:
    run_dir: Path
    proxies: dict[str, RecordingProxy]  # ngram, standalone: what the notebook sent and got, /metrics included


def benchmark_spec(draftgen: str, ngram: ServeRun, standalone: ServeRun, root: Path) -> BenchmarkRun:
    """benchmark.ipynb on ngram and standalone through recording proxies, greedy, thinking off: the random
    model never stops before max_tokens, so every request is max_tokens long. The caller stops the proxies."""
    proxies = {"ngram": RecordingProxy(ngram.url), "standalone": RecordingProxy(standalone.url)}
    for proxy in proxies.values():
        proxy.start()
    prompts = write_rows(
        root / "prompts" / "bench.jsonl", single_turn("bench", 2 * len(BENCH_LEVELS) * BENCH_PER_LEVEL)
    )
    params = {
        **GREEDY,
        "servers": [proxies["ngram"].url, proxies["standalone"].url],
        "prompts": str(prompts),
        "max_tokens": BENCH_MAX_TOKENS,
        "enable_thinking": False,
        "concurrencies": BENCH_LEVELS,
        "num_prompts": BENCH_PER_LEVEL,
        "warmup_requests": 1,
    }
    return BenchmarkRun(draftgen_run(draftgen, "benchmark", root, "spec", params), proxies)


@dataclass(frozen=True)
class ResumeRun:
    run_dir: Path
    prompts: Path
    first_returncode: int | None
    stored_before: list[str]  # ids stored when the kernel died


def resume_after_kill(draftgen: str, plain: ServeRun, root: Path) -> ResumeRun:
    """generate.ipynb on plain, its kernel (the client: generate's requests come from it) SIGKILLed after the
    first shard with requests in flight on the real server (plain slowed until then), then ``draftgen run
    --resume``."""
    prompts = write_rows(root / "prompts" / "resume.jsonl", single_turn("resume", RESUME_PROMPTS))
    params = {
        **GREEDY,
        "servers": [plain.url],
        "prompts": str(prompts),
        "stream": False,
        "enable_thinking": True,
        "max_tokens": 64,
        "concurrency_per_server": 1,
        "batch_save_size": 2,
    }
    run_dir = root / "generate" / "resume"
    proc = start_run(draftgen, "generate", root, "resume", params)
    try:
        kernel = kernel_of(proc)
        # plain slowed until the kill: the first shard is stored with most prompts still to go, so the kill lands
        # mid-run however late this process notices the shard
        with plain.slowed(KILL_SLOWDOWN):
            wait_for_shards(run_dir, 1, proc)
            kernel.send_signal(signal.SIGKILL)  # no flush, no goodbye
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = stored_rows(run_dir)["id"].to_list()
    draftgen_run(draftgen, "generate", root, "resume", params, "--resume")
    return ResumeRun(run_dir, prompts, proc.returncode, before)


@dataclass(frozen=True)
class HedgedRun:
    run_dir: Path
    prompts: Path
    urls: dict[str, str]  # ngram, standalone
    aborted: dict[str, float]  # sglang:num_aborted_requests_total's increase over the run, per server


def hedged_generate(draftgen: str, ngram: ServeRun, standalone: ServeRun, root: Path) -> HedgedRun:
    """generate.ipynb (streamed) on ngram and standalone, hedging forced, one prompt too long for the model.

    ``hedge_slow_ratio`` 0.9; STANDALONE four times slower than itself, NGRAM held while STANDALONE answers the 10
    the hedger judges it by, then STANDALONE held to the end (HEDGE_JUDGED): it answers at a fraction of NGRAM's
    per-request rate, and its last requests are still running when the queue runs dry, so they are hedged at any
    machine speed. Thinking off and ``max_truncated_rate`` 1.0: the random model never ends before max_tokens.
    Streamed, because SGLang 0.5.23 notices a client gone from a streamed request at its next chunk, but from a
    non-streamed one only every SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s) or SGLANG_FORCE_STREAM_INTERVAL tokens:
    a non-streamed loser that ends sooner is finished, not aborted (seen here: two hedges, no abort).
    ``train_max_length`` 0, as a run without the trainer's cap: with it, generate counts the too-long prompt with
    the model folder's tokenizer and sets it aside unsent (rejected.parquet), and SGLang's refusal is what this run
    shows."""
    prompts = write_rows(
        root / "prompts" / "hedge.jsonl", [too_long("too-long"), *single_turn("hedge", HEDGE_PROMPTS)]
    )
    params = {
        **GREEDY,
        "servers": [ngram.url, standalone.url],
        "prompts": str(prompts),
        "stream": True,
        "enable_thinking": False,
        "max_tokens": HEDGE_TOKENS,
        "concurrency_per_server": 3,
        "batch_save_size": 4,
        "hedge_slow_ratio": 0.9,
        "max_truncated_rate": 1.0,
        "train_max_length": 0,
    }
    urls = {"ngram": ngram.url, "standalone": standalone.url}
    before = {name: metric(url, ABORTED) for name, url in urls.items()}
    run_dir = root / "generate" / "hedge"
    proc = start_run(draftgen, "generate", root, "hedge", params)
    try:
        with standalone.slowed(HEDGE_SLOWDOWN), ngram.slowed(0.0):
            wait_for_shards(run_dir, 1, proc)  # preflight is over: the run is sending prompts
            ngram.slow_to(HELD)  # only STANDALONE answers now, until the hedger can judge it
            wait_for_rows_from(standalone.url, HEDGE_JUDGED, run_dir, proc)
            standalone.slow_to(HELD)
            ngram.slow_to(0.0)
            finish(proc, "generate", run_dir)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    aborted = _settled(lambda: {name: metric(url, ABORTED) - before[name] for name, url in urls.items()})
    return HedgedRun(run_dir, prompts, urls, aborted)


def _settled(read: Callable[[], dict[str, float]], timeout_s: float = 60.0) -> dict[str, float]:
    """The abort counts once a server released from a hold has noticed its cancelled streams (at its next chunk):
    the first reading with an abort that a second one, a second later, repeats."""
    deadline = time.monotonic() + timeout_s
    last = read()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = read()
        if now == last and sum(now.values()) >= 1:
            return now
        last = now
    return last


@dataclass(frozen=True)
class KilledRun:
    run_dir: Path
    prompts: Path
    killed_at: float  # wall clock, when plain's SGLang launcher got SIGKILL
    launcher_pid: int
    output: str  # draftgen run's own output


def failover_generate(draftgen: str, plain: ServeRun, ngram: ServeRun, root: Path) -> KilledRun:
    """generate.ipynb on plain and ngram; once a shard holding one of plain's answers is stored, plain's SGLang
    launcher is SIGKILLed (not at the first shard: under load ngram once answered the first shard's four alone),
    ngram slowed until then.

    Thinking off (the random model on ngram never closes </think>), so truncation is the rule there:
    max_truncated_rate 1.0. Two consecutive failures mark a server down (server_down_after 2), so the run moves
    on at once; no hedging, so every answer is one server's."""
    prompts = write_rows(root / "prompts" / "failover.jsonl", single_turn("failover", FAILOVER_PROMPTS))
    params = {
        **GREEDY,
        "servers": [plain.url, ngram.url],
        "prompts": str(prompts),
        "stream": True,
        "enable_thinking": False,
        "max_tokens": 16,
        "concurrency_per_server": 2,
        "batch_save_size": 4,
        "server_down_after": 2,
        "max_truncated_rate": 1.0,
        "hedge_slow_ratio": 0.0,
    }
    proc = start_run(draftgen, "generate", root, "failover", params)
    run_dir = root / "generate" / "failover"
    try:
        # ngram slowed until the kill: it takes few prompts before, so most are left for it after, whichever of
        # the two random-weight and designed models the machine runs faster
        with ngram.slowed(KILL_SLOWDOWN):
            wait_for_a_row_from(plain.url, run_dir, proc)
            [launcher] = plain.launchers()
            launcher.send_signal(signal.SIGKILL)
            killed_at = time.time()
        output = finish(proc, "generate", run_dir)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return KilledRun(run_dir, prompts, killed_at, launcher.pid, output)


def tune_cpu_params(target: Path, draft: Path, start_timeout_s: float) -> dict:
    """tune.ipynb's parameters: four real candidates of the random model on two GPU groups (two servers at a
    time), each started by tune's launcher through the tier's wrapper with the CPU arguments as ``extra_args``: speculation
    off, NGRAM at 2 and 4 draft tokens, STANDALONE 3/1/4 with the draft model. One round (max_rounds 1), 8
    requests a job (tune's floor), short answers; no seeds' baseline (NEXTN needs MTP heads the tiny model lacks).
    Then the verdict: STANDALONE as the drafter against speculation off, at ``VERDICT_LEVELS``.
    Two groups, not four: four candidates starting beside the fleet's three servers took the machine's 24 GiB
    down to 0.5 GiB free, and one candidate then failed SGLang's own memory check at start ("Loaded weights leave
    no GPU memory for the KV cache": on the CPU it counts what other processes took meanwhile)."""
    return {
        "engine": "sglang",
        "model": str(target),
        "gpus": f"0-{TUNE_GROUPS - 1}",
        "base_port": free_ports(TUNE_GROUPS),
        "python": str(SGLANG_PYTHON),
        "extra_args": [*CPU_ARGS, "--dtype", "bfloat16"],
        "startup_timeout_s": start_timeout_s,
        "mtp_off": True,
        "spec_candidates": [],  # STANDALONE 3/1/4 races as the drafter below (a drafter is a race candidate too)
        "ngram_draft_tokens": [2, 4],
        "max_running_requests": [4],
        "concurrency": TUNE_CONCURRENCY,
        "sample_size": 16,
        "max_tokens": 12,
        "temperature": 0.0,
        "top_p": 1.0,
        "enable_thinking": False,
        "rounds_per_job": 1.0,
        "max_rounds": 1,
        "warmup_requests": 1,
        "baseline": False,
        "bootstrap": 50,
        "request_timeout_s": 300.0,
        # The verdict after the race: the draft model as a trained drafter (STANDALONE 3/1/4) against speculation
        # off (verdict_baseline []: no MTP heads), each started once and measured at 1 and 2 in flight.
        "drafters": [
            {
                "speculative_algorithm": "STANDALONE",
                "speculative_draft_model_path": str(draft),
                "spec_candidates": [[3, 1, 4]],
            }
        ],
        "verdict_levels": list(VERDICT_LEVELS),
        "verdict_baseline": [],
        "dataset_size": 10_000,
    }


@dataclass(frozen=True)
class Relaunch:
    """``draftgen serve --settings <tune's settings.yaml>``: what the server said, then it was stopped."""

    settings: dict  # the file's settings: mapping
    server_log: str
    server_info: dict
    reply: dict  # a chat answer, return_spec_tokens_details asked for
    serve_output: str
    left: list  # processes still alive after serve stopped (killed then)


@dataclass(frozen=True)
class TuneRun:
    run_dir: Path
    relaunch: Relaunch


def tune_then_relaunch(
    draftgen: str, target: Path, draft: Path, root: Path, start_timeout_s: float
) -> TuneRun:
    """tune.ipynb (``tune_cpu_params``) in the background; as soon as its race has written settings.yaml, the
    winner started the production way beside the verdict still measuring (the notebook saves the race before
    the verdict starts, so an operator can do the same), asked one chat and stopped; then the tune run's end."""
    run_dir = root / "tune" / "cpu"
    settings_path = run_dir / "settings.yaml"
    proc = start_run(draftgen, "tune", root, "cpu", tune_cpu_params(target, draft, start_timeout_s))
    with ThreadPoolExecutor(1) as pool:
        tuned = pool.submit(finish, proc, "tune", run_dir)  # reads the run's output all along
        while not settings_path.exists() and not tuned.done():
            time.sleep(1.0)
        if not settings_path.exists():
            tuned.result()  # the run's own failure, if it failed
            raise AssertionError(f"tune ended without {settings_path}")
        relaunch = relaunch_winner(draftgen, target, root, settings_path, start_timeout_s)
        tuned.result()  # the pool's exit waits for the run in any case, a failed relaunch included
    return TuneRun(run_dir, relaunch)


def relaunch_winner(
    draftgen: str, target: Path, root: Path, settings_path: Path, start_timeout_s: float
) -> Relaunch:
    """``draftgen serve --settings <settings_path>``, one chat, stopped. The one server of the tier whose SGLang
    spawns its children, SGLang's own way (the others fork them: support/sitecustomize.py)."""
    server = start_serve(
        draftgen,
        "winner",
        target,
        root / "serve",
        settings=settings_path,
        env={"DRAFTGEN_SGLANG_CHILDREN": "spawn"},
    )
    try:
        server.wait_ready(start_timeout_s)
        info = requests.get(f"{server.url}/server_info", timeout=30).json()
        reply = chat(
            server.url,
            str(target),
            "Hello there.",
            thinking=False,
            max_tokens=8,
            return_spec_tokens_details=True,
        )
        # serve reports readiness on its own probe schedule, which can lag the /health 200 seen above
        output = server.wait_output("servers ready", 120)
        log = server.server_log.read_text(errors="replace")
    finally:
        left = server.stop()
    settings = yaml.safe_load(settings_path.read_text())["settings"]
    return Relaunch(settings, log, info, reply, output, left)


def classify_refusal(draftgen: str, url: str) -> subprocess.CompletedProcess:
    """support/refused_request.py in the project's venv: draftgen's client sends empty messages to ``url``."""
    python = str(Path(draftgen).with_name("python"))
    script = Path(__file__).resolve().parent / "refused_request.py"
    return subprocess.run(
        [python, str(script), url, SERVED_MODEL], capture_output=True, text=True, timeout=300
    )
