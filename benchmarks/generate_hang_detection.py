"""Figure: how soon a wedged server is noticed, and how often a healthy one is falsely presumed hung.

Two simulated B200 + MTP servers at production settings (max_tokens 4096, 64 in flight each, thinking on);
server 1's scheduler wedges at its ``--wedge-after``-th request (running and later requests hang while /health
says 200). generate() runs with the default ``hang_factor`` 3 and the production ``request_timeout_s`` (1800 s)
and ``hang_min_s`` (300 s) on the simulator's clock (divided by ``--speed``). Printed, in simulated seconds:
the learned deadline per server, the time from the wedge to server 1 being marked down, and the same wait
with only ``request_timeout_s`` (the baseline: the hard limit, measured from the same wedge). False alarms =
requests on the healthy server presumed hung (goal 0) out of all it answered.

    .venv/bin/python benchmarks/generate_hang_detection.py [--prompts 1500] [--speed 20] [--wedge-after 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sim_generate import run_generate, sim_generate_config

from draftgen.sim import SimFleet
from draftgen.synthetic import write_synthetic

PRODUCTION_TIMEOUT_S = 1800.0
PRODUCTION_HANG_MIN_S = 300.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1500)
    parser.add_argument("--speed", type=float, default=20.0, help="simulated clock speed-up")
    parser.add_argument("--wedge-after", type=int, default=300, help="server 1 wedges at this request")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    speed = args.speed
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        fleet = SimFleet(
            servers=2,
            profile="b200-mtp",
            speed=speed,
            per_server_faults={1: [f"wedge_after={args.wedge_after}"]},
            work_dir=Path(tmp) / "sim",
        )
        with fleet:
            path = Path(tmp) / "prompts.jsonl"
            write_synthetic(path, args.prompts, seed=5)
            config = sim_generate_config(
                fleet,
                path,
                Path(tmp) / "run",
                max_tokens=4096,
                concurrency_per_server=args.concurrency,
                request_timeout_s=PRODUCTION_TIMEOUT_S / speed,
                hang_min_s=PRODUCTION_HANG_MIN_S / speed,
            )
            result = run_generate(config, progress=False)
            wedged_truth = fleet.truth(1)
    healthy, wedged = fleet.urls
    events = result.outcome.events
    learned = {server: what for _, server, what in events if what.startswith("hang deadline learned")}
    down_at = min(t for t, server, what in events if server == wedged and "marked down" in what)
    chats = [r for r in wedged_truth if r.get("kind") == "chat"]
    wedge_at = sorted(r["arrival"] for r in chats)[args.wedge_after - 1]  # the request that wedged it
    stats = {s.url: s for s in result.outcome.servers}
    detect_s = (down_at - wedge_at) * speed
    print(
        f"2 servers (b200-mtp, speed {speed:g}), server 1 wedges at request {args.wedge_after}; {args.prompts} "
        f"prompts, max_tokens 4096, {args.concurrency} in flight each; status {result.status}, "
        f"{result.completed} stored, {result.failed} failed"
    )
    for server in (healthy, wedged):
        print(f"  {server}: {learned.get(server, 'deadline not learned')}")
    print(
        f"wedge → marked down: {detect_s:,.0f} s simulated; with request_timeout_s alone: "
        f"{PRODUCTION_TIMEOUT_S:,.0f} s or more (ratio {detect_s / PRODUCTION_TIMEOUT_S:.2f})"
    )
    print(
        f"false alarms on the healthy server: {stats[healthy].errors} of {stats[healthy].completed} "
        f"requests (goal 0)"
    )
    print(
        json.dumps(
            {
                "detect_s": round(detect_s, 1),
                "baseline_s": PRODUCTION_TIMEOUT_S,
                "ratio": round(detect_s / PRODUCTION_TIMEOUT_S, 3),
                "false_alarms": stats[healthy].errors,
                "healthy_completed": stats[healthy].completed,
            }
        )
    )


if __name__ == "__main__":
    main()
