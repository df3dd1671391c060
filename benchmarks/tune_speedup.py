"""Tune's wall time with 7 simulated GPUs vs measuring the same jobs one after another on one GPU, and the chosen
candidate's tok/s per GPU vs the seeds' 3/1/4 (cap 48) at the same concurrency.

    PYTHONPATH=src python benchmarks/tune_speedup.py [--speed 1] [--max-tokens 256] [--caps 16]   # ~3 minutes

Both runs use the simulator (b200-mtp) at the same --speed, in this process, one after another: first
``draftgen tune`` on GPU groups 0-6, then exactly the jobs it ran replayed on group 0 alone: same candidates,
rounds and prompts, each job with its own request count and its round's measuring time (``equal_time``), so
both runs do the same work. Tok/s are --speed times the simulated GPU's; the ratios are what to read.
The schedule bound is the speed-up with no contention at all: each round as long as its longest replayed job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from draftgen.bench.sample import sample_prompts
from draftgen.params import build_config
from draftgen.server_settings import ServerSettings
from draftgen.sim.fleet import find_free_base_port
from draftgen.sim.profiles import get_profile
from draftgen.sim.speculative import SimSettings, apply_settings
from draftgen.tune import report
from draftgen.tune.config import TuneConfig
from draftgen.tune.run import Job, run_jobs, run_tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--no-equal-time", action="store_true", help="every job sends all its requests")
    parser.add_argument(
        "--caps",
        default="16",
        help="max_running_requests values, comma-separated (each candidate at its own cap)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tune-speedup-") as tmp:
        config = build_config(
            TuneConfig,
            {
                "engine": "sim",
                "model": "Qwen/Qwen3.6-27B",
                "gpus": "0-6",
                "base_port": find_free_base_port(7),
                "sim_speed": args.speed,
                "max_tokens": args.max_tokens,
                "sample_size": 256,
                "spec_candidates": [[1, 1, 2], [2, 1, 3], [3, 1, 4], [4, 1, 5], [5, 1, 6], [3, 2, 6]],
                "max_running_requests": [int(cap) for cap in args.caps.split(",")],
                "max_rounds": 2,
                "warmup_requests": 1,
                "baseline": True,
                "equal_time": not args.no_equal_time,
                "out_dir": f"{tmp}/parallel",
            },
        )
        began = time.monotonic()
        run = asyncio.run(run_tune(config, log=lambda line: None))
        parallel_s = time.monotonic() - began
        info = report.save_report(run)
        # The same jobs with the same prompt slices (round, replica), the seeds' 3/1/4 included.
        # Each replayed job is its original: at most the requests it sent, within the round's time it saw.
        done = [*run.jobs, *run.seeds_jobs]
        jobs = [Job(j.candidate, j.round, j.replica, limit=j.requests, seconds=j.clock_s) for j in done]
        serial = config.model_copy(update={"out_dir": f"{tmp}/serial"})
        sample = sample_prompts(serial.prompt_path, serial.sample_size, serial.seed)
        began = time.monotonic()
        replayed = asyncio.run(run_jobs(serial, jobs, [0], sample, lambda result: None))
        serial_s = time.monotonic() - began
    by_round: dict[int, list[float]] = {}
    for result in replayed:
        by_round.setdefault(result.round, []).append(result.finished_at - result.started_at)
    # With no contention, a round on 7 groups takes at least its longest job (and its total / 7).
    bound = serial_s / sum(max(max(d), sum(d) / 7) for d in by_round.values())
    stopped = sum(j.stopped_by_clock for j in done)
    print(
        f"candidates {len(run.candidates)}, jobs {len(jobs)}, sim speed {args.speed:g}, max_tokens {args.max_tokens}"
    )
    print(
        f"tune on 7 GPU groups: {parallel_s:.1f} s (successive halving, the seeds' 3/1/4 beside the last round)"
    )
    print(f"the same {len(jobs)} jobs one after another on 1 GPU group: {serial_s:.1f} s")
    print(
        f"jobs stopped at their round's time (equal_time): {stopped} of {len(done)}; schedule bound (each round "
        f"as long as its longest replayed job): {bound:.1f}x"
    )
    print(
        f"speed-up: {serial_s / parallel_s:.1f}x (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    gain = info["gain_vs_baseline"]
    print(
        f"chosen {info['chosen_label']} at concurrency {info['concurrency']} (rounds: {info['tok_s_per_gpu']:,.0f} tok/s "
        "per GPU); "
        f"beside the seeds' {info['baseline_label']}: {info['chosen_beside_baseline_tok_s_per_gpu']:,.0f} vs "
        f"{info['baseline_tok_s_per_gpu']:,.0f}; "
        f"ratio {1 + gain:.2f}x"
        if gain is not None
        else "no baseline measured"
    )
    if run.chosen is not None:
        c = run.chosen.concurrency
        chosen_truth = truth(run.chosen.settings, c) * args.speed
        seeds_truth = truth(config.baseline_candidate(c).settings, c) * args.speed
        print(
            f"simulator truth at concurrency {c} (x speed): chosen {chosen_truth:,.0f}, seeds' 3/1/4 "
            f"{seeds_truth:,.0f} tok/s per GPU, ratio {chosen_truth / seeds_truth:.2f}x"
        )


def truth(settings: ServerSettings, concurrency: int) -> float:
    """The simulated GPU's steady tok/s (prefill excluded) for these settings at this concurrency."""
    flags = SimSettings(
        speculative_algorithm=settings.speculative_algorithm or "none",
        speculative_num_steps=settings.speculative_num_steps,
        speculative_eagle_topk=settings.speculative_eagle_topk,
        speculative_num_draft_tokens=settings.speculative_num_draft_tokens,
        max_running_requests=settings.max_running_requests,
    )
    return apply_settings(get_profile("b200-mtp"), flags).tokens_per_second(concurrency)


if __name__ == "__main__":
    main()
