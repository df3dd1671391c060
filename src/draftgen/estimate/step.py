"""The estimate step, whole: estimate.ipynb (and any other face) calls ``run`` and then only shows its result.

``run`` prices the prompt set, saves estimate.json, scenarios.parquet and every plot into ``out_dir`` and marks the
folder finished (``draftgen.rundir.run_folder``; docs/design.md, "What each step writes").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from draftgen.display.plots import Plot, save
from draftgen.estimate import report
from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.plan import Estimate, run_estimate
from draftgen.rundir import finish_run, layout, open_run

FIGURES: dict[str, Callable[[Estimate], Figure]] = {
    layout.ESTIMATE_PLOT_SCENARIOS: report.plot_scenarios,
    layout.ESTIMATE_PLOT_CONCURRENCY: report.plot_sweep_concurrency,
    layout.ESTIMATE_PLOT_MAX_TOKENS: report.plot_sweep_max_tokens,
    layout.ESTIMATE_PLOT_GPUS: report.plot_sweep_gpus,
    layout.ESTIMATE_PLOT_RATE_FIT: report.plot_rate_fit,
}


@dataclass(frozen=True)
class EstimateResult:
    """A finished estimate: what its views read, where estimate.json is, its plots as saved (by layout name)."""

    estimate: Estimate
    path: Path  # estimate.json
    plots: dict[str, Plot]


def run(config: EstimateConfig) -> EstimateResult:
    """Estimate as ``config`` says and write the whole run folder, ``config.out_dir``."""
    out = open_run(config.out_dir, config.public_dict())
    estimate = run_estimate(config)
    path = report.save_estimate(estimate, out)
    plots = {name: save(draw(estimate), out, name) for name, draw in FIGURES.items()}
    finish_run(out)
    return EstimateResult(estimate, path, plots)
