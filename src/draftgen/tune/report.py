"""A tune run → the candidate table, plots with intervals, tune.json, and the settings file serve launches."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from matplotlib.figure import Figure

from draftgen.display.checks import Checks
from draftgen.display.notes import Notes, Stack
from draftgen.display.plots import Plot, new_figure
from draftgen.display.table import Column, Table
from draftgen.rundir import write_json, write_parquet
from draftgen.rundir.layout import TUNE_CANDIDATES as CANDIDATES_FILE
from draftgen.rundir.layout import TUNE_JOBS as JOBS_FILE
from draftgen.rundir.layout import TUNE_SUMMARY as SUMMARY_FILE
from draftgen.server_settings import save_settings
from draftgen.tune import verdict_report
from draftgen.tune.checks import NOUN, run_checks
from draftgen.tune.estimate import estimate
from draftgen.tune.run import TuneRun

__all__ = [
    "Plot",
    "candidate_table",
    "plot_acceptance",
    "plot_throughput",
    "save_report",
]


def _status(run: TuneRun, index: int) -> str:
    jobs = [j for j in run.jobs if j.candidate.index == index]
    failed = next((j for j in jobs if not j.ok), None)
    if failed is not None:
        return "failed to start" if failed.start_failed else "failed"
    if run.chosen is not None and run.chosen.index == index:
        return "chosen"
    if index in run.eliminated_in:
        return f"dropped after round {run.eliminated_in[index]}"
    return "finalist"


def candidate_table(run: TuneRun) -> pl.DataFrame:
    """One row per candidate, best tok/s per GPU first; failed candidates last with the reason and log tail."""
    rows = []
    for cand in run.candidates:
        s = cand.settings
        est = run.estimates.get(cand.index)
        jobs = [j for j in run.jobs if j.candidate.index == cand.index]
        failed = next((j for j in jobs if not j.ok), None)
        rows.append(
            {
                "candidate": cand.label,
                "status": _status(run, cand.index),
                "speculative_algorithm": s.speculative_algorithm,
                "num_steps": s.speculative_num_steps,
                "eagle_topk": s.speculative_eagle_topk,
                "num_draft_tokens": s.speculative_num_draft_tokens,
                "adaptive": s.speculative_adaptive,
                "max_running_requests": s.max_running_requests,
                "concurrency": cand.concurrency,
                "tok_s_per_gpu": est.tok_s_per_gpu if est else None,
                "tok_s_per_gpu_low": est.tok_s_low if est else None,
                "tok_s_per_gpu_high": est.tok_s_high if est else None,
                "accept_length": est.accept_length if est else None,
                "accept_length_low": est.accept_low if est else None,
                "accept_length_high": est.accept_high if est else None,
                "accept_length_source": est.accept_source if est else None,
                "jobs": len(jobs),
                "steady_requests": est.steady_requests if est else 0,
                "failure": failed.failure if failed else None,
                "log_tail": "\n".join(failed.log_tail) if failed else None,
            }
        )
    table = pl.DataFrame(rows, infer_schema_length=None)
    return table.sort("tok_s_per_gpu", descending=True, nulls_last=True)


def jobs_table(run: TuneRun) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "candidate": j.candidate.label,
                "round": j.round,
                "replica": j.replica,
                "gpu_group": j.group,
                "ok": j.ok,
                "failure": j.failure,
                "startup_s": j.startup_s,
                "seconds": j.finished_at - j.started_at,
                "requests": j.requests,
                "failed_requests": j.failed_requests,
                "cancelled_requests": j.cancelled_requests,
                "stopped_by_clock": j.stopped_by_clock,
                "round_clock_s": j.clock_s,
                "steady_requests": len(j.steady_tokens),
                "accept_length": j.accept_length,
            }
            for j in [*run.jobs, *run.seeds_jobs]
        ],
        infer_schema_length=None,
    )


def ties_with_chosen(run: TuneRun) -> list[str]:
    """Finalists whose tok/s interval overlaps the chosen one's: the race's order between them may be noise
    (the chosen one still leads on the point figure, so it is the one written to the settings file)."""
    chosen = run.chosen
    est = run.estimates.get(chosen.index) if chosen else None
    if chosen is None or est is None:
        return []
    return [
        c.label
        for c in run.candidates
        if c.index != chosen.index
        and c.index not in run.eliminated_in
        and (other := run.estimates.get(c.index)) is not None
        and other.tok_s_low <= est.tok_s_high
        and est.tok_s_low <= other.tok_s_high
    ]


def summary(run: TuneRun) -> dict:
    chosen = run.chosen
    est = run.estimates.get(chosen.index) if chosen else None
    base, confirm = run.baseline, run.confirm
    base_est = estimate([base], run.config) if base is not None and base.ok else None
    confirm_est = estimate([confirm], run.config) if confirm is not None and confirm.ok else None
    return {
        "chosen": chosen.settings.model_dump(mode="json") if chosen else None,
        "chosen_label": chosen.label if chosen else None,
        "concurrency": chosen.concurrency if chosen else None,
        "tok_s_per_gpu": est.tok_s_per_gpu if est else None,
        "tok_s_per_gpu_interval": [est.tok_s_low, est.tok_s_high] if est else None,
        "accept_length": est.accept_length if est else None,
        "ties_with": ties_with_chosen(run),
        "baseline_label": base.candidate.label if base else None,
        "baseline_tok_s_per_gpu": base_est.tok_s_per_gpu if base_est else None,
        "baseline_accept_length": base_est.accept_length if base_est else None,
        "baseline_failure": base.failure if base is not None and not base.ok else None,
        "chosen_beside_baseline_tok_s_per_gpu": confirm_est.tok_s_per_gpu if confirm_est else None,
        "gain_vs_baseline": (
            confirm_est.tok_s_per_gpu / base_est.tok_s_per_gpu - 1 if confirm_est and base_est else None
        ),
        "candidates": len(run.candidates),
        "jobs": len(run.jobs),
        "failed_to_start": sorted({j.candidate.label for j in run.jobs if j.start_failed}),
        "wall_time_s": run.finished_at - run.started_at,
        "gpu_groups": len(run.config.groups),
        "engine": run.config.engine,
        "settings_file": str(run.config.settings_path) if chosen else None,
        "config": run.config.public_dict(),
    }


def verdict_of(run: TuneRun) -> verdict_report.Verdict | None:
    return verdict_report.verdict(run.verdict) if run.verdict is not None else None


def save_report(run: TuneRun) -> dict:
    """Write candidates.parquet, jobs.parquet, tune.json and (when a candidate won) the settings file."""
    out = Path(run.config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if run.candidates:  # the race ran
        write_parquet(out / CANDIDATES_FILE, candidate_table(run))
        write_parquet(out / JOBS_FILE, jobs_table(run))
    info = summary(run)
    if run.chosen is not None:
        provenance = {
            k: info[k]
            for k in (
                "chosen_label",
                "concurrency",
                "tok_s_per_gpu",
                "tok_s_per_gpu_interval",
                "accept_length",
            )
        }
        provenance |= {"engine": run.config.engine, "model": run.config.model, "tune_dir": str(out)}
        save_settings(run.config.settings_path, run.chosen.settings, provenance)
    verdict = verdict_of(run)
    if verdict is not None:
        info["verdict"] = verdict_report.save_verdict(verdict, out)
        if run.chosen is None and verdict.winner is not None:  # the verdict alone (race off): its winner
            best = verdict.point(verdict.winner, verdict.production)
            provenance = {
                "chosen_label": verdict.winner.label,
                "concurrency": verdict.production,
                "tok_s_per_gpu": best.tok_s_per_gpu if best else None,
                "accept_length": best.accept_length if best else None,
                "engine": run.config.engine,
                "model": run.config.model,
                "tune_dir": str(out),
                "from": "the verdict",
            }
            save_settings(run.config.settings_path, verdict.winner.settings, provenance)
            info["settings_file"] = str(run.config.settings_path)
    write_json(out / SUMMARY_FILE, info, indent=2, default=str)
    return info


def _errorbar(ax, table: pl.DataFrame, value: str, low: str, high: str) -> None:  # type: ignore[no-untyped-def]
    rows = table.filter(pl.col(value).is_not_null())
    labels = rows["candidate"].to_list()
    values = rows[value].to_list()
    lows = [v - (lo if lo is not None else v) for v, lo in zip(values, rows[low].to_list(), strict=True)]
    highs = [(hi if hi is not None else v) - v for v, hi in zip(values, rows[high].to_list(), strict=True)]
    colors = ["tab:green" if s == "chosen" else "tab:blue" for s in rows["status"].to_list()]
    positions = list(range(len(labels)))
    ax.barh(positions, values, color=colors, alpha=0.6)
    ax.errorbar(values, positions, xerr=[lows, highs], fmt="none", ecolor="black", capsize=3)
    ax.set_yticks(positions)
    ax.set_yticklabels(labels)
    ax.invert_yaxis()


def plot_throughput(table: pl.DataFrame, interval: float) -> Figure:
    measured = table.filter(pl.col("tok_s_per_gpu").is_not_null())
    fig, ax = new_figure((8, 0.45 * max(4, measured.height) + 1))
    _errorbar(ax, measured, "tok_s_per_gpu", "tok_s_per_gpu_low", "tok_s_per_gpu_high")
    ax.set_xlabel(f"output tok/s per GPU at the candidate's concurrency ({interval:.0%} interval)")
    ax.set_title("Which candidate gives the most output tok/s per GPU? (green: chosen)")
    return fig


def plot_acceptance(table: pl.DataFrame, interval: float) -> Figure:
    measured = table.filter(pl.col("accept_length").is_not_null())
    fig, ax = new_figure((8, 0.45 * max(4, measured.height) + 1))
    _errorbar(ax, measured, "accept_length", "accept_length_low", "accept_length_high")
    ax.set_xlabel(f"acceptance length, tokens per verify step ({interval:.0%} interval)")
    ax.set_title("What acceptance length does each candidate reach? (green: chosen)")
    return fig


def format_table(table: pl.DataFrame) -> str:
    """The candidate table as plain text lines (for the command line)."""
    lines = [f"{'candidate':<34} {'status':<24} {'tok/s per GPU':>24} {'acceptance':>20}"]
    for row in table.iter_rows(named=True):
        if row["tok_s_per_gpu"] is None:
            rate, accept = "-", "-"
        else:
            rate = f"{row['tok_s_per_gpu']:,.0f} [{row['tok_s_per_gpu_low']:,.0f}-{row['tok_s_per_gpu_high']:,.0f}]"
            accept = f"{row['accept_length']:.2f}" if row["accept_length"] is not None else "-"
            if row["accept_length_low"] is not None:
                accept += f" [{row['accept_length_low']:.2f}-{row['accept_length_high']:.2f}]"
        lines.append(f"{row['candidate']:<34} {row['status']:<24} {rate:>24} {accept:>20}")
        if row["failure"]:
            lines.append(f"    {row['failure']}")
            lines += [f"    | {line}" for line in (row["log_tail"] or "").splitlines()[-5:]]
    return "\n".join(lines)


# ----- what the report shows --------------------------------------------------------------------------------
def _with_interval(frame: pl.DataFrame, value: str, low: str, high: str, digits: int) -> list[str | None]:
    cells: list[str | None] = []
    for v, lo, hi in zip(frame[value], frame[low], frame[high], strict=True):
        if v is None:
            cells.append(None)
        elif lo is None or hi is None:
            cells.append(f"{v:,.{digits}f}")
        else:
            cells.append(f"{v:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})")
    return cells


def startup_view(run: TuneRun) -> Checks:
    """Did every candidate start and get measured? One row per check over the candidates, a row for each that
    did not (its log is named in the row; its tail is under the candidate table)."""
    return Checks(
        run_checks(run),
        title="Start-up and measurement, per candidate",
        noun=NOUN,
        empty="no candidate was started",
    )


def candidates_view(table: pl.DataFrame | None, interval: float) -> Table | Notes:
    """The race's candidates, best first: tok/s per GPU and acceptance with their intervals, failures named."""
    if table is None:
        return Notes((), none="The race was off (race: false): the verdict below is the whole run.")
    frame = table.select(
        "candidate",
        "status",
        "concurrency",
        pl.Series(
            "tok_s", _with_interval(table, "tok_s_per_gpu", "tok_s_per_gpu_low", "tok_s_per_gpu_high", 0)
        ),
        pl.Series(
            "accept", _with_interval(table, "accept_length", "accept_length_low", "accept_length_high", 2)
        ),
        "jobs",
        "steady_requests",
        "failure",
    )
    return Table(
        frame,
        (
            Column("candidate", kind="text"),
            Column("status", kind="text"),
            Column("concurrency", "in flight", "int"),
            Column("tok_s", f"output tok/s per GPU ({interval:.0%} interval)", "text"),
            Column("accept", f"acceptance length ({interval:.0%} interval)", "text"),
            Column("jobs", kind="int"),
            Column("steady_requests", "steady requests", "int"),
            Column("failure", kind="text"),
        ),
        empty="no candidate was measured",
    )


