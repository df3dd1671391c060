"""Figure (b): fleet utilization with one of seven servers three times slower.

Seven simulated B200 + MTP servers, server 3 with ``slow=3``. generate() runs a prompt set with the production
settings (64 in flight per server). Utilization = tokens the fleet actually produced ÷ the servers' summed
capacity, both from the simulator: produced tokens come from its ground-truth records (each request's tokens
spread over its first-token → finish interval), capacity from /sim/info at the server's batch cap (speed and
``slow`` included). The steady window runs from ``--ramp`` seconds after the first request to the moment a
worker took the last fresh prompt (``fresh_prompts_taken``): after that the queue holds only the next turns of
conversations under way, each waiting for its previous answer, and the fleet drains (a long chat's fifteenth turn
is sent long after the last prompt was). Whole-run utilization, ramp and drain included, is printed too.

    .venv/bin/python benchmarks/generate_fleet_utilization.py [--prompts 4000] [--speed 4] [--max-tokens 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from sim_generate import run_generate, sim_generate_config

from draftgen.generate import work as generate_work
from draftgen.prompts.synthetic import synthetic_rows, write_rows, write_synthetic
from draftgen.sim import SimFleet
from draftgen.sim.profiles import get_profile

OTHER_SHAPES = {"agentic", "long_chat"}  # the generator's rows that are not plain single- or multi-turn chats


def synthetic(path: Path, count: int, shapes: str) -> Path:
    """``count`` synthetic prompts, as this script writes them (``shapes`` "plain": the generator's rows of
    other shapes left out, the set figure 4 was first measured on)."""
    if shapes == "all":
        write_synthetic(path, count, seed=2)
    else:
        rows = (r for r in synthetic_rows(count * 2, seed=2) if r["category"] not in OTHER_SHAPES)
        write_rows(path, list(rows)[:count])
    return path


@contextlib.contextmanager
def fresh_prompts_taken():
    """The wall-clock times at which generate's workers took a fresh prompt (a conversation's first turn), for the
    runs in this process while the context is open: the last one ends the steady window."""
    times: list[float] = []
    original = generate_work.Intake.taken

    def taken(self: generate_work.Intake, work: generate_work.Work) -> None:
        if work.state is generate_work.TurnState.FRESH:
            times.append(time.time())
        original(self, work)

    generate_work.Intake.taken = taken  # type: ignore[method-assign]
    try:
        yield times
    finally:
        generate_work.Intake.taken = original  # type: ignore[method-assign]


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


def running_batch(records: list[dict], server: str, t0: float, t1: float, since: str = "admitted") -> float:
    """The mean number of requests ``server`` was running over [t0, t1] (admission to finish, every outcome: a
    hedged copy that lost held its slot too); with ``since="arrival"``, held by the server, queued ones included
    (what the client kept in flight there)."""
    held = sum(
        max(0.0, min(r["finished"], t1) - max(r[since], t0))
        for r in records
        if r["server"] == server and r.get(since) is not None and r.get("finished") is not None
    )
    return held / (t1 - t0)


def achieved_acceptance(records: list[dict], server: str, t0: float, t1: float) -> float | None:
    """Tokens per verify step of ``server``'s answered requests that finished in [t0, t1]: what its drafts were
    accepted at on this prompt mix (the capacity assumes the profile's mean)."""
    done = [
        r
        for r in records
        if r["server"] == server
        and r.get("outcome") == "ok"
        and t0 <= r["finished"] <= t1
        and r.get("verify_steps")
    ]
    steps = sum(r["verify_steps"] for r in done)
    return sum(r["completion_tokens"] for r in done) / steps if steps else None


def utilization(
    fleet: SimFleet,
    records: list[dict],
    concurrency: int,
    ramp: float,
    whole_s: float | None = None,
    occupancy: list[dict] | None = None,
    last_fresh: float | None = None,
) -> dict:
    """Tokens produced ÷ summed capacity over the steady window (``ramp`` s after the first request to
    ``last_fresh``, the last fresh prompt taken, else the last send) and over the whole run (``whole_s``, else
    first request to last finish), per server too, from the ground truth. ``records`` are the answered requests; ``occupancy`` (every chat request, any outcome) gives
    each server's mean running batch, so a gap can be told apart: slots left empty (the dispatcher) or full
    slots producing less than the capacity assumes (acceptance, prefill)."""
    caps = capacities(fleet, concurrency)
    capacity = sum(caps)
    t0 = min(r["arrival"] for r in records) + ramp
    t1 = last_fresh if last_fresh is not None else max(r["arrival"] for r in records)
    by_server: dict[str, float] = defaultdict(float)
    rows: dict[str, int] = defaultdict(int)
    for record in records:
        by_server[record["server"]] += tokens_in(record, t0, t1)
        rows[record["server"]] += 1
    window = t1 - t0
    if window <= 0:
        raise SystemExit(
            f"no steady window: the last fresh prompt was taken {t1 - t0 + ramp:.1f} s after the first request, "
            f"within --ramp {ramp:g} s; use more prompts (--prompts) or a shorter --ramp"
        )
    span = whole_s or max(r["finished"] for r in records) - min(r["arrival"] for r in records)
    # Prefill stalls a server's whole batch for its seconds, which the decode capacity above leaves out: the
    # share of the servers' time it took in the window is what utilization cannot reach.
    profile, speed = get_profile(fleet.profile), fleet.speed
    prefill = sum(
        profile.prefill_seconds(r["prompt_tokens"] - r.get("cached_tokens", 0)) / speed
        for r in records
        if r.get("admitted") is not None and t0 <= r["admitted"] <= t1
    )
    batch_cap = min(concurrency, profile.max_running_requests)
    held = occupancy if occupancy is not None else records
    batches = [running_batch(held, url, t0, t1) for url in fleet.urls]
    in_flight = [running_batch(held, url, t0, t1, since="arrival") for url in fleet.urls]
    accepts = [achieved_acceptance(records, url, t0, t1) for url in fleet.urls]
    measured = [a for a in accepts if a]
    acceptance = sum(measured) / len(measured) if measured else profile.accept_mean
    return {
        "prefill_share": prefill / (window * fleet.servers),
        "batch_cap": batch_cap,
        "slots_filled": sum(min(b, batch_cap) for b in batches) / (batch_cap * fleet.servers),
        "in_flight": sum(in_flight) / fleet.servers,
        "acceptance_achieved": acceptance,
        "acceptance_profile": profile.accept_mean,
        # what is left once the prefill's share of the time and the mix's acceptance are allowed for: the slots
        # the dispatcher (or the server's admission) left empty
        "steady_accounted": sum(by_server.values())
        / window
        / capacity
        / (1 - prefill / (window * fleet.servers))
        / (acceptance / profile.accept_mean),
        "steady": sum(by_server.values()) / window / capacity,
        "whole_run": sum(r["completion_tokens"] for r in records) / span / capacity,
        "window_s": window,
        "capacity": capacity,
        "servers": [
            (url, caps[i], by_server[url] / window, rows[url], batches[i], in_flight[i], accepts[i])
            for i, url in enumerate(fleet.urls)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--speed", type=float, default=4.0, help="simulated clock speed-up")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds excluded at the start")
    parser.add_argument(
        "--shapes",
        choices=("all", "plain"),
        default="all",
        help="the generator's every shape, or without its long chats and agentic rows",
    )
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
            synthetic(path, args.prompts, args.shapes)
            config = sim_generate_config(
                fleet,
                path,
                Path(tmp) / "run",
                max_tokens=args.max_tokens,
                concurrency_per_server=args.concurrency,
                stream=False,  # as measured before streaming was the default: the client stays light
            )
            started = time.time()
            with fresh_prompts_taken() as fresh:
                result = run_generate(config)
            ended = time.time()
            chats = [r for r in fleet.truth() if r.get("kind") == "chat"]
            records = [r for r in chats if r.get("outcome") == "ok"]
            figures = utilization(
                fleet,
                records,
                args.concurrency,
                args.ramp,
                ended - started,
                occupancy=chats,
                last_fresh=max(fresh),
            )
    print(
        f"7 servers (b200-mtp, speed {args.speed:g}), server 3 slow=3; {args.prompts} prompts, "
        f"max_tokens {args.max_tokens}, {args.concurrency} in flight per server; {result}"
    )
    window = figures["window_s"]
    for index, (url, cap, achieved, requests, batch, held, accept) in enumerate(figures["servers"]):
        print(
            f"  server {index} {url}: capacity {cap:8,.0f} tok/s  achieved {achieved:8,.0f} "
            f"tok/s ({achieved / cap:.3f})  {requests:5} requests; running batch {batch:5.1f} of "
            f"{figures['batch_cap']} ({held:4.1f} held), acceptance {accept or 0:.2f}"
        )
    achieved = sum(s[2] for s in figures["servers"])
    print(
        f"steady window {window:.1f} s: achieved {achieved:,.0f} tok/s of {figures['capacity']:,.0f} summed capacity"
    )
    print(
        f"utilization (steady) = {figures['steady']:.3f}   (goal >= 0.97; prefill took "
        f"{figures['prefill_share']:.1%} of the servers' time in the window, which the capacity leaves out)"
    )
    print(
        f"slots filled {figures['slots_filled']:.3f} (mean running batch ÷ the cap; the client kept "
        f"{figures['in_flight']:.1f} requests at each server); acceptance achieved "
        f"{figures['acceptance_achieved']:.2f} per step against the profile's {figures['acceptance_profile']:.2f} "
        "the capacity assumes"
    )
    print(
        f"utilization with the prefill's time and the mix's acceptance allowed for = {figures['steady_accounted']:.3f}"
    )
    print(f"utilization (whole run, ramp and drain included) = {figures['whole_run']:.3f}")
    print(
        json.dumps(
            {
                "utilization_steady": round(figures["steady"], 4),
                "utilization_whole_run": round(figures["whole_run"], 4),
                "utilization_accounted": round(figures["steady_accounted"], 4),
                "window_s": round(window, 1),
                "prefill_share": round(figures["prefill_share"], 4),
                "slots_filled": round(figures["slots_filled"], 4),
                "in_flight": round(figures["in_flight"], 1),
                "acceptance_achieved": round(figures["acceptance_achieved"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
