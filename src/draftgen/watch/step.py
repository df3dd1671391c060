"""The monitor step, whole: monitor.ipynb (and any other face) calls ``run`` and then only shows its result.

Read-only: ``run`` reads the generate run folder it watches (``monitor``'s readers) and returns what the notebook
shows; it writes nothing, there or anywhere. Under ``draftgen run`` the monitor's own run folder holds only its
executed notebook, report and parameters (docs/design.md, "What each step writes").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from draftgen.breakdown import Breakdowns
from draftgen.display.headline import Headline
from draftgen.display.plots import Plot
from draftgen.watch import monitor
from draftgen.watch.monitor import MonitorConfig
from draftgen.watch.status_tables import StatusTables


@dataclass(frozen=True)
class MonitorSnapshot:
    """One reading of a generate run: its headline, status, plots over time, and the finished shards' figures."""

    run_dir: Path
    headline: Headline
    status: StatusTables
    throughput: Plot  # tok/s and acceptance per server over time
    progress: Plot  # conversations done, the current rate projected to the end
    rows: pl.DataFrame  # finish reason and length of every generated turn in the finished shards
    finish_reasons: Plot
    completion_lengths: Plot
    breakdowns: Breakdowns
    by_category: Plot


def run(config: MonitorConfig) -> MonitorSnapshot:
    """Read the run ``config.run_dir`` once, as the notebook shows it; nothing is written."""
    folder = Path(config.run_dir)
    rows = monitor.read_shard_columns(folder)
    return MonitorSnapshot(
        run_dir=folder,
        headline=monitor.headline(folder),
        status=monitor.status(folder),
        throughput=monitor.plot_throughput_and_acceptance(folder, config.bins),
        progress=monitor.plot_progress(folder),
        rows=rows,
        finish_reasons=monitor.plot_finish_reasons(rows),
        completion_lengths=monitor.plot_completion_lengths(rows, monitor.max_tokens_of(folder)),
        breakdowns=monitor.acceptance_breakdowns(folder),
        by_category=monitor.plot_acceptance_by_category(folder),
    )
