"""Figure (d): peak memory (RSS) of the client on a 200K-prompt run.

generate() runs ``--prompts`` synthetic prompts (default 200,000) against simulated servers on the `instant`
profile with tiny completions, in a child process whose RSS is sampled every second. Prompts are streamed and
finished rows flushed every ``batch_save_size``, so memory should stay flat as the run progresses: the script
prints RSS after preflight (the baseline, same process), at each quarter of the run, and the peak.

    .venv/bin/python benchmarks/generate_peak_rss.py [--prompts 200000] [--servers 2] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim import SimFleet

CHILD = r"""
import asyncio, json, sys, threading, time
import psutil
from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.params import build_config

config = build_config(GenerateConfig, json.loads(sys.argv[1]))
process = psutil.Process()
samples = []  # (seconds, rss bytes, rows done)
state = {"done": 0, "stop": False}

def sample():
    t0 = time.monotonic()
    while not state["stop"]:
        samples.append((time.monotonic() - t0, process.memory_info().rss, state["done"]))
        time.sleep(1.0)

async def main():
    plan = await preflight(config)
    baseline = process.memory_info().rss
    threading.Thread(target=sample, daemon=True).start()
    from draftgen.generate import dispatch
    original = dispatch.Dispatcher._keep
    def counting(self, *a, **k):
        kept = original(self, *a, **k)
        state["done"] = self.completed  # conversations stored (a multi-turn one once, at its last turn)
        return kept
    dispatch.Dispatcher._keep = counting
    result = await generate(config, plan, progress=False)
    state["stop"] = True
    return baseline, result

baseline, result = asyncio.run(main())
print(json.dumps({"baseline": baseline, "samples": samples, "completed": result.completed,
                  "wall_s": result.outcome.wall_s}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200_000)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        path = Path(tmp) / "prompts.jsonl"
        write_synthetic(path, args.prompts, seed=4)
        with SimFleet(servers=args.servers, profile="instant", work_dir=Path(tmp) / "sim") as fleet:
            config = {
                "servers": fleet.urls,
                "model": "Qwen/Qwen3.6-27B",
                "prompts": str(path),
                "out_dir": str(Path(tmp) / "run"),
                "max_tokens": args.max_tokens,
                "concurrency_per_server": args.concurrency,
                "batch_save_size": 500,
                "max_truncated_rate": 1.0,
                "max_empty_answer_rate": 1.0,
                "canary": False,
            }
            child = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(config)], capture_output=True, text=True, check=True
            )
    report = json.loads(child.stdout.strip().splitlines()[-1])
    samples = report["samples"]
    peak = max(s[1] for s in samples)
    baseline = report["baseline"]
    print(
        f"{report['completed']:,} prompts in {report['wall_s']:.0f} s on {args.servers} instant servers "
        f"(max_tokens {args.max_tokens}, {args.concurrency} in flight each)"
    )
    print(f"RSS after preflight (baseline): {baseline / 2**20:,.0f} MiB")
    for quarter in (0.25, 0.5, 0.75, 1.0):
        target = quarter * report["completed"]
        sample = next((s for s in samples if s[2] >= target), samples[-1])
        print(f"  at {sample[2]:>7,} rows done ({quarter:.0%}): RSS {sample[1] / 2**20:,.0f} MiB")
    print(f"peak RSS {peak / 2**20:,.0f} MiB = {peak / baseline:.2f}x the baseline   (goal <= 1 GB)")
    print(
        json.dumps(
            {
                "prompts": report["completed"],
                "peak_rss_mib": round(peak / 2**20, 1),
                "baseline_rss_mib": round(baseline / 2**20, 1),
                "peak_over_baseline": round(peak / baseline, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
