"""Figure (b): fleet utilization with one of seven servers three times slower.

Seven simulated B200 + MTP servers, server 3 with ``slow=3``. generate() runs a prompt set with the production
settings (64 in flight per server). Utilization = tokens the fleet actually produced ÷ the servers' summed
capacity, both from the simulator: produced tokens come from its ground-truth records (each request's tokens
spread over its first-token → finish interval), capacity from /sim/info at the server's batch cap (speed and
``slow`` included). The steady window runs from ``--ramp`` seconds after the first request to the moment the
last prompt was sent (after that the queue is empty and the fleet can only drain). Whole-run utilization,
ramp and drain included, is printed too.

    .venv/bin/python benchmarks/generate_fleet_utilization.py [--prompts 4000] [--speed 4] [--max-tokens 1024]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from sim_generate import run_generate, sim_generate_config

from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim import SimFleet
from draftgen.sim.profiles import get_profile


def tokens_in(record: dict, t0: float, t1: float) -> float:
    """Tokens of one request produced inside [t0, t1], spread evenly over first token → finish."""
    start, end = record.get("first_token"), record["finished"]
    tokens = record.get("completion_tokens") or 0
    if start is None or tokens == 0:
        return 0.0
    if end <= start:
        return float(tokens) if t0 <= end <= t1 else 0.0
    overlap = max(0.0, min(end, t1) - max(start, t0))
    return tokens * overlap / (end - start)


def capacities(fleet: SimFleet, concurrency: int) -> list[float]:
    """Each server's tokens/s at its batch cap (or ``concurrency`` if lower), speed and ``slow`` included."""
    caps = []
    for index in range(fleet.servers):
        info = fleet.info(index)
        batch = min(concurrency, info["profile"]["max_running_requests"])
        curve = {int(k): v for k, v in info["capacity_tok_s_by_batch"].items()}
        caps.append(curve[batch] if batch in curve else curve[max(b for b in curve if b <= batch)])
    return caps


def utilization(
    fleet: SimFleet, records: list[dict], concurrency: int, ramp: float, whole_s: float | None = None
) -> dict:
    """Tokens produced ÷ summed capacity over the steady window (``ramp`` s after the first request to the last
    send) and over the whole run (``whole_s``, else first request to last finish), per server too, from the
    ground truth."""
    caps = capacities(fleet, concurrency)
    capacity = sum(caps)
    t0 = min(r["arrival"] for r in records) + ramp
    t1 = max(r["arrival"] for r in records)
    by_server: dict[str, float] = defaultdict(float)
    rows: dict[str, int] = defaultdict(int)
    for record in records:
        by_server[record["server"]] += tokens_in(record, t0, t1)
        rows[record["server"]] += 1
    window = t1 - t0
    span = whole_s or max(r["finished"] for r in records) - min(r["arrival"] for r in records)
    # Prefill stalls a server's whole batch for its seconds, which the decode capacity above leaves out: the
    # share of the servers' time it took in the window is what utilization cannot reach.
    profile, speed = get_profile(fleet.profile), fleet.speed
    prefill = sum(
        profile.prefill_seconds(r["prompt_tokens"] - r.get("cached_tokens", 0)) / speed
        for r in records
        if r.get("admitted") is not None and t0 <= r["admitted"] <= t1
    )
    return {
        "prefill_share": prefill / (window * fleet.servers),
        "steady": sum(by_server.values()) / window / capacity,
        "whole_run": sum(r["completion_tokens"] for r in records) / span / capacity,
        "window_s": window,
        "capacity": capacity,
        "servers": [(url, caps[i], by_server[url] / window, rows[url]) for i, url in enumerate(fleet.urls)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--speed", type=float, default=4.0, help="simulated clock speed-up")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds excluded at the start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        fleet = SimFleet(
            servers=7,
            profile="b200-mtp",
            speed=args.speed,
            per_server_faults={3: ["slow=3"]},
            work_dir=Path(tmp) / "sim",
        )
        with fleet:
            path = Path(tmp) / "prompts.jsonl"
            write_synthetic(path, args.prompts, seed=2)
            config = sim_generate_config(
                fleet,
                path,
                Path(tmp) / "run",
                max_tokens=args.max_tokens,
                concurrency_per_server=args.concurrency,
                stream=False,  # as measured before streaming was the default: the client stays light
            )
            started = time.time()
            result = run_generate(config)
            ended = time.time()
            records = [r for r in fleet.truth() if r.get("kind") == "chat" and r.get("outcome") == "ok"]
            figures = utilization(fleet, records, args.concurrency, args.ramp, ended - started)
    print(
        f"7 servers (b200-mtp, speed {args.speed:g}), server 3 slow=3; {args.prompts} prompts, "
        f"max_tokens {args.max_tokens}, {args.concurrency} in flight per server; {result}"
    )
    window = figures["window_s"]
    for index, (url, cap, achieved, requests) in enumerate(figures["servers"]):
        print(
            f"  server {index} {url}: capacity {cap:8,.0f} tok/s  achieved {achieved:8,.0f} "
            f"tok/s ({achieved / cap:.3f})  {requests:5} requests"
        )
    achieved = sum(s[2] for s in figures["servers"])
    print(
        f"steady window {window:.1f} s: achieved {achieved:,.0f} tok/s of {figures['capacity']:,.0f} summed capacity"
    )
    print(
        f"utilization (steady) = {figures['steady']:.3f}   (goal >= 0.97; prefill took "
        f"{figures['prefill_share']:.1%} of the servers' time in the window, which the capacity leaves out)"
    )
    print(f"utilization (whole run, ramp and drain included) = {figures['whole_run']:.3f}")
    print(
        json.dumps(
            {
                "utilization_steady": round(figures["steady"], 4),
                "utilization_whole_run": round(figures["whole_run"], 4),
                "window_s": round(window, 1),
                "prefill_share": round(figures["prefill_share"], 4),
            }
        )
    )


if __name__ == "__main__":
    main()
