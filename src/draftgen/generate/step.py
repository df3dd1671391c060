"""The generate step, whole: generate.ipynb (and any other face) calls ``run`` and then only shows its result.

``run`` opens the run folder (``draftgen.rundir.run_folder``), runs preflight (shown before anything is sent; it
fills in what the config leaves to the servers, recorded in parameters.yaml) and one session, saves every plot
under ``out_dir/plots/`` and marks the folder finished once every prompt is stored, so a notebook run by papermill
or top to bottom in JupyterLab leaves the same folder (docs/design.md, "What each step writes"). A session that stops early (interrupted, halted, a full disk) raises; one that ends with prompts in
failed.parquet returns: both leave the folder unfinished, for a resume that retries what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from draftgen.display.notes import Notes
from draftgen.display.plots import Plot
from draftgen.generate import report
from draftgen.generate.config import GenerateConfig
from draftgen.generate.preflight import Plan, preflight
from draftgen.generate.run import RunResult, generate
from draftgen.rundir import finish_run, layout, open_run
from draftgen.rundir.run_folder import record_parameters

COMPLETE = "complete"  # RunResult.status when every prompt is stored


@dataclass(frozen=True)
class GenerateResult:
    """A finished session: what preflight found, how the session ended, the plots as saved (by layout name)."""

    plan: Plan
    result: RunResult
    plots: dict[str, Plot]


def _plots(config: GenerateConfig) -> dict[str, Callable[[], Plot]]:
    """Each plot of the run folder, drawn and saved under ``out_dir/plots/`` by generate's report."""
    out = config.out_dir
    return {
        layout.GENERATE_PLOT_THROUGHPUT: lambda: report.plot_throughput(out),
        layout.GENERATE_PLOT_ACCEPTANCE: lambda: report.plot_acceptance(out),
        layout.GENERATE_PLOT_FINISH_REASONS: lambda: report.plot_finish_reasons(out),
        layout.GENERATE_PLOT_LENGTHS: lambda: report.plot_completion_lengths(out, config.max_tokens),
        layout.GENERATE_PLOT_BY_CATEGORY: lambda: report.plot_acceptance_by_category(out),
        layout.GENERATE_PLOT_BY_LENGTH: lambda: report.plot_acceptance_by_length(out),
        layout.GENERATE_PLOT_BY_POSITION: lambda: report.plot_acceptance_by_position(out),
    }


async def run(config: GenerateConfig, show: Callable[[object], None] = print) -> GenerateResult:
    """Generate as ``config`` says and write the whole run folder; ``show`` is given preflight's table before the
    first request, and the session's outcome (a notebook passes ``display``)."""
    out = open_run(config.out_dir, config.public_dict())
    plan = await preflight(config)
    show(plan)
    config = plan.config  # what the config left to the servers (model, tokenizer), filled in
    record_parameters(out, config.public_dict())
    result = await generate(config, plan)
    show(Notes((str(result),), title="the session"))
    plots = {name: draw() for name, draw in _plots(config).items()}
    if result.status == COMPLETE:  # with failures: not finished, a resume retries them
        finish_run(out)
    return GenerateResult(plan, result, plots)
