"""Figure 6: fourteen workers, one three times slower — draftgen's own pull-based list vs SMG, SGLang's gateway.

Fourteen simulated B200 + MTP workers (server 6 ``slow=3``) serve five generate runs in turn, each over fresh
prompts: (1) ``servers`` lists the fourteen URLs (pull-based: each keeps ``concurrency_per_server`` in flight),
then one URL, SMG (the pinned ``smg``) with each of ``--policy cache_aware``, ``round_robin``, ``least_load`` and
``power_of_two``; through the gateway ``concurrency_per_server`` is fourteen times as large, so the same number of
requests is in flight.
Utilization = tokens the workers produced ÷ their summed capacity (figure (b)'s method: the simulator's ground
truth, each request's tokens spread over first token → finish; capacity from /sim/info at the batch cap), over the
steady window (``--ramp`` s after the first request to the last request sent), and over the whole run. Each run
also prints ``clock_kept``, the workers' planned ÷ actual step time over it (1.0: the simulators kept their clock;
lower: the machine starved them, and every figure of that run is lower with it), and how evenly the requests were
spread (the busiest worker's share; 1/14 = 0.071 when even).

    .venv/bin/python benchmarks/generate_router_vs_direct.py [--prompts 2000] [--speed 1] [--max-tokens 512]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from generate_fleet_utilization import tokens_in
from generate_tail_hedge import capacity, clock_kept, sim_clocks
from sim_generate import run_generate, sim_generate_config

from draftgen.prompts.synthetic import write_synthetic
from draftgen.serve.router import RouterProcess
from draftgen.sim import SimFleet

WORKERS = 14
SLOW = 6


def measure(fleet: SimFleet, started: float, ended: float, ramp: float, cap: float) -> dict:
    records = [
        r
        for r in fleet.truth()
        if r.get("kind") == "chat" and r.get("outcome") == "ok" and started <= r["arrival"] <= ended
    ]
    t0 = min(r["arrival"] for r in records) + ramp
    t1 = max(r["arrival"] for r in records)
    produced: dict[str, float] = defaultdict(float)
    for record in records:
        produced[record["server"]] += tokens_in(record, t0, t1)
    slow_url = fleet.urls[SLOW]
    steady = sum(produced.values()) / (t1 - t0) / cap
    whole = sum(r["completion_tokens"] for r in records) / (ended - started) / cap
    return {
        "utilization_steady": round(steady, 3),
        "utilization_whole_run": round(whole, 3),
        "slow_worker_share_of_requests": round(
            sum(r["server"] == slow_url for r in records) / len(records), 3
        ),
        # how evenly the requests were spread: the busiest worker's share (1/14 = 0.071 when even)
        "busiest_worker_share_of_requests": round(
            max(sum(r["server"] == url for r in records) for url in fleet.urls) / len(records), 3
        ),
        "window_s": round(t1 - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000, help="per run")
    parser.add_argument("--speed", type=float, default=1.0, help="simulated clock speed-up")
    parser.add_argument(
        "--turns",
        choices=("last", "all"),
        default="last",
        help="last: one request per prompt (the issue's setup)",
    )
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64, help="in flight per worker")
    parser.add_argument("--ramp", type=float, default=5.0, help="seconds excluded at the start")
    parser.add_argument(
        "--smg-args",
        default="",
        help="extra flags for SMG, space-separated, e.g. --smg-args=--disable-worker-overload-protection",
    )
    args = parser.parse_args()
    print(
        f"{WORKERS} workers (b200-mtp, speed {args.speed:g}), worker {SLOW} slow=3; {args.prompts} prompts per run, "
        f"max_tokens {args.max_tokens}, {args.concurrency} in flight per worker; SMG {args.smg_args or 'as shipped'}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp_name:
        tmp = Path(tmp_name)
        fleet = SimFleet(
            servers=WORKERS,
            profile="b200-mtp",
            speed=args.speed,
            per_server_faults={SLOW: ["slow=3"]},
            work_dir=tmp / "sim",
        )
        with fleet:
            cap = capacity(fleet, args.concurrency)
            for seed, (name, policy) in enumerate(
                [
                    ("direct list", None),
                    ("smg cache_aware", "cache_aware"),
                    ("smg round_robin", "round_robin"),
                    ("smg least_load", "least_load"),
                    ("smg power_of_two", "power_of_two"),
                ]
            ):
                prompts = tmp / f"prompts-{seed}.jsonl"
                write_synthetic(prompts, args.prompts, seed=100 + seed)
                router = None
                servers = fleet.urls
                concurrency = args.concurrency
                if policy is not None:
                    router = RouterProcess(
                        fleet.urls,
                        policy=policy,
                        log_dir=tmp / "router",
                        extra_args=tuple(args.smg_args.split()),
                    )
                    servers = [router.start()]
                    concurrency = args.concurrency * WORKERS
                try:
                    config = sim_generate_config(
                        fleet,
                        prompts,
                        tmp / f"run-{seed}",
                        servers=servers,
                        max_tokens=args.max_tokens,
                        turns=args.turns,
                        concurrency_per_server=concurrency,
                        acceptance_interval_s=0,
                    )
                    clocks = sim_clocks(fleet)
                    started = time.time()
                    result = run_generate(config, progress=False)
                    ended = time.time()
                    kept = clock_kept(clocks, sim_clocks(fleet))
                finally:
                    if router is not None:
                        router.stop()
                assert result.completed == args.prompts, result
                row = {
                    "run": name,
                    "wall_s": round(ended - started, 1),
                    **measure(fleet, started, ended, args.ramp, cap),
                    "clock_kept": round(kept, 3),
                }
                results.append(row)
                print(
                    f"  {name:19} utilization {row['utilization_steady']:.3f} steady, "
                    f"{row['utilization_whole_run']:.3f} whole run ({row['wall_s']:.0f} s); slow worker took "
                    f"{row['slow_worker_share_of_requests']:.1%} of the requests, the busiest "
                    f"{row['busiest_worker_share_of_requests']:.1%}; clock kept {row['clock_kept']:.2f}",
                    flush=True,
                )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
