"""``draftgen tune -f params/tune.yaml [-p KEY VALUE ...]``: measure the candidates, write the chosen settings.

The same run as ``draftgen run tune`` (the notebook) without a kernel, through the same function
(``draftgen.tune.pipeline.run_and_report``): parameters are validated first (a candidate SGLang would refuse stops
everything before a server starts), progress is printed per job, then whether every candidate started (grouped
checks, as the notebook shows them), and the table, plots, tune.json and the settings file go to the run folder.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from draftgen.cli import CommandError
from draftgen.params import SHARED_PARAMETERS, build_config
from draftgen.rundir import RunFolderError, RunFolderLease
from draftgen.runner import add_parameter_options, cli_parameters
from draftgen.sglang_rules.speculation import AUTO_NUMBERS
from draftgen.tune import report, verdict_report
from draftgen.tune.config import TuneConfig
from draftgen.tune.pipeline import run_and_report


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="find the SGLang settings with the most tok/s per GPU: one candidate per GPU group at once",
        description="Start each candidate (MTP off, steps/topk/draft tokens, max running requests) on a GPU group "
        "with serve's launcher, measure it with the benchmark on a sample of your prompts, keep the best half each "
        "round, and write the winner to a settings file for draftgen serve --settings. Details: docs/tune.md.",
    )
    add_parameter_options(parser)
    parser.add_argument(
        "--out", type=Path, default=None, help="run folder (default outputs/tune/<timestamp>)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    values = cli_parameters(args)
    values = {k: v for k, v in values.items() if k in TuneConfig.model_fields or k not in SHARED_PARAMETERS}
    values["out_dir"] = str(
        args.out or values.get("out_dir") or Path("outputs/tune") / time.strftime("%Y%m%d-%H%M%S")
    )
    config = build_config(TuneConfig, values)
    try:  # the run folder opened as draftgen run opens it: what interrupted writes left there is cleared
        RunFolderLease.acquire(config.out_dir, advice="choose another --out").release()
    except RunFolderError as exc:
        raise CommandError(str(exc)) from None
    tuned = asyncio.run(run_and_report(config))
    print(report.startup_view(tuned.run))
    if tuned.verdict is not None:
        print(verdict_report.format_table(tuned.verdict))
        print(verdict_report.headline(tuned.verdict))
    if tuned.table is None:  # race off: the verdict alone, where a tie is an answer too
        return 0 if tuned.answered else 1
    print(report.format_table(tuned.table))
    if not tuned.answered:
        print("draftgen tune: no candidate could be measured; see the failures above")
        return 1
    info = tuned.info
    print(
        f"draftgen tune: chosen {info['chosen_label']} at concurrency {info['concurrency']}: "
        f"{info['tok_s_per_gpu']:,.0f} tok/s per GPU"
        + (
            f" ({info['gain_vs_baseline']:+.1%} vs the seeds' {AUTO_NUMBERS})"
            if info["gain_vs_baseline"] is not None
            else ""
        )
        + (f"; within the noise of {', '.join(info['ties_with'])}" if info["ties_with"] else "")
    )
    print(
        f"draftgen tune: settings written to {config.settings_path}; launch: draftgen serve --settings {config.settings_path} ..."
    )
    return 0