def verdict_views(verdict: verdict_report.Verdict | None) -> Stack:
    """The verdict's tables: each candidate at each level, and the days and dollars it costs."""
    if verdict is None:
        return Stack((Notes((), none="No verdict asked: set verdict_levels and drafters."),))
    return Stack(
        (
            Notes(verdict_report.headline(verdict).splitlines()),
            Table(
                verdict_report.table(verdict),
                title="Each candidate at each concurrency",
                keys=("candidate", "concurrency"),
            ),
        )
    )


def _frame_view(frame: pl.DataFrame, title: str = "") -> Table:
    """One of the verdict's tables, formatted from its column names."""
    keys = ("candidate",) if "candidate" in frame.columns else None
    return Table(frame, title=title, keys=keys, empty="nothing was measured")


def by_category_view(verdict: verdict_report.Verdict | None) -> Table | Notes:
    """Acceptance by prompt category per candidate and level, against the baseline's in that category."""
    if verdict is None:
        return Notes((), none="No verdict asked: set verdict_levels and drafters.")
    return _frame_view(verdict_report.by_category(verdict))


def by_length_view(verdict: verdict_report.Verdict | None) -> Table | Notes:
    """The same by output length: whether a drafter's gain holds on long answers."""
    if verdict is None:
        return Notes((), none="No verdict asked: set verdict_levels and drafters.")
    return _frame_view(verdict_report.by_length(verdict))


def money_view(verdict: verdict_report.Verdict | None) -> Table | Notes:
    """Days and dollars for the full prompt set per candidate, and what each saves against the baseline."""
    if verdict is None:
        return Notes((), none="No verdict asked: set verdict_levels and drafters.")
    return _frame_view(verdict_report.money_table(verdict))
