"""Benchmark records → tables (results.parquet, requests.parquet, occupancy.parquet), the knee, and plots.

The parquet files hold raw wall-clock measurements, with the clock factor beside them (``clock_factor`` column,
``benchmark.json`` ``clock``). What a person reads — the fleet table, the recommendation, the plots — is on the
hardware's clock (``draftgen.client.clock``): against ``draftgen sim --speed 5``, tok/s per simulated B200, not 5× that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from draftgen.bench.occupancy import occupancy_frame
from draftgen.bench.records import BenchmarkRun, ServerFacts
from draftgen.bench.stats import level_row, request_rows, worker_rows
from draftgen.breakdown import Breakdowns, breakdowns
from draftgen.client.clock import WALL, HardwareClock, fleet_clock, on_clock
from draftgen.display.breakdown_plots import acceptance_by_category, acceptance_by_length
from draftgen.display.headline import Headline, Stat
from draftgen.display.notes import Notes, Stack
from draftgen.display.plots import new_figure
from draftgen.display.table import Column, Table, figures_table, format_value
from draftgen.rundir import write_json, write_parquet
from draftgen.rundir.layout import BENCH_OCCUPANCY as OCCUPANCY_FILE
from draftgen.rundir.layout import BENCH_REQUESTS as REQUESTS_FILE
from draftgen.rundir.layout import BENCH_RESULTS as RESULTS_FILE
from draftgen.rundir.layout import BENCH_SUMMARY as SUMMARY_FILE
from draftgen.rundir.layout import BENCH_WORKERS as WORKERS_FILE
from draftgen.server_settings import settings_record

WORKER_SCHEMA = {
    "server": pl.String,
    "gpu": pl.Int64,
    "concurrency": pl.Int64,
    "worker": pl.String,
    "generated_tokens": pl.Float64,
    "output_tok_s": pl.Float64,
    "accept_length": pl.Float64,
    "accept_length_source": pl.String,
}


@dataclass(frozen=True)
class Recommendation:
    concurrency_per_server: int
    knee: int
    knee_tok_s: float  # mean per-server output tok/s at the knee, on the hardware's clock
    best_concurrency: int
    best_tok_s: float  # on the hardware's clock
    max_running_requests: int | None
    knee_fraction: float
    reason: str


@dataclass(frozen=True)
class BenchmarkReport:
    results: pl.DataFrame  # one row per server × level, raw wall-clock figures (results.parquet)
    requests: pl.DataFrame  # one row per request, raw (requests.parquet)
    occupancy: pl.DataFrame  # seconds and tokens per in-flight count, per server × level, raw
    fleet: pl.DataFrame  # one row per level, all servers together, on the hardware's clock
    servers: tuple[ServerFacts, ...]
    recommendation: Recommendation
    missing: tuple[str, ...]  # what the servers did not send, fleet-wide, in plain words
    warnings: tuple[
        str, ...
    ]  # measurements to doubt (a busy client, failed requests, too few requests per slot)
    summary: dict  # what benchmark.json holds
    workers: pl.DataFrame = field(default_factory=pl.DataFrame)  # behind a router: one row per worker × level
    clock: HardwareClock = WALL  # the servers' clock: what the fleet table, recommendation and plots are on

    @property
    def results_on_clock(self) -> pl.DataFrame:
        """``results`` with its tok/s and seconds on the hardware's clock (what the notebook shows)."""
        return on_clock(self.results, self.clock)


def _facts_by_url(run: BenchmarkRun) -> dict[str, ServerFacts]:
    return {f.url: f for f in run.servers}


