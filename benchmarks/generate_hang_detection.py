"""Figure: how soon a wedged server is noticed, and how often a healthy one is falsely presumed hung.

Two simulated B200 + MTP servers at production settings (max_tokens 4096, 64 in flight each, thinking on);
server 1's scheduler wedges at its ``--wedge-after``-th request (running and later requests hang while /health
says 200). generate() runs twice with the production ``request_timeout_s`` (1800 s), ``hang_min_s`` (300 s) and
``server_silence_s`` (120 s) on the simulator's clock (divided by ``--speed``): once with the defaults (silence
watch + learned deadlines), once with learned deadlines only (what an engine without /health_generate gets).
Printed, in simulated seconds: the time from the wedge to server 1 being benched, against the wait with only
``request_timeout_s`` (the baseline, at least 1800 s from the same wedge). False alarms = failures on the
healthy server (goal 0) out of the requests it answered.

    .venv/bin/python benchmarks/generate_hang_detection.py [--prompts 1500] [--speed 20] [--wedge-after 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sim_generate import run_generate, sim_generate_config

from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim import SimFleet

PRODUCTION_TIMEOUT_S = 1800.0
PRODUCTION_HANG_MIN_S = 300.0
PRODUCTION_SILENCE_S = 120.0


def measure(args: argparse.Namespace, tmp: Path, label: str, **settings: object) -> dict:
    """One generate run against a fresh fleet whose server 1 wedges; returns the detection figures."""
    speed = args.speed
    fleet = SimFleet(
        servers=2,
        profile="b200-mtp",
        speed=speed,
        per_server_faults={1: [f"wedge_after={args.wedge_after}"]},
        work_dir=tmp / label / "sim",
    )
    with fleet:
        path = tmp / label / "prompts.jsonl"
        write_synthetic(path, args.prompts, seed=5)
        production = {
            "max_tokens": 4096,
            "concurrency_per_server": args.concurrency,
            "request_timeout_s": PRODUCTION_TIMEOUT_S / speed,
            "hang_min_s": PRODUCTION_HANG_MIN_S / speed,
            "server_silence_s": PRODUCTION_SILENCE_S / speed,
        }
        config = sim_generate_config(fleet, path, tmp / label / "run", **{**production, **settings})
        result = run_generate(config, progress=False)
        wedged_truth = fleet.truth(1)
    healthy, wedged = fleet.urls
    events = result.events
    learned = {server: what for _, server, what in events if what.startswith("hang deadline learned")}
    down = [(t, what) for t, server, what in events if server == wedged and "marked down" in what]
    chats = sorted(r["arrival"] for r in wedged_truth if r.get("kind") == "chat")
    wedge_at = chats[args.wedge_after - 1]  # the request that wedged it
    stats = {s.url: s for s in result.outcome.servers}
    detect_s = (down[0][0] - wedge_at) * speed
    print(f"{label}: status {result.status}, {result.completed} stored, {result.failed} failed")
    for server in (healthy, wedged):
        print(f"  {server}: {learned.get(server, 'no learned deadline')}")
    print(f"  benched: {down[0][1]}")
    print(
        f"  wedge → benched: {detect_s:,.0f} s simulated (request_timeout_s alone: {PRODUCTION_TIMEOUT_S:,.0f} s "
        f"or more; ratio {detect_s / PRODUCTION_TIMEOUT_S:.2f}); false alarms on the healthy server: "
        f"{stats[healthy].errors} of {stats[healthy].completed} requests"
    )
    return {
        "detect_s": round(detect_s, 1),
        "ratio": round(detect_s / PRODUCTION_TIMEOUT_S, 3),
        "false_alarms": stats[healthy].errors,
        "healthy_completed": stats[healthy].completed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1500)
    parser.add_argument("--speed", type=float, default=20.0, help="simulated clock speed-up")
    parser.add_argument("--wedge-after", type=int, default=300, help="server 1 wedges at this request")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(
        f"2 servers (b200-mtp, speed {args.speed:g}), server 1 wedges at request {args.wedge_after}; "
        f"{args.prompts} prompts, max_tokens 4096, {args.concurrency} in flight each; production timeouts "
        f"on the simulated clock"
    )
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        figures = {
            "defaults": measure(args, Path(tmp), "defaults (silence watch + learned deadlines)"),
            "deadline_only": measure(
                args, Path(tmp), "learned deadlines only (server_silence_s 0)", server_silence_s=0
            ),
        }
    print(json.dumps({"baseline_s": PRODUCTION_TIMEOUT_S, **figures}))


if __name__ == "__main__":
    main()
