"""Helpers for the benchmark/estimate notebook tests: run a notebook headless, read the simulator's truth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftgen.bench.records import RequestRecord, ServerFacts

RUN_TIMEOUT_S = 300


def run_notebook(notebook: str, out_root: Path, name: str, params: dict) -> Path:
    """``draftgen run NOTEBOOK`` in a subprocess (papermill, python3 kernel); returns the run folder."""
    command = [
        sys.executable,
        "-m",
        "draftgen",
        "run",
        notebook,
        "--name",
        name,
        "--out-root",
        str(out_root),
        "--no-html",
    ]
    for key, value in params.items():
        command += ["-p", key, value if isinstance(value, str) else json.dumps(value)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=os.environ.copy()
    )
    assert done.returncode == 0, f"{notebook} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out_root / notebook / name


def truth_by_level(truth: list[dict], requests) -> dict[tuple[str, int], dict]:  # type: ignore[no-untyped-def]
    """The simulator's own figures for each server × level, from the records of that level's requests."""
    by_rid = {r["rid"]: r for r in truth if r.get("kind") == "chat"}
    out = {}
    for (server, concurrency), group in requests.group_by(["server", "concurrency"]):
        records = [by_rid[rid] for rid in group["response_id"].to_list()]
        tokens = sum(r["completion_tokens"] for r in records)
        window = max(r["finished"] for r in records) - min(r["arrival"] for r in records)
        gaps = [b - a for r in records for a, b in zip(r["emit_times"], r["emit_times"][1:], strict=False)]
        out[(server, concurrency)] = {
            "output_tok_s": tokens / window,
            "output_tokens": tokens,
            "accept_length": tokens / sum(r["verify_steps"] for r in records),
            "ttft_s_p50": float(np.median([r["first_token"] - r["arrival"] for r in records])),
            "itl_s_p50": float(np.median(gaps)),
        }
    return out


# ----- how far load moved the measurements -----------------------------------------------------------------
# A two-core machine shared with other work delays both sides: the simulator's steps run late (it then falls behind
# its own clock), and the client notices finishes and chunks late. Tests that compare timings read how much of each
# happened in the same run and widen (or correct) their tolerance by exactly that, instead of a fixed margin.
def sim_clocks(fleet) -> list[dict]:  # type: ignore[no-untyped-def]
    """Each server's ``/sim/info`` clock_kept counters now (wall seconds its steps should have taken, and took)."""
    return [fleet.info(i)["clock_kept"] for i in range(fleet.servers)]


def clock_kept(before: list[dict], after: list[dict]) -> float:
    """Planned ÷ actual step time over a window, the fleet's servers together: 1.0 on time, 0.8 running 25% late."""
    planned = sum(a["planned_s"] - b["planned_s"] for b, a in zip(before, after, strict=True))
    actual = sum(a["actual_s"] - b["actual_s"] for b, a in zip(before, after, strict=True))
    return planned / actual if actual > 0 else 1.0


def turnaround_share(fleet, since: float, until: float, concurrency: int) -> float:  # type: ignore[no-untyped-def]
    """How much the client's turnaround stretched the chat requests that reached the fleet between two wall times:
    the mean gap between a request finishing at a server and the next one arriving in its slot (the (c+j)-th
    arrival after the j-th finish, with ``concurrency`` kept in flight), ÷ the mean request duration there."""
    gaps: list[float] = []
    durations: list[float] = []
    for index in range(fleet.servers):
        records = [
            r
            for r in fleet.truth(index)
            if r.get("kind") == "chat" and since <= r["arrival"] <= until and r["finished"]
        ]
        arrivals = sorted(r["arrival"] for r in records)
        finishes = sorted(r["finished"] for r in records)
        gaps += [
            max(0.0, arrivals[concurrency + j] - finishes[j]) for j in range(len(arrivals) - concurrency)
        ]
        durations += [r["finished"] - r["arrival"] for r in records]
    return float(np.mean(gaps)) / float(np.mean(durations)) if gaps and durations else 0.0


@dataclass(frozen=True)
class PredictedRun:
    """benchmark → estimate → generate on one fleet, with what each side's load did to the simulator's clock."""

    bench: Path
    est: Path
    estimate: dict
    gen: Path
    kept_bench: float  # the share of its clock the fleet kept during the benchmark
    kept_gen: float  # ... and during the generate run
    bench_turnaround: float  # the client's turnaround share during each (turnaround_share)
    gen_turnaround: float


def bench_estimate_generate(  # type: ignore[no-untyped-def]
    fleet, out_root: Path, common: dict, num_prompts: int, concurrency: int, generate: dict
) -> PredictedRun:
    """The three notebooks as a user runs them: the benchmark samples ``num_prompts`` of ``common``'s prompt file,
    the estimate prices the whole file from it, and generate (with ``generate``'s extra parameters) runs it."""
    bench_from, before_bench = time.time(), sim_clocks(fleet)
    bench = run_notebook(
        "benchmark",
        out_root,
        "bench",
        {
            **common,
            "servers": fleet.urls,
            "num_prompts": num_prompts,
            "concurrencies": [concurrency],
            "warmup_requests": 1,
        },
    )
    kept_bench = clock_kept(before_bench, sim_clocks(fleet))
    bench_turnaround = turnaround_share(fleet, bench_from, time.time(), concurrency)
    est = run_notebook(
        "estimate",
        out_root,
        "est",
        {**common, "benchmark_dir": str(bench), "concurrency_per_server": concurrency, "bootstrap": 50},
    )
    gen_from, before_gen = time.time(), sim_clocks(fleet)
    gen = run_notebook(
        "generate",
        out_root,
        "gen",
        {
            **common,
            "servers": fleet.urls,
            "concurrency_per_server": concurrency,
            "estimate": str(est / "estimate.json"),
            **generate,
        },
    )
    kept_gen = clock_kept(before_gen, sim_clocks(fleet))
    gen_turnaround = turnaround_share(fleet, gen_from, time.time(), concurrency)
    estimate = json.loads((est / "estimate.json").read_text())
    return PredictedRun(bench, est, estimate, gen, kept_bench, kept_gen, bench_turnaround, gen_turnaround)


def lag_share(row: dict) -> float:
    """The client's worst lateness during a level as a share of the level's wall-clock window (raw results)."""
    return row["client_lag_ms_max"] / 1000.0 / row["window_s"]


# ----- records without servers ---------------------------------------------------------------------------------
URL = "http://127.0.0.1:1"


def facts(**changes) -> ServerFacts:
    base = {
        "index": 0,
        "url": URL,
        "engine": "sglang",
        "version": "0.5.23",
        "model_ids": ("m",),
        "extra_fields": True,
        "sglext": True,
        "metrics": True,
        "max_running_requests": 48,
        "speculative_algorithm": "NEXTN",
        "speculation": True,
    }
    return ServerFacts(**{**base, **changes})


def record(seq: int, **changes) -> RequestRecord:
    base = {
        "server": URL,
        "gpu": 0,
        "concurrency": 2,
        "seq": seq,
        "prompt_id": f"p{seq}",
        "ok": True,
        "error": None,
        "started_at": 100.0 + seq,
        "e2e_s": 2.0,
        "ttft_s": 0.5,
        "chunk_offsets": (0.5, 1.0, 1.5, 2.0),
        "usage_reported": True,
        "completion_tokens": 40,
        "finish_reason": "stop",
        "reasoning_chars": 300,
        "content_chars": 100,
        "content_blank": False,
        "spec_accept_length": 4.0,
        "spec_verify_ct": 10,
        "done_sentinel": True,
    }
    return RequestRecord(**{**base, **changes})
