"""``draftgen demo``: the README's first command. The whole pipeline on a simulated 7-GPU fleet.

benchmark → estimate → generate → validate, each a real notebook run with papermill (exactly what a user runs on
the GPU node), against ``draftgen sim`` servers and the bundled synthetic prompts. Production settings
(max_tokens 4096, temperature 0.6, top_p 0.95, thinking on, 64 in flight per server, answers streamed so the loop
check ends a loop live, shards of 500); only the
simulated clock runs faster, and every report states its times and rates on the simulated B200's clock (read from
``/sim/info``), so the figures are a B200's, not the sped-up clock's. The estimate also prices the job the seeds'
script was planned for: 914K prompts on seven B200s, at production concurrency and at concurrency 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgen.defaults import CONCURRENCY_PER_SERVER, FLEET_SIZE, MODEL
from draftgen.display.humanize import duration
from draftgen.estimate.config import OLD_PLAN_FLEET
from draftgen.exit_codes import ExitCode
from draftgen.paths import resolve_path
from draftgen.prompts.rows import SYNTHETIC
from draftgen.rundir.layout import (
    DEMO_SIM,
    DEMO_TOKENIZER,
    ESTIMATE,
    EXPORT,
    GENERATE_PLOT_BY_CATEGORY,
    MANIFEST,
    PLOTS,
    REPORT_HTML,
    VALIDATE_SUMMARY,
    plot_file,
)
from draftgen.runner import RunPlan, execute, headline, resolve_notebook
from draftgen.sim.fleet import SimFleet
from draftgen.steps import get_step

BENCHMARK_ROUNDS = 3.0  # each concurrency level measured over this many rounds of its requests
SEEDS_PROMPTS = 914_000  # the last run's prompt set (~900K samples), on seven B200s
SEEDS_JOB = "the seeds' job: 914K prompts, 7 B200 × 64 in flight"
SEEDS_PLAN = "the seeds' plan: 914K prompts, 7 B200 at concurrency 1"


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on a simulated 7-GPU fleet and the bundled synthetic prompts",
        description="Start a simulated 7-GPU fleet (B200 + MTP profile), then run benchmark → estimate → generate "
        "→ validate notebooks on the bundled synthetic prompts with production settings. Writes outputs/demo/.",
    )
    parser.add_argument(
        "--out", type=resolve_path, default="outputs/demo", help="output folder (default outputs/demo)"
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=FLEET_SIZE,
        help="simulated GPUs, one server each (default %(default)s)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=5.0,
        help="simulated clock speed-up (default 5x: faster starves two CPU cores and skews planned vs actual)",
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="generate only the first N prompts (default: all 2,000)"
    )
    parser.add_argument(
        "--prompts",
        default=SYNTHETIC,
        help='the prompt file benchmark, estimate and generate read (default "synthetic": the bundled set; '
        "e.g. one of draftgen prompts --shape single-turn)",
    )
    parser.add_argument(
        "--rounds",
        type=float,
        default=BENCHMARK_ROUNDS,
        help="the benchmark's rounds at each concurrency level (default %(default)g; 1 measures in about half the "
        "time, with wider intervals)",
    )
    parser.add_argument("--keep", action="store_true", help="refuse to replace an existing output folder")
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class DemoOptions:
    """What the command line sets in the steps' parameters."""

    limit: int = 0
    rounds: float = BENCHMARK_ROUNDS
    prompts: str = SYNTHETIC


def _benchmark_parameters(urls: list[str], out: Path, options: DemoOptions) -> dict[str, Any]:
    # One GPU stands for all: the servers are identical and independent, and streaming 7 x 64 sped-up simulated
    # servers would measure this machine's two cores, not the simulated B200s.
    return {
        "servers": urls[:1],
        "model": MODEL,
        "prompts": options.prompts,
        "concurrencies": [1, 16, 48, 64],
        "rounds": options.rounds,
        "warmup_requests": 2,
    }


def _estimate_parameters(urls: list[str], out: Path, options: DemoOptions) -> dict[str, Any]:
    # The estimate reads the benchmark on the simulated B200's clock (benchmark.json records the sim speed), so an
    # assumed fleet (the old plan's) is typed in real units, as on the GPU node.
    seeds = {"gpus": 7, "num_prompts": SEEDS_PROMPTS}
    return {
        "benchmark_dir": str(out / "benchmark"),
        "prompts": options.prompts,
        "limit": options.limit,
        # generate's tokenizer: the turns it would set aside under the trainer's max_length are not priced
        "tokenizer": str(out / DEMO_TOKENIZER),
        "gpus": len(urls),
        "scenarios": [
            {"name": SEEDS_JOB, **seeds},
            {"name": SEEDS_PLAN, **seeds, "concurrency_per_server": 1},
            dict(OLD_PLAN_FLEET),
        ],
    }


