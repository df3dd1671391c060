"""Repetition loops ended live: how soon after a loop starts its request ends, what is flagged, and the GPU tokens
saved — on a simulated fleet where a share of prompts falls into a loop.

Simulated B200 + MTP servers with ``loop_rate`` (a share of prompts, drawn from each request's seed, so the same
prompts loop in both runs) fall into a verbatim cycle at a point drawn uniformly over the completion, the cycle's
period log-uniform in 1..``loop_max_period`` tokens, and would run to ``max_tokens``. generate() streams the same
prompt set twice, the loop check on and off. Everything below is read from the simulators' ground truth (per
request: where its loop started, its period, the tokens it would have generated, the tokens it did):

* **ended**: looped requests whose server stopped generating (the client closed the stream) ÷ looped requests whose
  loop reached the rule's length before ``max_tokens`` (the others cannot be seen in time);
* **tokens from the loop's start to the end**: generated tokens − loop start, per ended request (quantiles, and by
  period: the rule needs max(3 · period, 256) tokens of loop; the rest is the time the client took to read them
  and the server to see the connection close);
* **false positives**: stored rows flagged ``repetition_loop`` whose request never looped (must be 0);
* **GPU tokens saved**: every token the fleet generated with the check off − with it on (same prompts), and as a
  share; the sum, over the ended requests, of the tokens their servers would still have generated.

    .venv/bin/python benchmarks/generate_loops.py [--prompts 300] [--servers 2] [--speed 5] [--loop-rate 0.2]
        [--loop-max-period 256] [--max-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
from sim_generate import run_generate, sim_generate_config

from draftgen.client.loops import REPETITION_LOOP, LoopRule
from draftgen.generate.report import summary
from draftgen.prompts.synthetic import write_synthetic
from draftgen.rundir.layout import shard_paths
from draftgen.sim import SimFleet


def one_run(args: argparse.Namespace, tmp: Path, check: bool) -> dict:
    name = "check-on" if check else "check-off"
    prompts = tmp / "prompts.jsonl"
    if not prompts.exists():
        write_synthetic(prompts, args.prompts, seed=17)
    fleet = SimFleet(
        servers=args.servers,
        profile="b200-mtp",
        speed=args.speed,
        faults=[f"loop_rate={args.loop_rate}", f"loop_max_period={args.loop_max_period}"],
        work_dir=tmp / f"sim-{name}",
    )
    with fleet:
        config = sim_generate_config(
            fleet,
            prompts,
            tmp / f"run-{name}",
            stream=True,
            loop_check=check,
            max_tokens=args.max_tokens,
            turns="last",
            concurrency_per_server=args.concurrency,
            max_loop_rate=1.0,
            hedge_slow_ratio=0.0,  # no copies: every request in the truth is one turn's only request
        )
        result = run_generate(config, progress=False)
        truth = [r for r in fleet.truth() if r.get("kind") == "chat"]
    rows = pl.read_parquet(shard_paths(config.out_dir), columns=["response_id", "finish_reason", "turn_loop"])
    reported = summary(config.out_dir).to_dicts()[0]
    return {"name": name, "wall_s": result.outcome.wall_s, "truth": truth, "rows": rows, "summary": reported}


def analyse(on: dict, off: dict, args: argparse.Namespace) -> dict:
    rule = LoopRule()
    truth = {r["rid"]: r for r in on["truth"]}
    flagged = set(on["rows"].filter(pl.col("finish_reason") == REPETITION_LOOP)["response_id"].to_list())
    looped = [r for r in on["truth"] if r["loop_start"] is not None]
    # a loop can only be seen once the rule's stretch fits before max_tokens
    visible = [r for r in looped if r["loop_start"] + rule.needed(r["loop_period"]) <= args.max_tokens]
    ended = [r for r in visible if r["outcome"] == "client_disconnected"]
    distance = np.array([r["completion_tokens"] - r["loop_start"] for r in ended])
    past_rule = np.array(
        [r["completion_tokens"] - r["loop_start"] - rule.needed(r["loop_period"]) for r in ended]
    )
    false_positives = [rid for rid in flagged if truth[rid]["loop_start"] is None]
    # the client's own record: pieces read from the loop's start to the moment the rule held
    records = [
        loops[0] for loops in on["rows"]["turn_loop"].to_list() if loops and loops[0] and loops[0]["live"]
    ]
    seen = np.array([r["received"] - r["start"] for r in records])
    generated_on = sum(r["completion_tokens"] for r in on["truth"])
    generated_off = sum(r["completion_tokens"] for r in off["truth"])
    by_period = {}
    for low, high in ((1, 8), (9, 32), (33, 85), (86, 170), (171, 512)):
        part = [r["completion_tokens"] - r["loop_start"] for r in ended if low <= r["loop_period"] <= high]
        if part:
            by_period[f"{low}-{high}"] = {
                "n": len(part),
                "median": int(np.median(part)),
                "max": int(max(part)),
            }
    return {
        "requests": len(on["truth"]),
        "looped": len(looped),
        "visible": len(visible),
        "ended": len(ended),
        "ended_share": len(ended) / len(visible) if visible else None,
        "flagged": len(flagged),
        "false_positives": len(false_positives),
        "tokens_after_loop_start": {
            "p50": int(np.percentile(distance, 50)),
            "p95": int(np.percentile(distance, 95)),
            "max": int(distance.max()),
        },
        "within_512": float(np.mean(distance <= 512)),
        "pieces_to_detect": {"p50": int(np.percentile(seen, 50)), "max": int(seen.max())}
        if len(seen)
        else None,
        "within_rule_plus_64": float(np.mean(past_rule <= 64)),
        "tokens_past_the_rule": {"p50": int(np.percentile(past_rule, 50)), "max": int(past_rule.max())},
        "by_period": by_period,
        "generated_on": generated_on,
        "generated_off": generated_off,
        "saved": generated_off - generated_on,
        "saved_share": 1 - generated_on / generated_off,
        "saved_by_ended": sum(r["planned_tokens"] - r["completion_tokens"] for r in ended),
        "saved_reported": on["summary"][
            "loop_tokens_saved"
        ],  # generate's own count (max_tokens − pieces read)
        "wall_on_s": round(on["wall_s"], 1),
        "wall_off_s": round(off["wall_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--speed", type=float, default=5.0, help="simulated clock speed-up")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight per server")
    parser.add_argument("--loop-rate", type=float, default=0.2)
    parser.add_argument("--loop-max-period", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=4096)
    args = parser.parse_args()
    print(
        f"{args.servers} servers (b200-mtp, speed {args.speed:g}), {args.prompts} prompts streamed, max_tokens "
        f"{args.max_tokens}, loop_rate {args.loop_rate}, periods 1..{args.loop_max_period}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        on = one_run(args, Path(tmp), check=True)
        off = one_run(args, Path(tmp), check=False)
    figures = analyse(on, off, args)
    d = figures["tokens_after_loop_start"]
    print(
        f"  looped {figures['looped']} of {figures['requests']} requests ({figures['visible']} visible before "
        f"max_tokens); ended live {figures['ended']} ({figures['ended_share']:.1%}); flagged {figures['flagged']}, "
        f"false positives {figures['false_positives']}"
    )
    print(
        f"  tokens from the loop's start to the request's end: p50 {d['p50']}, p95 {d['p95']}, max {d['max']}; "
        f"within 512: {figures['within_512']:.1%}; within the rule's minimum + 64: "
        f"{figures['within_rule_plus_64']:.1%} (past it: p50 {figures['tokens_past_the_rule']['p50']}, max "
        f"{figures['tokens_past_the_rule']['max']}); the client found them after p50 "
        f"{(figures['pieces_to_detect'] or {}).get('p50')}, max {(figures['pieces_to_detect'] or {}).get('max')} "
        "pieces of loop"
    )
    print(
        f"  GPU tokens: {figures['generated_off']:,} with the check off, {figures['generated_on']:,} on: "
        f"{figures['saved']:,} saved ({figures['saved_share']:.1%}); the ended requests' servers would still have "
        f"generated {figures['saved_by_ended']:,} (generate's report says {figures['saved_reported']:,}); wall {figures['wall_off_s']} s off, {figures['wall_on_s']} s on"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