def fleet_table(results: pl.DataFrame) -> pl.DataFrame:
    """Per level: fleet output tok/s (sum over servers) and the per-server spread."""
    return (
        results.group_by("concurrency")
        .agg(
            pl.len().alias("servers"),
            pl.col("output_tok_s").sum().alias("fleet_output_tok_s"),
            pl.col("output_tok_s").mean().alias("per_server_tok_s_mean"),
            pl.col("output_tok_s").min().alias("per_server_tok_s_min"),
            pl.col("output_tok_s").max().alias("per_server_tok_s_max"),
            pl.col("requests_per_s").sum().alias("fleet_requests_per_s"),
            pl.col("ttft_s_p50").median().alias("ttft_s_p50"),
            pl.col("itl_s_p50").median().alias("itl_s_p50"),
            pl.col("e2e_s_p50").median().alias("e2e_s_p50"),
            pl.col("accept_length").mean().alias("accept_length_mean"),
            pl.col("failed").sum().alias("failed"),
        )
        .sort("concurrency")
    )


def find_knee(concurrency: list[int], tok_s: list[float], fraction: float) -> tuple[int, float, int, float]:
    """(knee, its tok/s, best level, best tok/s): the least concurrency reaching ``fraction`` of the best."""
    pairs = sorted(
        (c, t) for c, t in zip(concurrency, tok_s, strict=True) if t is not None and np.isfinite(t)
    )
    if not pairs:
        raise ValueError("no level produced a throughput: every request failed")
    best_c, best = max(pairs, key=lambda p: p[1])
    for c, t in pairs:
        if t >= fraction * best:
            return c, t, best_c, best
    return best_c, best, best_c, best


def recommend(
    fleet: pl.DataFrame, servers: tuple[ServerFacts, ...], fraction: float, clock: HardwareClock = WALL
) -> Recommendation:
    levels = fleet["concurrency"].to_list()
    knee, knee_tok, best_c, best = find_knee(levels, fleet["per_server_tok_s_mean"].to_list(), fraction)
    caps = [f.max_running_requests for f in servers if f.max_running_requests]
    cap = min(caps) if caps else None
    reason = (
        f"{knee} is the least measured concurrency reaching {fraction:.0%} of the best mean per-server throughput "
        f"({best:,.0f} tok/s at {best_c}{', ' + clock.short if clock.simulated else ''})"
    )
    if cap is None:
        reason += "; the servers do not report max_running_requests, so the batch cap is unknown"
    elif knee > cap:
        reason += (
            f"; it is above max_running_requests={cap}: the extra {knee - cap} requests per server wait in the "
            "server's queue, which keeps its batch full between one request finishing and the next arriving"
        )
    else:
        above = [c for c in levels if c > cap]
        if above:
            reason += f"; levels above max_running_requests={cap} ({', '.join(map(str, above))}) only queue"
    return Recommendation(
        concurrency_per_server=knee,
        knee=knee,
        knee_tok_s=knee_tok,
        best_concurrency=best_c,
        best_tok_s=best,
        max_running_requests=cap,
        knee_fraction=fraction,
        reason=reason,
    )


def fleet_missing(results: pl.DataFrame, servers: tuple[ServerFacts, ...]) -> tuple[str, ...]:
    notes = []
    for facts in servers:
        server_rows = results.filter(pl.col("server") == facts.url)
        parts = sorted({p for text in server_rows["missing"].to_list() for p in text.split("; ") if p})
        if facts.max_running_requests is None:
            parts.append("max_running_requests (/server_info)")
        if parts:
            notes.append(f"server {facts.index} {facts.url}: " + "; ".join(parts))
    return tuple(notes)