def _generate_parameters(urls: list[str], out: Path, options: DemoOptions) -> dict[str, Any]:
    return {
        "servers": urls,
        "model": MODEL,
        "prompts": options.prompts,
        "limit": options.limit,
        "estimate": str(out / "estimate" / ESTIMATE),
        # the target's tokenizer: each turn's max_tokens is capped at the trainer's max_length − its prompt
        "tokenizer": str(out / DEMO_TOKENIZER),
    }


def _validate_parameters(urls: list[str], out: Path, options: DemoOptions) -> dict[str, Any]:
    return {"generation_dir": str(out / "generate"), "tokenizer": str(out / DEMO_TOKENIZER)}


# The pipeline the demo runs, in order: each step's notebook with these parameters (the fleet's URLs, the demo's
# folder, --limit, --rounds) over its own; the step's folder is <out>/<step>.
PIPELINE: tuple[tuple[str, Callable[[list[str], Path, DemoOptions], dict[str, Any]]], ...] = (
    ("benchmark", _benchmark_parameters),
    ("estimate", _estimate_parameters),
    ("generate", _generate_parameters),
    ("validate", _validate_parameters),
)
STEPS = tuple(name for name, _ in PIPELINE)


def _acceptance_lines(run_dir: Path) -> list[str]:
    """Acceptance by prompt category, lowest first, and where its plot is."""
    from draftgen.generate.report import acceptance_breakdowns

    plot = run_dir / PLOTS / plot_file(GENERATE_PLOT_BY_CATEGORY)
    table = acceptance_breakdowns(run_dir).get("category")
    if table is None or not plot.exists():
        return []
    groups = ", ".join(
        f"{row['category']} {row['accept_length']:.2f} (n={row['requests_with_acceptance']:,})"
        for row in table.iter_rows(named=True)
        if row["accept_length"] is not None
    )
    return [f"accept   : by prompt category, lowest first: {groups}; plot {plot}"]


def _interval(estimate: Path, wall: dict[str, Any]) -> str:
    """The estimate's interval in the wall-time row's unit, and whether the run fell inside it: a short set's run
    ends on its longest conversations, so the point can miss by a few percent that the interval states
    (docs/estimate.md, "How well it predicts")."""
    data = json.loads(estimate.read_text())
    low, high, point = (data.get(k) for k in ("wall_time_low_s", "wall_time_high_s", "wall_time_s"))
    if not (low and high and point):
        return ""
    scale = wall["planned"] / point
    inside = "inside it" if low * scale <= wall["actual"] <= high * scale else "outside it"
    share = f"{data['interval']:.0%} " if data.get("interval") else ""
    return f" ({share}interval {low * scale:,.2f}–{high * scale:,.2f}; the run {inside})"


def _cost_lines(out: Path) -> list[str]:
    """Planned vs actual: wall time, and GPU-seconds and dollars per million trained tokens."""
    from draftgen.generate.report import compare_estimate

    estimate = out / "estimate" / ESTIMATE
    if not estimate.exists():
        return []
    table = {row["figure"]: row for row in compare_estimate(estimate, out / "generate").iter_rows(named=True)}
    wall = next((row for name, row in table.items() if name.startswith("wall time")), None)
    gpu_s = table.get("GPU-seconds per million trained tokens")
    usd = table.get("dollars per million trained tokens")
    lines = []
    if wall and wall["actual"]:
        lines.append(
            f"planned  : {wall['figure']}: planned {wall['planned']:,.2f}{_interval(estimate, wall)}, "
            f"actual {wall['actual']:,.2f} (actual / planned {wall['actual / planned']:.3f})"
        )
    if gpu_s and usd and gpu_s["actual"]:
        lines.append(
            f"cost     : {gpu_s['actual']:,.0f} GPU-seconds (${usd['actual']:,.2f}) per million trained tokens "
            f"(planned {gpu_s['planned']:,.0f}, ${usd['planned']:,.2f}), on the simulated B200's clock"
        )
    return lines


