"""Figure 5: the slow tail — wall time against the capacity-bound ideal, with and without hedging.

Seven simulated B200 + MTP servers, server 3 with ``slow=3``; generate() runs the same prompt set twice, once with
``hedge_slow_ratio`` 0 (no hedging) and once with the default 0.7; then once per ``--gateway-policies`` entry
through SMG (SGLang's gateway) in front of the same seven, hedging on, ``concurrency_per_server`` seven times as
large so as many requests are in flight. Through one gateway URL generate sees a single server: nothing is slower
than the fleet's median, so hedging has nothing to act on and the tail is the gateway's policy's. The
capacity-bound ideal is the time the stored
tokens would take at the fleet's summed capacity (each server's tokens/s at its batch cap, from /sim/info, speed
and ``slow`` included): no schedule can beat it. The figure is ideal ÷ wall (1.0 = no time lost to ramp, tail or
imbalance). The same run on seven equal servers is printed as the reference of what ramp and drain alone cost.
Each run also prints ``clock_kept`` (the servers' planned ÷ actual step time over it: below 1.0 the machine starved
the simulators and that run's figure drops with it) and the busiest server's share of the requests (1/7 when
even).

    .venv/bin/python benchmarks/generate_tail_hedge.py [--prompts 1400] [--speed 2] [--max-tokens 1024] [--turns last]
        [--gateway-policies cache_aware,least_load]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sim_generate import run_generate, sim_generate_config

from draftgen.generate.report import summary
from draftgen.prompts.synthetic import write_synthetic
from draftgen.serve.router import RouterProcess
from draftgen.sim import SimFleet

SERVERS = 7


def sim_clocks(fleet: SimFleet) -> list[dict]:
    """Each server's clock counters now: the wall seconds its steps should have taken, and took."""
    return [fleet.info(index)["clock_kept"] for index in range(fleet.servers)]


def clock_kept(before: list[dict], after: list[dict]) -> float:
    """Planned ÷ actual step time between two readings, the servers together (1.0: on time)."""
    planned = sum(a["planned_s"] - b["planned_s"] for b, a in zip(before, after, strict=True))
    actual = sum(a["actual_s"] - b["actual_s"] for b, a in zip(before, after, strict=True))
    return planned / actual if actual > 0 else 1.0


def capacity(fleet: SimFleet, concurrency: int) -> float:
    """Summed tokens/s of the fleet with every server at its batch cap (or ``concurrency`` if lower)."""
    total = 0.0
    for index in range(fleet.servers):
        info = fleet.info(index)
        batch = min(concurrency, info["profile"]["max_running_requests"])
        curve = {int(k): v for k, v in info["capacity_tok_s_by_batch"].items()}
        total += curve[batch] if batch in curve else curve[max(b for b in curve if b <= batch)]
    return total


def one_run(
    args: argparse.Namespace, tmp: Path, name: str, slow: bool, hedge: float, gateway: str | None = None
) -> dict:
    fleet = SimFleet(
        servers=SERVERS,
        profile="b200-mtp",
        speed=args.speed,
        per_server_faults={3: ["slow=3"]} if slow else {},
        work_dir=tmp / f"sim-{name}",
    )
    with fleet:
        prompts = tmp / "prompts.jsonl"
        if not prompts.exists():
            write_synthetic(prompts, args.prompts, seed=5)
        router = None
        servers, concurrency = fleet.urls, args.concurrency
        if gateway is not None:
            router = RouterProcess(fleet.urls, policy=gateway, log_dir=tmp / f"smg-{name}")
            servers, concurrency = [router.start()], args.concurrency * SERVERS
        try:
            config = sim_generate_config(
                fleet,
                prompts,
                tmp / f"run-{name}",
                servers=servers,
                max_tokens=args.max_tokens,
                turns=args.turns,
                concurrency_per_server=concurrency,
                hedge_slow_ratio=hedge,
            )
            clocks = sim_clocks(fleet)
            result = run_generate(config, progress=False)
            kept = clock_kept(clocks, sim_clocks(fleet))
        finally:
            if router is not None:
                router.stop()
        cap = capacity(fleet, args.concurrency)
        truth = fleet.truth()
    row = summary(config.out_dir).to_dicts()[0]
    assert row["rows"] == row["unique_ids"] == args.prompts, row  # exactly once, every prompt
    wall = result.outcome.wall_s
    ideal = row["completion_tokens"] / cap
    aborted = [r for r in truth if r.get("kind") == "chat" and r.get("outcome") == "client_disconnected"]
    answered = [r for r in truth if r.get("kind") == "chat" and r.get("outcome") == "ok"]
    per_server = [sum(r["server"] == url for r in answered) for url in fleet.urls]
    return {
        "run": name,
        "wall_s": round(wall, 1),
        "ideal_s": round(ideal, 1),
        "ideal_over_wall": round(ideal / wall, 3),
        "hedged": result.outcome.hedged,
        "hedge_wins": result.outcome.hedge_wins,
        "cancelled_copies": len(aborted),
        "wasted_tokens": sum(r.get("completion_tokens") or 0 for r in aborted),
        "clock_kept": round(kept, 3),
        # how evenly the requests were spread: the busiest server's share (1/7 = 0.143 when even)
        "busiest_server_share": round(max(per_server) / max(1, sum(per_server)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1400)
    parser.add_argument("--speed", type=float, default=2.0, help="simulated clock speed-up")
    parser.add_argument(
        "--turns",
        choices=("last", "all"),
        default="last",
        help="last: one request per prompt (the issue's setup)",
    )
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--skip-reference", action="store_true", help="skip the seven-equal-servers run")
    parser.add_argument(
        "--gateway-policies",
        default="cache_aware,least_load",
        help="SMG policies to run the slow fleet through, hedging on (comma-separated; empty: none)",
    )
    args = parser.parse_args()
    print(
        f"7 servers (b200-mtp, speed {args.speed:g}), {args.prompts} prompts, max_tokens {args.max_tokens}, "
        f"{args.concurrency} in flight per server"
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        plan: list[tuple[str, bool, float, str | None]] = [
            ("slow, no hedge", True, 0.0, None),
            ("slow, hedged", True, 0.7, None),
        ]
        for policy in filter(None, args.gateway_policies.split(",")):
            plan.append((f"slow, smg {policy}", True, 0.7, policy))
        if not args.skip_reference:
            plan.append(("7 equal servers", False, 0.0, None))
        for name, slow, hedge, gateway in plan:
            row = one_run(args, Path(tmp), name.replace(" ", "").replace(",", "-"), slow, hedge, gateway)
            row["run"] = name
            runs.append(row)
            print(
                f"  {name:22} wall {row['wall_s']:6.1f} s  ideal {row['ideal_s']:6.1f} s  "
                f"ideal/wall {row['ideal_over_wall']:.3f}  hedged {row['hedged']} (won {row['hedge_wins']}), "
                f"{row['cancelled_copies']} cancelled copies ({row['wasted_tokens']:,} tokens); "
                f"clock kept {row['clock_kept']:.2f}; busiest server {row['busiest_server_share']:.1%} of requests",
                flush=True,
            )
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
