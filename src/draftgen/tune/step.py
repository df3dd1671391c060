"""The tune step, whole: tune.ipynb and ``draftgen tune`` both call ``run`` and then only show its result.

The race (unless off) and the verdict (when asked), the race's report and settings file saved the moment the race
ends (an interrupted verdict loses none of it), then tune.json, the candidate table, the verdict's files and the
plots in ``out_dir``, which ``run`` opens and marks finished (``draftgen.rundir.run_folder``). The notebook shows
what it returns cell by cell; the command prints it (docs/tune.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from draftgen.display.headline import Headline, Stat
from draftgen.display.plots import Plot, save
from draftgen.display.table import format_value
from draftgen.rundir import finish_run, layout, open_run
from draftgen.rundir.layout import TUNE_SUMMARY
from draftgen.tune import report, verdict_report
from draftgen.tune.config import TuneConfig
from draftgen.tune.run import TuneRun, run_tune


@dataclass(frozen=True)
class TuneReport:
    """A finished tune run and what it saved to ``out_dir``."""

    run: TuneRun
    info: dict[str, Any]  # tune.json
    table: pl.DataFrame | None  # the race's candidates, best first (None: race off)
    verdict: verdict_report.Verdict | None  # None: no verdict asked
    plots: dict[
        str, Plot
    ]  # by layout name (TUNE_PLOT_*); the race's two only when it ran, the verdict's likewise

    @property
    def chosen(self) -> bool:
        """Whether a settings file was written: the race chose a candidate, or the verdict alone named a winner
        (a tie writes none: docs/tune.md, "The verdict")."""
        if self.table is not None:
            return self.run.chosen is not None
        return self.verdict is not None and self.verdict.winner is not None

    @property
    def answered(self) -> bool:
        """Whether the run answered its question: the race chose a candidate, or the verdict alone measured one
        best (a winner, or a tie between candidates within each other's noise)."""
        if self.table is not None:
            return self.run.chosen is not None
        return self.verdict is not None and self.verdict.ranking.best is not None


async def run(config: TuneConfig, log: Callable[[str], None] = print) -> TuneReport:
    """Run tune as ``config`` says and write the whole run folder, ``config.out_dir``: its report, tables, settings
    file and plots."""
    out = open_run(config.out_dir, config.public_dict())

    def save_race(race: TuneRun) -> None:
        report.save_report(race)  # before the verdict: an interrupted verdict loses none of the race
        if race.chosen is not None:
            log(
                f"draftgen tune: race saved, {race.chosen.label} written to {config.settings_path}; the verdict next"
            )

    run = await run_tune(config, log, on_race=save_race)
    info = report.save_report(run)
    plots: dict[str, Plot] = {}
    table = report.candidate_table(run) if run.candidates else None
    if table is not None:
        plots[layout.TUNE_PLOT_THROUGHPUT] = save(
            report.plot_throughput(table, config.interval), out, layout.TUNE_PLOT_THROUGHPUT
        )
        plots[layout.TUNE_PLOT_ACCEPTANCE] = save(
            report.plot_acceptance(table, config.interval), out, layout.TUNE_PLOT_ACCEPTANCE
        )
    verdict = report.verdict_of(run)
    if verdict is not None:
        for value, name in (
            ("tok_s_per_gpu", layout.TUNE_PLOT_VERDICT_THROUGHPUT),
            ("accept_length", layout.TUNE_PLOT_VERDICT_ACCEPTANCE),
        ):
            plots[name] = save(verdict_report.plot_verdict(verdict, value), out, name)
    finish_run(out)
    return TuneReport(run, info, table, verdict, plots)


def headline(tuned: TuneReport) -> Headline:
    """Which settings give the most output tok/s per GPU, and by how much over the seeds' MTP?"""
    info, verdict, config = tuned.info, tuned.verdict, tuned.run.config
    out = Path(config.out_dir)
    files: list[tuple[str, str | Path]] = [("summary", out / TUNE_SUMMARY)]
    if tuned.chosen:
        files.append(("settings for draftgen serve --settings", config.settings_path))
    stats: list[Stat] = []
    if tuned.table is not None and info.get("chosen_label"):
        low, high = info.get("tok_s_per_gpu_interval") or (None, None)
        stats += [
            Stat("chosen", str(info["chosen_label"]), "", f"at {info['concurrency']} in flight"),
            Stat(
                "output tok/s per GPU",
                format_value(info["tok_s_per_gpu"], "tok_s"),
                "tok/s",
                f"{config.interval:.0%} interval {format_value(low, 'tok_s')}–{format_value(high, 'tok_s')}",
            ),
            Stat("acceptance length", format_value(info.get("accept_length"), "number", 2), ""),
        ]
        if info.get("gain_vs_baseline") is not None:
            stats.append(
                Stat(
                    "against the baseline",
                    f"{info['gain_vs_baseline']:+.1%}",
                    "",
                    str(info["baseline_label"]),
                )
            )
    if verdict is not None:
        best = verdict.ranking.best
        if best is not None:
            stats.append(
                Stat(
                    f"verdict at {verdict.production} in flight",
                    verdict.winner.label if verdict.winner else "a tie",
                    "",
                    f"{format_value(best.tok_s_per_gpu, 'tok_s')} tok/s per GPU",
                )
            )
    stats.append(Stat("failed to start", f"{len(info.get('failed_to_start') or []):,}", "candidates"))
    if tuned.table is not None and info.get("chosen_label"):
        answer = (
            f"{info['chosen_label']}: {format_value(info['tok_s_per_gpu'], 'tok_s')} output tok/s per GPU at "
            f"{info['concurrency']} in flight"
        )
    elif verdict is not None:
        answer = verdict_report.headline(verdict).splitlines()[0]
    else:
        answer = "no candidate could be measured"
    return Headline(
        step="tune",
        question="which speculative settings and batch cap give the most output tok/s per GPU?",
        answer=answer,
        stats=stats,
        verdict="PASS" if tuned.answered else "FAIL",
        reason="" if tuned.answered else "no candidate could be measured: see the log tails below",
        files=files,
        home=out,
    )