def _summary(out: Path) -> list[str]:
    lines = []
    estimate = out / "estimate" / ESTIMATE
    if estimate.exists():
        data = json.loads(estimate.read_text())
        hardware = (data.get("clock") or {}).get("hardware") or "GPU"
        lines.append(
            f"estimate : {data.get('tok_s_per_gpu', 0):,.0f} tok/s per simulated {hardware} at "
            f"{data.get('concurrency_per_server')} in flight ({data.get('concurrency_1', {}).get('tok_s_per_gpu', 0):,.0f} "
            f"alone); {duration(data.get('wall_time_s', 0))} and ${data.get('cost_usd', 0):,.2f} for "
            f"{data.get('num_prompts', 0):,} requests on {data.get('servers')} simulated {hardware}s"
        )
        by_name = {s["scenario"]: s for s in data.get("scenarios", [])}
        job, plan = by_name.get(SEEDS_JOB), by_name.get(SEEDS_PLAN)
        if job and plan:
            lines.append(
                f"           914K prompts on 7 {hardware}s: {job['days']:.2f} days "
                f"({job['days_low']:.2f}–{job['days_high']:.2f}), ${job['cost_usd']:,.0f}; the concurrency-1 plan: "
                f"{plan['days']:.1f} days, ${plan['cost_usd']:,.0f} — {plan['days'] / job['days']:.1f}× longer"
            )
    manifest = out / "generate" / MANIFEST
    if manifest.exists():
        data = json.loads(manifest.read_text())
        counts = data.get("counts", {})
        lines.append(
            f"generate : {counts.get('done', 0):,} stored, {counts.get('failed', 0):,} failed, "
            f"{counts.get('rejected', 0):,} prompt rows rejected ({data.get('status')})"
        )
        lines += _cost_lines(out)
        lines += _acceptance_lines(out / "generate")
    validation = out / "validate" / VALIDATE_SUMMARY
    if validation.exists():
        data = json.loads(validation.read_text())
        counts = data.get("counts", {})
        lines.append(
            f"validate : {'PASS' if data.get('passed') else 'FAIL'} — {counts.get('out', 0)} of {counts.get('in', 0)} "
            f"training rows (one per generated turn) exported to {out / 'validate' / EXPORT}"
        )
        made, source = counts.get("yield") or {}, counts.get("token_source") or {}
        if made.get("share") is not None:
            rest = [(why, n) for why, n in made["buckets"].items() if why != "trained"]
            lost = ", ".join(f"{why} {n / made['generated_tokens']:.1%}" for why, n in rest[:4])
            cut = (counts.get("cut_turns") or {}).get("trained", 0)
            at_length = (counts.get("cut_at_max_length") or {}).get("trained", 0)
            lines.append(
                f"yield    : {made['share']:.1%} of the {made['generated_tokens']:,} tokens the target generated are "
                f"trained ({made['trained_tokens']:,} trained tokens; {cut:,} turns cut at their limit train as "
                f"generated, in prompts.jsonl only — {at_length:,} of them at the trainer's max_length, expected, "
                f"{cut - at_length:,} by max_tokens; the rest: {lost or 'none'}); {source.get('server', 0):,} rows "
                f"from the server's token ids, {source.get('retokenized', 0):,} re-tokenized"
            )
    return lines


def run(args: argparse.Namespace) -> int:
    from draftgen.sim.tokenizer import default_tokenizer

    if args.rounds <= 0:
        raise ValueError(f"--rounds must be > 0, got {args.rounds:g}")
    prompts = args.prompts if args.prompts == SYNTHETIC else str(resolve_path(args.prompts))
    options = DemoOptions(limit=args.limit, rounds=args.rounds, prompts=prompts)
    out: Path = args.out  # relative: under the project root, like every run folder
    if out.exists():
        if args.keep:
            raise ValueError(f"{out} exists; remove it or drop --keep")
        print(f"draftgen demo: replacing the previous demo output in {out}")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    started = time.perf_counter()
    print(
        "draftgen demo: a tiny Qwen3-format tokenizer for the servers' token ids and the loss-mask checks (trained "
        "once per machine, no download)"
    )
    default_tokenizer(out / DEMO_TOKENIZER)  # trained once per machine, then copied
    # The servers speak validate's tokenizer, so the ids they report are the ids validate reads.
    with SimFleet(
        servers=args.servers,
        profile="b200-mtp",
        speed=args.speed,
        work_dir=out / DEMO_SIM,
        tokenizer=out / DEMO_TOKENIZER,
        # as draftgen serve starts SGLang: the reports show the cache share, and every request generate keeps in
        # flight runs at once
        server_args=("--enable-cache-report",),
        max_running_requests=CONCURRENCY_PER_SERVER,
    ) as fleet:
        print(
            f"draftgen demo: {args.servers} simulated B200 + MTP servers at {args.speed:g}x speed: "
            f"{fleet.urls[0]} … {fleet.urls[-1]}"
        )
        for step, parameters_of in PIPELINE:
            plan = RunPlan(
                notebook=resolve_notebook(step),
                run_dir=out / step,
                parameters={
                    **parameters_of(fleet.urls, out, options),
                    **get_step(step).run_parameters(out / step, resume=False),
                },
                name=step,
                step=get_step(step),
            )
            print(f"\n=== {step}: {plan.notebook} → {plan.run_dir}", flush=True)
            step_started = time.perf_counter()
            try:
                execute(plan, log_output=True)
            except Exception as exc:
                print(
                    f"draftgen demo: {step} failed: {getattr(exc, 'ename', type(exc).__name__)}: "
                    f"{getattr(exc, 'evalue', exc)}",
                    file=sys.stderr,
                )
                print(f"draftgen demo: see {plan.executed_path} and {plan.html_path}", file=sys.stderr)
                return ExitCode.FAILED
            block = headline(plan)
            if block:
                print(block)
            print(
                f"=== {step} done in {time.perf_counter() - step_started:.0f}s: report {plan.html_path}",
                flush=True,
            )
    print(
        f"\ndraftgen demo: finished in {time.perf_counter() - started:.0f}s (simulated clock {args.speed:g}x)."
    )
    for line in _summary(out):
        print("  " + line)
    print(f"  reports  : {', '.join(str(out / s / REPORT_HTML) for s in STEPS)}")
    return ExitCode.OK
