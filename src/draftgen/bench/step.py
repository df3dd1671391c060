"""The benchmark step, whole: benchmark.ipynb (and any other face) calls ``run`` and then only shows its result.

``run`` measures, saves the tables, benchmark.json and every plot into ``out_dir`` and marks the folder finished
(``draftgen.rundir.run_folder``), so a notebook run by papermill or top to bottom in JupyterLab leaves the same
folder (docs/design.md, "What each step writes").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from matplotlib.figure import Figure

from draftgen.bench import report
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.report import BenchmarkReport
from draftgen.bench.run import run_benchmark
from draftgen.display.plots import Plot, save
from draftgen.rundir import finish_run, layout, open_run
from draftgen.rundir.run_folder import record_parameters


@dataclass(frozen=True)
class BenchmarkResult:
    """A finished benchmark: the report its views read, and its plots as saved (by layout name)."""

    report: BenchmarkReport
    plots: dict[str, Plot]


def _figures(config: BenchmarkConfig) -> dict[str, Callable[[BenchmarkReport], Figure]]:
    return {
        layout.BENCH_PLOT_THROUGHPUT: report.plot_throughput,
        layout.BENCH_PLOT_LATENCY: report.plot_latency,
        layout.BENCH_PLOT_ACCEPTANCE: report.plot_acceptance,
        layout.BENCH_PLOT_PER_GPU: report.plot_per_gpu,
        layout.BENCH_PLOT_BY_CATEGORY: report.plot_acceptance_by_category,
        layout.BENCH_PLOT_LENGTHS: lambda bench: report.plot_lengths(bench, config.max_tokens),
    }


async def run(config: BenchmarkConfig) -> BenchmarkResult:
    """Benchmark the fleet as ``config`` says and write the whole run folder, ``config.out_dir``."""
    out = open_run(config.out_dir, config.public_dict())
    measured = await run_benchmark(config)
    record_parameters(out, measured.config.public_dict())  # with the model the servers named, if left ""
    bench = report.build_report(measured)
    report.save_report(bench, out)
    plots = {name: save(draw(bench), out, name) for name, draw in _figures(config).items()}
    finish_run(out)
    return BenchmarkResult(bench, plots)