def measurement_warnings(results: pl.DataFrame) -> tuple[str, ...]:
    """Levels whose numbers deserve doubt, and why: one line per kind of doubt, naming every level it touches."""
    busy: list[str] = []
    failed: list[str] = []
    ramp: list[str] = []
    reused: list[str] = []
    for row in results.iter_rows(named=True):
        where = f"GPU {row['gpu']} c={row['concurrency']}"
        if row.get("reused"):
            reused.append(where)
        itl = row["itl_s_p50"]
        if itl and row["client_lag_ms_p99"] > 1000.0 * itl:
            busy.append(f"{where} ({row['client_lag_ms_p99']:.0f} ms late vs {1000 * itl:.0f} ms steps)")
        if row["failed"]:
            failed.append(f"{where} ({row['failed']} of {row['requests']} requests failed)")
        if row["rounds"] < 2:
            ramp.append(f"{where} ({row['requests']} requests for {row['concurrency']} slots)")
    notes = []
    if busy:
        notes.append(
            "the client's event loop ran late (p99) by more than one decode step, so these latencies include "
            "client delay (benchmark from a less busy machine, or with parallel_servers=False): "
            + "; ".join(busy)
        )
    if failed:
        notes.append("requests failed (see requests.parquet): " + "; ".join(failed))
    if ramp:
        notes.append(
            "no steady phase, the throughput is mostly ramp-up and drain (send at least twice the concurrency: "
            "raise num_prompts or rounds): " + "; ".join(ramp)
        )
    if reused:
        notes.append(
            "measured by an earlier, interrupted run and reused (resume=True; the servers, prompts and sampling "
            "matched, but anything changed on the servers since is not in these numbers): "
            + "; ".join(reused)
        )
    return tuple(notes)


def servers_clock(servers: tuple[ServerFacts, ...]) -> tuple[HardwareClock, str]:
    """The fleet's clock from each server's facts, and a warning when they differ."""
    return fleet_clock(
        [
            HardwareClock(
                f.clock_factor, f.hardware, "draftgen sim /sim/info" if f.hardware else "wall clock"
            )
            for f in servers
        ]
    )


def build_report(run: BenchmarkRun) -> BenchmarkReport:
    facts = _facts_by_url(run)
    clock, clock_warning = servers_clock(run.servers)
    max_tokens = run.config.max_tokens
    request_dicts: list[dict] = []
    level_dicts: list[dict] = []
    for level in run.levels:
        rows = request_rows(level, facts[level.server], max_tokens)
        request_dicts.extend(rows)
        level_dicts.append(level_row(level, facts[level.server], rows, max_tokens))
    requests = pl.DataFrame(request_dicts, infer_schema_length=None).with_columns(
        # typed even when no row was compared (all null), so the estimate reads them alike
        pl.col("answer_point").cast(pl.Int64),
        pl.col("diverged").cast(pl.Boolean),
        pl.col("source_called").cast(pl.Boolean),
    )
    workers = pl.DataFrame(
        [row for level in run.levels for row in worker_rows(level)], schema=WORKER_SCHEMA
    ).sort(["gpu", "concurrency", "worker"])
    results = (
        pl.DataFrame(level_dicts, infer_schema_length=None)
        .with_columns(
            pl.col("server")
            .replace_strict({f.url: f.clock_factor for f in run.servers}, return_dtype=pl.Float64)
            .alias("clock_factor")
        )
        .sort(["gpu", "concurrency"])
    )
    fleet = fleet_table(on_clock(results, clock))
    recommendation = recommend(fleet, run.servers, run.config.knee_fraction, clock)
    missing = fleet_missing(results, run.servers)
    warnings = measurement_warnings(results) + ((clock_warning,) if clock_warning else ())
    ok = requests.filter(pl.col("ok"))
    summary = {
        "config": run.config.public_dict(),
        "clock": clock.as_dict(),  # results/requests/occupancy.parquet are wall-clock; the recommendation is on this
        "servers": [asdict(f) for f in run.servers],
        "recommendation": asdict(recommendation),
        "missing": list(missing),
        "warnings": list(warnings),
        "max_tokens": max_tokens,
        "num_servers": len(run.servers),
        "requests": requests.height,
        "failed": requests.height - ok.height,
        "mean_completion_tokens": ok["completion_tokens"].mean() if ok.height else None,
        "truncated_rate": ok["truncated"].mean() if ok.height else None,
        "empty_answer_rate": ok["empty_answer"].mean() if ok.height else None,
        "sample": {
            "size": run.sample_size,
            "rows_read": run.sample_rows_read,
            "rejected": run.sample_rejected,
        },
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "server_settings": settings_record(run.config.settings),
    }
    return BenchmarkReport(
        results=results,
        requests=requests,
        occupancy=occupancy_frame(requests),
        fleet=fleet,
        servers=run.servers,
        recommendation=recommendation,
        missing=missing,
        warnings=warnings,
        summary=summary,
        workers=workers,
        clock=clock,
    )


