"""How close the benchmark's numbers are to what the simulated fleet really did, at production shape.

Runs the benchmark (the library the notebook calls, without a kernel) on a simulated B200+MTP fleet at one
concurrency level, then reads the simulator's ground truth for the same requests and prints, per server and for
the fleet, the relative error of: output tok/s (tokens over the level's window), acceptance length, TTFT p50,
ITL p50 and E2E p50. Also prints the client's event-loop lag, the measure of whether the client kept up.

Truth per level: tokens and verify steps of the level's requests; window from their first arrival to their last
finish; TTFT = first token − arrival; ITL = gaps between the server's decode steps; E2E = finished − arrival.
Times are wall-clock at the simulator's ``--speed`` (absolute tok/s are ``speed`` times the simulated GPU's).

    .venv/bin/python benchmarks/bench_fidelity.py [--servers 7] [--concurrency 64] [--speed 1]
        [--num-prompts 128] [--max-tokens 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import polars as pl

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.report import build_report
from draftgen.bench.run import run_benchmark
from draftgen.sim import SimFleet


def truth_rows(truth: list[dict], requests: pl.DataFrame) -> pl.DataFrame:
    by_rid = {r["rid"]: r for r in truth if r.get("kind") == "chat"}
    rows = []
    for server, group in requests.group_by("server"):
        records = [by_rid[rid] for rid in group["response_id"].to_list() if rid in by_rid]
        tokens = sum(r["completion_tokens"] for r in records)
        window = max(r["finished"] for r in records) - min(r["arrival"] for r in records)
        gaps = [b - a for r in records for a, b in zip(r["emit_times"], r["emit_times"][1:], strict=False)]
        rows.append(
            {
                "server": server[0],
                "truth_tok_s": tokens / window,
                "truth_accept": tokens / sum(r["verify_steps"] for r in records),
                "truth_ttft_p50": float(np.median([r["first_token"] - r["arrival"] for r in records])),
                "truth_itl_p50": float(np.median(gaps)),
                "truth_e2e_p50": float(np.median([r["finished"] - r["arrival"] for r in records])),
            }
        )
    return pl.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--num-prompts", type=int, default=128, help="requests per server")
    parser.add_argument("--max-tokens", type=int, default=2048)
    args = parser.parse_args()

    with SimFleet(servers=args.servers, profile="b200-mtp", speed=args.speed) as fleet:
        config = BenchmarkConfig(
            servers=fleet.urls,
            model="Qwen/Qwen3.6-27B",
            num_prompts=args.num_prompts,
            concurrencies=[args.concurrency],
            max_tokens=args.max_tokens,
            warmup_requests=2,
        )
        started = time.perf_counter()
        cpu = time.process_time()
        run = asyncio.run(run_benchmark(config))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        truth = fleet.truth()
    report = build_report(run)
    measured = report.results.select(
        "server",
        "gpu",
        "output_tok_s",
        "accept_length",
        "ttft_s_p50",
        "itl_s_p50",
        "e2e_s_p50",
        "client_lag_ms_p99",
    )
    table = measured.join(truth_rows(truth, report.requests), on="server").sort("gpu")
    errors = table.select(
        "gpu",
        (pl.col("output_tok_s") / pl.col("truth_tok_s") - 1).alias("tok_s"),
        (pl.col("accept_length") / pl.col("truth_accept") - 1).alias("accept"),
        (pl.col("ttft_s_p50") / pl.col("truth_ttft_p50") - 1).alias("ttft_p50"),
        (pl.col("itl_s_p50") / pl.col("truth_itl_p50") - 1).alias("itl_p50"),
        (pl.col("e2e_s_p50") / pl.col("truth_e2e_p50") - 1).alias("e2e_p50"),
        pl.col("client_lag_ms_p99").alias("lag_p99_ms"),
    )
    fleet_measured = float(table["output_tok_s"].sum())
    fleet_truth = float(table["truth_tok_s"].sum())
    print(
        f"{args.servers} servers x {args.concurrency} in flight, b200-mtp at speed {args.speed:g}, "
        f"{args.num_prompts} requests per server, max_tokens {args.max_tokens}: {elapsed:.0f} s wall, "
        f"client CPU {cpu:.0f} s"
    )
    with pl.Config(tbl_rows=50, tbl_cols=20, float_precision=4, tbl_hide_dataframe_shape=True):
        print("relative error of our numbers vs the simulator's truth (measured / truth - 1):")
        print(errors)
    print(
        f"fleet output tok/s: measured {fleet_measured:,.0f}, truth {fleet_truth:,.0f} "
        f"({fleet_measured / fleet_truth - 1:+.2%}); per GPU in simulated time "
        f"{fleet_measured / args.servers / args.speed:,.0f} tok/s"
    )
    worst = errors.select(pl.all().exclude("gpu", "lag_p99_ms").abs().max())
    print(
        "largest |error| per figure:", {k: f"{v[0]:.2%}" for k, v in worst.to_dict(as_series=False).items()}
    )


if __name__ == "__main__":
    main()
