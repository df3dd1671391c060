"""The estimate as estimate.json (read later by the generate notebook: planned vs actual) and as plots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from draftgen.display.headline import Headline, Stat
from draftgen.display.humanize import duration, duration_unit
from draftgen.display.notes import Notes, Stack
from draftgen.display.table import Column, Table, figures_table, format_value
from draftgen.estimate.plan import Estimate, ScenarioResult
from draftgen.prompts.audit_report import AuditReport
from draftgen.rundir import write_json, write_parquet
from draftgen.rundir.layout import ESTIMATE as ESTIMATE_FILE
from draftgen.rundir.layout import ESTIMATE_SCENARIOS
from draftgen.server_settings import settings_record


def _scenario_json(result: ScenarioResult) -> dict:
    return {
        **result.row(),
        "num_prompts": result.num_prompts,
        "wall_time_s": result.wall_time_s,
        "wall_time_low_s": result.wall_time_low_s,
        "wall_time_high_s": result.wall_time_high_s,
        "tail_s": result.tail_s,
        "steady_output_tok_s": result.steady_output_tok_s,
        "aggregate_output_tok_s": result.aggregate_output_tok_s,
        "mean_completion_tokens": result.mean_completion_tokens,
        "total_output_tokens": result.total_output_tokens,
        "truncated_rate": result.truncated_rate,
        "gpu_hour_usd": result.gpu_hour_usd,
        "lengths_are_lower_bound": result.lengths_are_lower_bound,
        "interval_note": result.interval_note,
    }


def estimate_json(estimate: Estimate) -> dict:
    """Everything a later run needs to compare itself with the plan. Top-level keys describe production."""
    p = estimate.production
    c1 = estimate.concurrency_1
    fit = estimate.benchmark.fit
    data = estimate.benchmark.data
    accept, accept_source = data.accept_length()
    return {
        # which clock every time and rate below is on (draftgen sim: the simulated GPU's, not the wall clock's)
        "clock": data.clock.as_dict(),
        # the keys the generate notebook reads
        "aggregate_output_tok_s": p.aggregate_output_tok_s,
        "wall_time_s": p.wall_time_s,
        "wall_time_low_s": p.wall_time_low_s,
        "wall_time_high_s": p.wall_time_high_s,
        "num_prompts": p.num_prompts,
        "servers": p.gpus,
        "concurrency_per_server": p.concurrency_per_server,
        "max_tokens": p.max_tokens,
        "mean_completion_tokens": p.mean_completion_tokens,
        # the rest of production
        "steady_output_tok_s": p.steady_output_tok_s,
        "tok_s_per_gpu": p.tok_s_per_gpu,
        "total_output_tokens": p.total_output_tokens,
        "trained_tokens": p.trained_tokens,
        "gpu_s_per_m_trained": p.gpu_s_per_m_trained,
        "usd_per_m_trained": p.usd_per_m_trained,
        "capped_at_max_length": estimate.benchmark.lengths.max_length or None,
        "truncated_rate": p.truncated_rate,
        "tail_s": p.tail_s,
        "days": p.days,
        "gpu_hours": p.gpu_hours,
        "cost_usd": p.cost_usd,
        "gpu_hour_usd": p.gpu_hour_usd,
        "interval": estimate.config.interval,
        "interval_note": p.interval_note,
        "lengths_are_lower_bound": p.lengths_are_lower_bound,
        "num_prompts_source": estimate.num_prompts_source,
        "set_conversations": estimate.set_conversations,
        "accept_length": accept,
        "accept_length_source": accept_source,
        # the sampling plan priced: requests per prompt and each arm's figures (docs/benchmark.md)
        "requests_per_prompt": estimate.plan.requests_per_prompt if estimate.config.sampling_plan else 1.0,
        "arms": estimate.arms_table().to_dicts() if estimate.config.sampling_plan else [],
        "prefill_s_per_request_upper_bound": estimate.prefill_s_per_request,
        "concurrency_1": {
            "wall_time_s": c1.wall_time_s,
            "days": c1.days,
            "aggregate_output_tok_s": c1.aggregate_output_tok_s,
            "tok_s_per_gpu": c1.tok_s_per_gpu,
            "times_longer_than_production": c1.wall_time_s / p.wall_time_s,
        },
        "scenarios": [_scenario_json(s) for s in (p, c1, *estimate.scenarios)],
        "rate_model": {
            "tpot_s": "alpha_s + beta_s * running",
            "alpha_s": fit.model.alpha_s,
            "beta_s": fit.model.beta_s,
            "max_running_requests": fit.model.max_running,
            "max_abs_rel_error": fit.max_abs_rel_error,
            "note": fit.note,
            # the curve is priced at the set's acceptance: tokens per verify step, the benchmark's and the set's
            "acceptance_mix": None
            if estimate.benchmark.mix is None
            else {
                "benchmark": estimate.benchmark.mix.benchmark,
                "set": estimate.benchmark.mix.set,
                "factor": estimate.benchmark.mix.factor,
            },
        },
        "benchmark_dir": str(data.path),
        "benchmark_servers": data.servers,
        "benchmark_max_tokens": data.max_tokens,
        # the measured completion lengths' percentiles 0..100 (at the benchmark's max_tokens): generate's preflight
        # predicts from them how many turns the trainer's max_length cap will cut
        "completion_tokens_percentiles": [
            round(float(v), 1) for v in np.percentile(estimate.benchmark.lengths.tokens, np.arange(101))
        ],
        "notes": list(estimate.notes),
        "train_max_length": asdict(estimate.max_length_cost) if estimate.max_length_cost else None,
        "prompt_audit": estimate.audit.as_dict() if estimate.audit else None,
        "server_settings": settings_record(estimate.config.settings),
        "config": estimate.config.public_dict(),
        "created_at": estimate.created_at,
    }


def save_estimate(estimate: Estimate, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ESTIMATE_FILE
    write_json(path, estimate_json(estimate), indent=2, default=str)
    write_parquet(out / ESTIMATE_SCENARIOS, estimate.table())
    return path


# ----- plots --------------------------------------------------------------------------------------------------
def _figure(figsize: tuple[float, float]):  # type: ignore[no-untyped-def]
    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def plot_scenarios(estimate: Estimate) -> Figure:
    results = [estimate.production, estimate.concurrency_1, *estimate.scenarios]
    fig, ax = _figure((9, 0.6 * len(results) + 1.8))
    y = np.arange(len(results))[::-1]
    unit, unit_s = duration_unit(
        max(r.wall_time_s for r in results)
    )  # days for the real job, s for a dry run
    wall = np.asarray([r.wall_time_s / unit_s for r in results])
    low = wall - np.asarray([r.wall_time_low_s / unit_s for r in results])
    high = np.asarray([r.wall_time_high_s / unit_s for r in results]) - wall
    colors = ["tab:green", "tab:red", *["tab:blue"] * len(estimate.scenarios)]
    ax.barh(y, wall, xerr=[low, high], color=colors, alpha=0.8, capsize=4)
    for yi, r in zip(y, results, strict=True):
        ax.annotate(
            f" {duration(r.wall_time_s)}  ${r.cost_usd:,.0f}",
            (r.wall_time_high_s / unit_s, yi),
            va="center",
            fontsize=8,
        )
    ax.set_yticks(y)
    sizes = {r.num_prompts for r in results}
    ax.set_yticklabels(
        [
            f"{r.name}\n{r.gpus} GPU × {r.concurrency_per_server} in flight"
            + (f", {r.num_prompts:,} requests" if len(sizes) > 1 else "")
            for r in results
        ],
        fontsize=8,
    )
    clock = estimate.benchmark.data.clock
    what = f"{estimate.num_prompts:,} requests" if len(sizes) == 1 else "each scenario's requests"
    ax.set_xlabel(
        f"{unit} for {what} ({estimate.config.interval:.0%} interval)"
        + (f", on the {clock.short}" if clock.simulated else "")
    )
    ax.set_title("How many days and dollars does the whole set take?")
    top = max(r.wall_time_high_s / unit_s for r in results)
    if top > 50 * min(r.wall_time_s / unit_s for r in results):  # a dry run beside the real job: log axis
        ax.set_xscale("log")
        ax.set_xlim(right=top * 20)
    else:
        ax.set_xlim(right=top * 1.35)
    fig.tight_layout()
    return fig


def plot_sweep_concurrency(estimate: Estimate) -> Figure:
    frame = estimate.sweeps["concurrency"]
    fig, ax = _figure((8, 4))
    ax.plot(frame["concurrency_per_server"], frame["days"], marker="o")
    extra = frame.filter(pl.col("extrapolated"))
    if extra.height:
        ax.scatter(
            extra["concurrency_per_server"],
            extra["days"],
            color="orange",
            zorder=5,
            label="beyond the benchmark (extrapolated)",
        )
    p = estimate.production
    ax.scatter(
        [p.concurrency_per_server],
        [p.days],
        s=150,
        facecolors="none",
        edgecolors="green",
        lw=2,
        label="production",
    )
    cap = estimate.benchmark.fit.model.max_running
    if cap:
        ax.axvline(cap, color="grey", ls="--", lw=1, label=f"max_running_requests={cap}")
    ax.set_xscale("log", base=2)
    levels = frame["concurrency_per_server"].to_list()
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels], fontsize=7)
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("requests in flight per server")
    ax.set_ylabel("days")
    ax.set_title("How many days does the set take at each concurrency per server?")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sweep_max_tokens(estimate: Estimate) -> Figure:
    frame = estimate.sweeps["max_tokens"]
    fig, ax = _figure((8, 4))
    ax.plot(frame["max_tokens"], frame["days"], marker="o")
    lower = frame.filter(pl.col("lower_bound"))
    if lower.height:
        ax.scatter(
            lower["max_tokens"],
            lower["days"],
            color="orange",
            zorder=5,
            label="above the benchmark's max_tokens (lower bound)",
        )
    ax.axvline(estimate.production.max_tokens, color="green", ls="--", lw=1, label="production max_tokens")
    ax.set_xlabel("max_tokens (the cap on each request's completion tokens)")
    ax.set_ylabel("days")
    ax.set_ylim(bottom=0)
    ax.set_title("How many days does the set take at each max_tokens?")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sweep_gpus(estimate: Estimate) -> Figure:
    frame = estimate.sweeps["gpus"]
    fig, ax = _figure((8, 4))
    ax.plot(frame["gpus"], frame["days"], marker="o")
    p = estimate.production
    ax.scatter([p.gpus], [p.days], s=150, facecolors="none", edgecolors="green", lw=2, label="production")
    ax.set_xlabel("GPUs (one server each)")
    ax.set_ylabel("days")
    ax.set_ylim(bottom=0)
    ax.set_title("How many days does the set take with more or fewer GPUs?")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_rate_fit(estimate: Estimate) -> Figure:
    fit = estimate.benchmark.fit
    points = fit.points
    fig, ax = _figure((8, 4))
    sizes = 20 + 200 * points["seconds"].to_numpy() / max(points["seconds"].max(), 1e-9)
    ax.scatter(
        points["running"], points["measured_tok_s"], s=sizes, alpha=0.6, label="measured (size: time spent)"
    )
    top = max(int(points["running"].max()), estimate.production.concurrency_per_server)
    b = np.arange(1, top + 1)
    ax.plot(b, [fit.model.tok_s(int(v)) for v in b], color="black", label="fitted: b / (alpha + beta·b)")
    ax.set_xlabel("requests running on one server")
    ax.set_ylabel("output tokens/s per server")
    ax.set_ylim(bottom=0)
    ax.set_title("Does the fitted rate curve follow what the benchmark measured?")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----- what the report shows --------------------------------------------------------------------------------
def _interval(value: float, low: float, high: float, fmt: Callable[[float], str]) -> str:
    return f"{fmt(value)} ({fmt(low)}–{fmt(high)})"


def _cost(result: ScenarioResult, seconds: float) -> float:
    return seconds / 3600.0 * result.gpus * result.gpu_hour_usd


def scenarios_table(estimate: Estimate) -> Table:
    """Production, the same fleet at concurrency 1, and the other fleets: time and money with their interval."""
    results = [estimate.production, estimate.concurrency_1, *estimate.scenarios]
    frame = pl.DataFrame(
        {
            "scenario": [r.name for r in results],
            "requests": [r.num_prompts for r in results],
            "fleet": [f"{r.gpus} GPU × {r.concurrency_per_server} in flight" for r in results],
            "tok_s_per_gpu": [r.tok_s_per_gpu for r in results],
            "fleet_tok_s": [r.aggregate_output_tok_s for r in results],
            "wall_time": [
                _interval(r.wall_time_s, r.wall_time_low_s, r.wall_time_high_s, duration) for r in results
            ],
            "gpu_hours": [r.gpu_hours for r in results],
            "gpu_s_per_m_trained": [r.gpu_s_per_m_trained for r in results],
            "usd_per_m_trained": [r.usd_per_m_trained for r in results],
            "cost": [
                _interval(
                    r.cost_usd,
                    _cost(r, r.wall_time_low_s),
                    _cost(r, r.wall_time_high_s),
                    lambda v: format_value(v, "usd"),
                )
                for r in results
            ],
            "source": [r.source for r in results],
        }
    )
    clock = estimate.benchmark.data.clock
    return Table(
        frame,
        (
            Column("scenario", "scenario", "text"),
            Column("requests", "requests", "int"),
            Column("fleet", "fleet", "text"),
            Column("tok_s_per_gpu", "tok/s per GPU", "tok_s"),
            Column("fleet_tok_s", "fleet tok/s", "tok_s"),
            Column("wall_time", f"wall time ({estimate.config.interval:.0%} interval)", "text"),
            Column("gpu_hours", "GPU-hours", "number"),
            Column("cost", f"cost ({estimate.config.interval:.0%} interval)", "text"),
            Column("gpu_s_per_m_trained", "GPU-s per M trained tokens", "number", digits=0),
            Column("usd_per_m_trained", "$ per M trained tokens", "usd"),
            Column("source", "rate from", "text"),
        ),
        note=clock.note,
    )


def inputs(estimate: Estimate, path: str | Path) -> Stack:
    """What the estimate read and wrote, and its notes, as sentences."""
    figures = figures_table(
        [
            ("benchmark read", str(estimate.benchmark.data.path)),
            ("requests in the set", f"{estimate.num_prompts:,} ({estimate.num_prompts_source})"),
            ("estimate written", str(path)),
        ]
    )
    p = estimate.production
    notes = [
        f"The tail (ramp-up and the drain of the last requests) takes {duration(p.tail_s)}; {p.interval_note}.",
        *estimate.notes,
    ]
    return Stack((figures, Notes(notes, title="Notes")))


def prompt_audit(estimate: Estimate) -> AuditReport | Notes:
    """The prompt file as generate will take it: what is priced, and what to fix before spending
    (``draftgen prompts audit``'s report)."""
    if estimate.audit is None:
        return Notes(["The prompt file was not audited."], title="The prompt set")
    return AuditReport(estimate.audit)


def arms_table(estimate: Estimate) -> Table:
    """The sampling plan's arms: requests, lengths, acceptance and speed, and where each figure came from."""
    return Table(
        estimate.arms_table(),
        (
            Column("arm", "arm", "text"),
            Column("requests_per_prompt", "requests per prompt", "number", digits=2),
            Column("requests", "requests", "int"),
            Column("max_tokens", "max_tokens", "int"),
            Column("mean_completion_tokens", "mean completion tokens", "number", digits=0),
            Column("truncated_rate", "truncated", "percent"),
            Column("accept_length", "acceptance length", "number", digits=2),
            Column("relative_speed", "speed vs the benchmark's mix", "ratio"),
            Column("share_of_tokens", "share of the tokens", "percent"),
            Column("lengths_from", "lengths from", "text"),
            Column("acceptance_from", "acceptance from", "text"),
        )
        if estimate.config.sampling_plan
        else None,
        empty="no sampling plan: one answer per prompt, priced from the benchmark's whole sample",
    )


def fit_table(estimate: Estimate) -> Table:
    """The benchmark's measured tok/s at each number of running requests beside the fitted curve."""
    points = estimate.benchmark.fit.points
    return Table(
        points,
        (
            Column("running", "requests running", "int"),
            Column("seconds", "time spent (s)", "number"),
            Column("tokens", "tokens", "int"),
            Column("measured_tok_s", "measured tok/s", "tok_s"),
            Column("fitted_tok_s", "fitted tok/s", "tok_s"),
            Column("rel_error", "fitted ÷ measured − 1", "percent"),
        )
        if {"running", "seconds", "tokens", "measured_tok_s", "fitted_tok_s", "rel_error"}
        <= set(points.columns)
        else None,
        empty="the benchmark's streams gave no points to fit",
    )


def headline(estimate: Estimate, out_dir: str | Path) -> Headline:
    """How many days and dollars will the whole set take on this fleet?"""
    p, c1 = estimate.production, estimate.concurrency_1
    clock = estimate.benchmark.data.clock
    longer = c1.wall_time_s / p.wall_time_s if p.wall_time_s else None
    out = Path(out_dir)
    return Headline(
        step="estimate",
        question="how long will the whole prompt set take on this fleet, and what will it cost?",
        answer=(
            f"{duration(p.wall_time_s)} and {format_value(p.cost_usd, 'usd')} for {p.num_prompts:,} requests on "
            f"{p.gpus} GPU × {p.concurrency_per_server} in flight"
        ),
        stats=[
            Stat(
                "wall time",
                duration(p.wall_time_s),
                "",
                f"{estimate.config.interval:.0%} interval {duration(p.wall_time_low_s)} – {duration(p.wall_time_high_s)}",
            ),
            Stat(
                "cost",
                format_value(p.cost_usd, "usd"),
                "",
                f"{format_value(p.gpu_hours, 'number')} GPU-hours at "
                f"{format_value(p.gpu_hour_usd, 'usd', 2)}/GPU-hour",
            ),
            Stat(
                "fleet output",
                format_value(p.aggregate_output_tok_s, "tok_s"),
                "tok/s",
                f"{format_value(p.tok_s_per_gpu, 'tok_s')} tok/s per GPU",
            ),
            Stat(
                "per million trained tokens",
                f"{p.gpu_s_per_m_trained:,.0f}",
                "GPU-s",
                f"{format_value(p.usd_per_m_trained, 'usd', 2)}; {p.trained_tokens:,.0f} trained tokens"
                + (
                    f", capped at max_length {estimate.benchmark.lengths.max_length}"
                    if estimate.benchmark.lengths.max_length
                    else ""
                ),
            ),
            Stat("requests", f"{p.num_prompts:,}", "", estimate.num_prompts_source),
            Stat(
                "at concurrency 1",
                f"{longer:,.1f}×" if longer else "–",
                "longer",
                f"{duration(c1.wall_time_s)}: how the last plan was made",
            ),
        ],
        reason=(
            "max_tokens is above the benchmark's, whose completions cut there could have run longer: the time is a "
            "lower bound"
            if p.lengths_are_lower_bound
            else ""
        ),
        verdict="WARN" if p.lengths_are_lower_bound else "",
        clock=clock.note,
        files=[
            ("estimate (generate reads it)", out / ESTIMATE_FILE),
            ("scenarios", out / ESTIMATE_SCENARIOS),
        ],
        home=out,
    )