def save_report(report: BenchmarkReport, out_dir: str | Path) -> Path:
    """Write results.parquet, requests.parquet, occupancy.parquet and benchmark.json into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / RESULTS_FILE, report.results)
    write_parquet(out / REQUESTS_FILE, report.requests)
    write_parquet(out / OCCUPANCY_FILE, report.occupancy)
    if not report.workers.is_empty():
        write_parquet(out / WORKERS_FILE, report.workers)
    write_json(out / SUMMARY_FILE, report.summary, indent=2, default=str)
    return out


# ----- plots: one question each -----------------------------------------------------------------------------
# Figures are built without pyplot: nothing is shown twice in a notebook, nothing leaks between calls.
def _clock_line(clock: HardwareClock) -> str:
    """A second title line naming the simulated clock; "" on real servers."""
    if not clock.simulated:
        return ""
    x = f"{clock.factor:g}"
    return f"\n(simulated {clock.hardware}: sim clock ×{x} — wall-clock tok/s ÷{x}, seconds ×{x})"


def _levels_axis(ax, levels: list[int]) -> None:  # type: ignore[no-untyped-def]
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.minorticks_off()
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("requests in flight per server (concurrency)")


def plot_throughput(report: BenchmarkReport) -> Figure:
    fig, ax = new_figure((8, 4.5))
    levels = report.fleet["concurrency"].to_list()
    results = report.results_on_clock
    for facts in report.servers:
        rows = results.filter(pl.col("server") == facts.url).sort("concurrency")
        ax.plot(
            rows["concurrency"], rows["output_tok_s"], marker="o", lw=1, alpha=0.6, label=f"GPU {facts.index}"
        )
    ax.plot(levels, report.fleet["per_server_tok_s_mean"], color="black", lw=2.5, label="mean per server")
    rec = report.recommendation
    ax.scatter([rec.knee], [rec.knee_tok_s], s=180, facecolors="none", edgecolors="red", lw=2, zorder=5)
    ax.annotate(
        f"knee: {rec.knee}",
        (rec.knee, rec.knee_tok_s),
        textcoords="offset points",
        xytext=(8, -16),
        color="red",
    )
    if rec.max_running_requests:
        ax.axvline(rec.max_running_requests, color="grey", ls="--", lw=1)
        ax.annotate(
            f"max_running_requests={rec.max_running_requests}",
            (rec.max_running_requests, 0),
            textcoords="offset points",
            xytext=(4, 6),
            color="grey",
            fontsize=8,
        )
    _levels_axis(ax, levels)
    ax.set_ylabel(f"output tokens/s {report.clock.per_gpu if report.clock.simulated else 'per server'}")
    ax.set_ylim(bottom=0)
    ax.set_title("Output tokens/s per server vs concurrency: where is the knee?" + _clock_line(report.clock))
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def plot_latency(report: BenchmarkReport) -> Figure:
    fig, axes = new_figure((13, 4), 3)
    levels = report.fleet["concurrency"].to_list()
    results = report.results_on_clock
    for ax, name, label in zip(
        axes,
        ("ttft_s", "itl_s", "e2e_s"),
        ("time to first token", "inter-token latency (per chunk)", "end-to-end latency"),
        strict=True,
    ):
        for facts in report.servers:
            rows = results.filter(pl.col("server") == facts.url).sort("concurrency")
            ax.plot(rows["concurrency"], rows[f"{name}_p50"], lw=1, alpha=0.5, color="tab:blue", marker="o")
            ax.plot(
                rows["concurrency"],
                rows[f"{name}_p90"],
                lw=1,
                alpha=0.5,
                color="tab:orange",
                ls="--",
                marker="x",
            )
        ax.plot([], [], color="tab:blue", label="p50 (one line per server)")
        ax.plot([], [], color="tab:orange", ls="--", label="p90")
        _levels_axis(ax, levels)
        ax.set_ylabel(f"seconds ({report.clock.short})" if report.clock.simulated else "seconds")
        ax.set_title(label, fontsize=10)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    fig.suptitle("How do latencies grow with concurrency?" + _clock_line(report.clock))
    fig.tight_layout()
    return fig


def plot_acceptance(report: BenchmarkReport) -> Figure:
    fig, ax = new_figure((8, 4))
    per_request = report.requests.filter(pl.col("ok") & pl.col("spec_accept_length").is_not_null())
    labels, data = [], []
    for facts in report.servers:
        values = per_request.filter(pl.col("server") == facts.url)["spec_accept_length"].to_list()
        if values:
            labels.append(f"GPU {facts.index}")
            data.append(values)
    if data:
        ax.boxplot(data, tick_labels=labels, showfliers=False)
        ax.set_ylabel("acceptance length per request\n(tokens per verify step, from sglext)")
        ax.set_xlabel("server (box: middle half of its requests, whiskers: the rest)")
    else:
        for facts in report.servers:
            rows = report.results.filter(pl.col("server") == facts.url).drop_nulls("accept_length")
            if rows.height:
                ax.plot(rows["concurrency"], rows["accept_length"], marker="o", label=f"GPU {facts.index}")
        if ax.lines:
            _levels_axis(ax, report.fleet["concurrency"].to_list())
            ax.set_ylabel("acceptance length per level (/metrics or server_info)")
            ax.legend(fontsize=8)
        else:
            ax.text(
                0.5,
                0.5,
                "no acceptance data from any server",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
    ax.set_title("What acceptance length does each server reach (the bar to beat)?")
    fig.tight_layout()
    return fig


def plot_per_gpu(report: BenchmarkReport) -> Figure:
    fig, ax = new_figure((8, 4))
    rec = report.recommendation.concurrency_per_server
    low = min(report.fleet["concurrency"].to_list())
    names, alone, busy = [], [], []
    results = report.results_on_clock
    for facts in report.servers:
        rows = results.filter(pl.col("server") == facts.url)
        names.append(f"GPU {facts.index}")
        alone.append(rows.filter(pl.col("concurrency") == low)["output_tok_s"].sum())
        busy.append(rows.filter(pl.col("concurrency") == rec)["output_tok_s"].sum())
    x = np.arange(len(names))
    ax.bar(x - 0.2, alone, 0.4, label=f"concurrency {low}")
    ax.bar(x + 0.2, busy, 0.4, label=f"concurrency {rec} (recommended)")
    ax.set_xticks(x)
    ax.set_xticklabels(names)
    ax.set_ylabel(f"output tokens/s {report.clock.per_gpu if report.clock.simulated else ''}".strip())
    ax.set_title(
        f"How many tokens/s does each GPU deliver at concurrency {low} vs {rec}?" + _clock_line(report.clock)
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def acceptance_breakdowns(report: BenchmarkReport) -> Breakdowns:
    """Acceptance length and tok/s per request of the sample by prompt category, output length and sampling-plan
    arm, over every level's answered requests (per-request tok/s then mixes the levels' batch sizes; acceptance
    hardly depends on them), tok/s on the servers' clock."""
    ok = report.requests.filter(pl.col("ok"))
    frame = ok.select(
        *(
            pl.col(name).cast(pl.String) if name in ok.columns else pl.lit(None, pl.String).alias(name)
            for name in ("category", "arm")
        ),
        "completion_tokens",
        pl.col("spec_verify_ct").alias("verify_ct"),
        pl.col("spec_accept_length").alias("accept_length"),
        (pl.col("e2e_s") * report.clock.factor).alias("latency_s"),
    )
    groups = ["category", "length"] if frame["category"].drop_nulls().len() else ["length"]
    if frame["arm"].drop_nulls().len():
        groups.append("arm")
    return breakdowns(frame, groups)


