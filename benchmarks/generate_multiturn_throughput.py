"""Figure: does the fleet stay as busy with 2-turn conversations (turns: all) as with single-turn prompts?

A conversation's second request cannot start before its first answer is back, so multi-turn generation could
leave slots idle. Two runs on the same simulated fleet (B200 + MTP timing), same settings:

  * multi-turn: N conversations ``[user, assistant (source), user]`` with ``turns: all`` → 2N requests;
  * baseline:   2N single-turn prompts (the same questions, each on its own) → 2N requests, the same token
    volume (the simulator's completion lengths come from the same distribution).

Output tok/s = completion tokens the servers produced per second, from the simulator's ground truth, in the
steady window (``--ramp`` s after the first request to the last request sent) and over the whole run. The
figure is the ratio multi-turn / baseline (1.0 = the fleet is exactly as busy).

    .venv/bin/python benchmarks/generate_multiturn_throughput.py [--conversations 600] [--speed 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from generate_fleet_utilization import tokens_in
from sim_generate import run_generate, sim_generate_config

from draftgen.sim import SimFleet
from draftgen.synthetic import synthetic_rows


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
    return {
        "run": str(result),
        "requests": len(records),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
        "steady_tok_s": steady,
        "whole_tok_s": whole,
        "window_s": t1 - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=600)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--speed", type=float, default=8.0, help="simulated clock speed-up")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--ramp", type=float, default=5.0, help="seconds excluded at the start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        folder = Path(tmp)
        multi, single = write_sets(folder, args.conversations)
        fleet = SimFleet(servers=args.servers, profile="b200-mtp", speed=args.speed, work_dir=folder / "sim")
        with fleet:
            base = measure(fleet, single, folder / "single", args, "last")
            turns = measure(fleet, multi, folder / "multi", args, "all")
    print(
        f"{args.servers} servers (b200-mtp, speed {args.speed:g}), {args.concurrency} in flight per server, "
        f"max_tokens {args.max_tokens}"
    )
    for name, run in (("single-turn", base), ("2-turn (turns: all)", turns)):
        print(
            f"  {name:20} {run['requests']:5} requests {run['completion_tokens']:9,} tokens  steady "
            f"{run['steady_tok_s']:8,.0f} tok/s over {run['window_s']:.0f} s   whole run {run['whole_tok_s']:8,.0f} "
            f"tok/s   [{run['run']}]"
        )
    ratio_steady = turns["steady_tok_s"] / base["steady_tok_s"]
    ratio_whole = turns["whole_tok_s"] / base["whole_tok_s"]
    print(f"output tok/s, 2-turn / single-turn: steady {ratio_steady:.3f}, whole run {ratio_whole:.3f}")
    print(json.dumps({"ratio_steady": round(ratio_steady, 4), "ratio_whole_run": round(ratio_whole, 4)}))


if __name__ == "__main__":
    main()
