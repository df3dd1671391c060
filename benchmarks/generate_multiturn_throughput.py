"""Figure: does the fleet stay as busy with 2-turn conversations (turns: all) as with single-turn prompts?

A conversation's second request cannot start before its first answer is back, so multi-turn generation could
leave slots idle. Two runs on the same simulated fleet (B200 + MTP timing), same settings:

  * multi-turn: N conversations ``[user, assistant (source), user]`` with ``turns: all`` → 2N requests;
  * baseline:   2N single-turn prompts (the same questions, each on its own) → 2N requests, the same token
    volume (the simulator's completion lengths come from the same distribution).

Output tok/s = completion tokens the servers produced per second, from the simulator's ground truth, in the
steady window (``--ramp`` s after the first request to the last request sent) and over the whole run; busy =
requests running on the servers in the steady window ÷ their batch cap (from the same truth). The figures are
the ratios multi-turn / baseline (1.0 = the fleet is exactly as busy). The simulated clock slows when the machine
is loaded, so after one discarded warm-up run the runs alternate (baseline, multi-turn, baseline, ...) and the
median ratio of neighbouring pairs is printed.

    .venv/bin/python benchmarks/generate_multiturn_throughput.py [--conversations 250] [--speed 4] [--pairs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from generate_fleet_utilization import tokens_in
from sim_generate import run_generate, sim_generate_config

from draftgen.prompts.synthetic import synthetic_rows
from draftgen.sim import SimFleet


def question(index: int, row: dict) -> str:
    return f"[{index}] " + next(m["content"] for m in row["messages"] if m["role"] == "user")


def write_sets(folder: Path, conversations: int) -> tuple[Path, Path]:
    """The same 2N questions as N two-turn conversations and as 2N single-turn prompts."""
    firsts = list(synthetic_rows(conversations * 2, seed=31))
    multi, single = folder / "multi.jsonl", folder / "single.jsonl"
    with open(multi, "w") as m_out, open(single, "w") as s_out:
        for index in range(conversations):
            q1, q2 = question(2 * index, firsts[2 * index]), question(2 * index + 1, firsts[2 * index + 1])
            messages = [
                {"role": "user", "content": q1},
                {"role": "assistant", "content": "A source answer the target model did not write."},
                {"role": "user", "content": q2},
            ]
            m_out.write(json.dumps({"id": f"c{index}", "messages": messages}) + "\n")
            for turn, text in enumerate((q1, q2)):
                s_out.write(
                    json.dumps({"id": f"c{index}-{turn}", "messages": [{"role": "user", "content": text}]})
                )
                s_out.write("\n")
    return multi, single


def measure(fleet: SimFleet, prompts: Path, out: Path, args: argparse.Namespace, turns: str) -> dict:
    since = time.time()
    config = sim_generate_config(
        fleet,
        prompts,
        out,
        max_tokens=args.max_tokens,
        concurrency_per_server=args.concurrency,
        turns=turns,
    )
    started = time.time()
    result = run_generate(config, progress=False)
    ended = time.time()
    records = [
        r
        for r in fleet.truth()
        if r.get("kind") == "chat" and r.get("outcome") == "ok" and r["arrival"] >= since and r["finished"]
    ]
    records = [r for r in records if (r.get("completion_tokens") or 0) > 8]  # not the preflight probes
    t0 = min(r["arrival"] for r in records) + args.ramp
    t1 = max(r["arrival"] for r in records)
    steady = sum(tokens_in(r, t0, t1) for r in records) / (t1 - t0)
    whole = sum(r["completion_tokens"] for r in records) / (ended - started)
    running = sum(
        max(0.0, min(r["finished"], t1) - max(r["admitted"], t0)) for r in records if r.get("admitted")
    )
    cap = min(args.concurrency, fleet.info(0)["profile"]["max_running_requests"]) * args.servers
    return {
        "busy": running / (t1 - t0) / cap,
        "run": str(result),
        "requests": len(records),
        "prompt_tokens": sum(r["prompt_tokens"] for r in records) / len(records),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
        "steady_tok_s": steady,
        "whole_tok_s": whole,
        "window_s": t1 - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=250)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--speed", type=float, default=4.0, help="simulated clock speed-up")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--ramp", type=float, default=5.0, help="seconds excluded at the start")
    parser.add_argument("--pairs", type=int, default=2, help="baseline + multi-turn runs, alternating")
    args = parser.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        folder = Path(tmp)
        multi, single = write_sets(folder, args.conversations)
        fleet = SimFleet(servers=args.servers, profile="b200-mtp", speed=args.speed, work_dir=folder / "sim")
        with fleet:
            measure(
                fleet, single, folder / "warm-up", args, "last"
            )  # the first run on a fresh fleet is slower
            for index in range(args.pairs):
                base = measure(fleet, single, folder / f"single-{index}", args, "last")
                turns = measure(fleet, multi, folder / f"multi-{index}", args, "all")
                pairs.append((base, turns))
    print(
        f"{args.servers} servers (b200-mtp, speed {args.speed:g}), {args.concurrency} in flight per server, "
        f"max_tokens {args.max_tokens}"
    )
    for base, turns in pairs:
        for name, run in (("single-turn", base), ("2-turn (turns: all)", turns)):
            print(
                f"  {name:20} {run['requests']:5} requests (prompt {run['prompt_tokens']:4.0f} tokens on average) "
                f"{run['completion_tokens']:9,} tokens  steady "
                f"{run['steady_tok_s']:8,.0f} tok/s, busy {run['busy']:.3f} over {run['window_s']:.0f} s   whole run "
                f"{run['whole_tok_s']:8,.0f} tok/s   [{run['run']}]"
            )
    ratios = {
        key: statistics.median(turns[key] / base[key] for base, turns in pairs)
        for key in ("steady_tok_s", "whole_tok_s", "busy")
    }
    print(
        f"2-turn / single-turn (median of {len(pairs)} pairs): output tok/s steady {ratios['steady_tok_s']:.3f}, "
        f"whole run {ratios['whole_tok_s']:.3f}; busy (running / batch cap) {ratios['busy']:.3f}"
    )
    print(json.dumps({f"ratio_{k}": round(v, 4) for k, v in ratios.items()}))


if __name__ == "__main__":
    main()