def plot_acceptance_by_category(report: BenchmarkReport) -> Figure:
    return acceptance_by_category(acceptance_breakdowns(report).get("category"), "the sample's requests")


def plot_acceptance_by_length(report: BenchmarkReport) -> Figure:
    return acceptance_by_length(acceptance_breakdowns(report)["length"], "the sample's requests")


def plot_lengths(report: BenchmarkReport, max_tokens: int) -> Figure:
    fig, ax = new_figure((8, 4))
    ok = report.requests.filter(pl.col("ok")).drop_nulls("completion_tokens")
    values = ok["completion_tokens"].to_numpy()
    if values.size:
        ax.hist(values, bins=40, color="tab:blue", alpha=0.8)
    ax.axvline(max_tokens, color="red", ls="--", label=f"max_tokens={max_tokens:,} (caps each request)")
    truncated = float(ok["truncated"].mean()) if ok.height else 0.0
    empty = float(ok["empty_answer"].mean()) if ok.height else 0.0
    ax.set_xlabel("completion tokens per request (reasoning + answer)")
    ax.set_ylabel("requests")
    ax.set_title(f"How long are completions? {truncated:.1%} hit max_tokens, {empty:.1%} empty answers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----- what the report shows --------------------------------------------------------------------------------
RESULT_COLUMNS = (
    Column("gpu", "GPU", "int"),
    Column("concurrency", "in flight", "int"),
    Column("ok", "ok", "int"),
    Column("failed", "failed", "int"),
    Column("output_tok_s", "output tok/s", "tok_s"),
    Column("requests_per_s", "requests/s", "number", 2),
    Column("ttft_s_p50", "TTFT p50 (s)", "number"),
    Column("ttft_s_p90", "TTFT p90 (s)", "number"),
    Column("itl_s_p50", "ITL p50 (s)", "number", 3),
    Column("tpot_s_p50", "TPOT p50 (s)", "number", 4),
    Column("e2e_s_p50", "E2E p50 (s)", "number"),
    Column("e2e_s_p99", "E2E p99 (s)", "number"),
    Column("accept_length", "acceptance length", "number", 2),
)
FLEET_COLUMNS = (
    Column("concurrency", "in flight per server", "int"),
    Column("servers", "servers", "int"),
    Column("fleet_output_tok_s", "fleet output tok/s", "tok_s"),
    Column("per_server_tok_s_mean", "tok/s per server, mean", "tok_s"),
    Column("per_server_tok_s_min", "min", "tok_s"),
    Column("per_server_tok_s_max", "max", "tok_s"),
    Column("ttft_s_p50", "TTFT p50 (s)", "number"),
    Column("itl_s_p50", "ITL p50 (s)", "number", 3),
    Column("e2e_s_p50", "E2E p50 (s)", "number"),
    Column("accept_length_mean", "acceptance length", "number", 2),
    Column("failed", "failed", "int"),
)


def _sources(report: BenchmarkReport) -> str:
    """Where tokens and acceptance came from, in a sentence (the *_source columns, fleet-wide)."""
    results = report.results
    parts = []
    for column, what in (("output_tokens_source", "output tokens"), ("accept_length_source", "acceptance")):
        if column in results.columns:
            values = sorted({str(v) for v in results[column].drop_nulls().to_list()})
            parts.append(f"{what} from {' and '.join(values) if values else 'nowhere (not reported)'}")
    return "; ".join(parts)


def results_table(report: BenchmarkReport) -> Table:
    """One row per server × level, on the hardware's clock, with units; the sources as a note."""
    clock = report.clock
    note = "; ".join(p for p in (_sources(report), clock.note) if p)
    return Table(
        report.results_on_clock,
        RESULT_COLUMNS,
        note=note,
        keys=("gpu", "concurrency"),
        empty="no level was measured",
    )


def workers_table(report: BenchmarkReport) -> Table:
    """Behind a router: each worker's tokens and acceptance from its own /metrics."""
    return Table(
        on_clock(report.workers, report.clock),
        (
            "gpu",
            "concurrency",
            "worker",
            "generated_tokens",
            "output_tok_s",
            "accept_length",
            "accept_length_source",
        ),
        empty="no router between the client and the servers: each server is its own worker (the table above)",
    )


def fleet_view(report: BenchmarkReport) -> Table:
    """The fleet level by level (all servers together), on the hardware's clock."""
    rec = report.recommendation
    return Table(
        report.fleet,
        FLEET_COLUMNS,
        note=f"recommended concurrency_per_server: {rec.concurrency_per_server}. {rec.reason}.",
        empty="no level was measured",
    )


def findings(report: BenchmarkReport) -> Stack:
    """What the servers did not send, and which levels deserve doubt: sentences."""
    return Stack(
        (
            Notes(
                report.missing,
                title="What the servers did not send",
                none="Nothing missing: usage, [DONE], per-request acceptance and /metrics all present.",
                level="warn",
            ),
            Notes(
                report.warnings,
                title="What to doubt",
                none="No warnings: every level had a steady phase, no failures, and the client kept up.",
                level="warn",
            ),
        )
    )


def sample_table(report: BenchmarkReport) -> Table:
    """The sample's completions: how many, how long, how often cut by max_tokens or empty."""
    s = report.summary
    return figures_table(
        [
            ("requests sent", s["requests"], "int"),
            ("failed", s["failed"], "int"),
            ("mean completion length (tokens)", s["mean_completion_tokens"], "int"),
            (f"cut by max_tokens ({s['max_tokens']:,})", s["truncated_rate"], "percent"),
            ("empty answers (finish 'stop', no answer text)", s["empty_answer_rate"], "percent"),
        ]
    )


def headline(report: BenchmarkReport, out_dir: str | Path) -> Headline:
    """How many output tok/s per GPU, at which concurrency, with what acceptance?"""
    rec = report.recommendation
    fleet = report.fleet
    at = fleet.filter(pl.col("concurrency") == rec.concurrency_per_server).row(0, named=True)
    low = fleet.sort("concurrency").row(0, named=True)
    clock = report.clock
    per = clock.per_gpu if clock.simulated else "per GPU"
    accept = at.get("accept_length_mean")
    failed = int(report.summary["failed"])
    speedup = rec.knee_tok_s / low["per_server_tok_s_mean"] if low["per_server_tok_s_mean"] else None
    stats = [
        Stat("recommended concurrency", f"{rec.concurrency_per_server}", "in flight per server"),
        Stat(
            f"output tok/s {per}",
            format_value(rec.knee_tok_s, "tok_s"),
            "tok/s",
            f"at {rec.concurrency_per_server} in flight",
        ),
        Stat(
            f"at {low['concurrency']} in flight",
            format_value(low["per_server_tok_s_mean"], "tok_s"),
            "tok/s",
            f"{speedup:.1f}× less" if speedup else "",
        ),
        Stat(
            "acceptance length",
            format_value(accept, "number", 2),
            "tokens per verify step",
            f"at {rec.concurrency_per_server} in flight",
        ),
        Stat(
            "TTFT p50",
            format_value(at.get("ttft_s_p50"), "number"),
            "s",
            f"at {rec.concurrency_per_server} in flight",
        ),
        Stat("failed requests", f"{failed:,}", f"of {report.summary['requests']:,}"),
    ]
    doubts = len(report.warnings)
    answer = (
        f"{format_value(rec.knee_tok_s, 'tok_s')} output tok/s {per} at {rec.concurrency_per_server} requests in "
        f"flight per server" + (f", acceptance length {accept:.2f}" if accept is not None else "")
    )
    out = Path(out_dir)
    return Headline(
        step="benchmark",
        question="how many output tokens/s does each GPU deliver, at which concurrency, with what acceptance?",
        answer=answer,
        stats=stats,
        verdict="WARN" if failed or doubts else "",
        reason=(f"{doubts} warning(s) below name levels to doubt" if doubts else "")
        + ("; " if doubts and failed else "")
        + (f"{failed:,} requests failed" if failed else ""),
        clock=clock.note,
        files=[
            ("per server × level", out / RESULTS_FILE),
            ("per request", out / REQUESTS_FILE),
            ("summary the estimate reads", out / SUMMARY_FILE),
        ],
        home=out,
    )
