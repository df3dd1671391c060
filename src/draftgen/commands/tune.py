"""``draftgen tune -f params/tune.yaml [-p KEY VALUE ...]``: measure the candidates, write the chosen settings.

The same run as ``draftgen run tune`` (the notebook) without a kernel: parameters are validated first (a candidate
SGLang would refuse stops everything before a server starts), progress is printed per job, and the table, plots,
tune.json and the settings file go to the run folder.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from draftgen.params import SHARED_PARAMETERS, build_config
from draftgen.runner import add_parameter_options, cli_parameters
from draftgen.tune import report, verdict_report
from draftgen.tune.config import TuneConfig
from draftgen.tune.run import run_tune


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

    def save_race(race) -> None:  # type: ignore[no-untyped-def]
        report.save_report(race)  # before the verdict: an interrupted verdict loses none of the race
        if race.chosen is not None:
            print(
                f"draftgen tune: race saved, {race.chosen.label} written to {config.settings_path}; the verdict next"
            )

    result = asyncio.run(run_tune(config, on_race=save_race))
    info = report.save_report(result)
    verdict = report.verdict_of(result)
    if verdict is not None:
        for value, name in (
            ("tok_s_per_gpu", "verdict_tok_s_per_gpu"),
            ("accept_length", "verdict_acceptance"),
        ):
            report.save_figure(verdict_report.plot_verdict(verdict, value), config.out_dir, name)
        print(verdict_report.format_table(verdict))
        print(verdict_report.headline(verdict))
    if not config.race:
        return 0 if verdict is not None and verdict.ranking.best is not None else 1  # a tie is an answer
    table = report.candidate_table(result)
    report.save_figure(report.plot_throughput(table, config.interval), config.out_dir, "tok_s_per_gpu")
    report.save_figure(report.plot_acceptance(table, config.interval), config.out_dir, "acceptance")
    print(report.format_table(table))
    if result.chosen is None:
        print("draftgen tune: no candidate could be measured; see the failures above")
        return 1
    print(
        f"draftgen tune: chosen {info['chosen_label']} at concurrency {info['concurrency']}: "
        f"{info['tok_s_per_gpu']:,.0f} tok/s per GPU"
        + (
            f" ({info['gain_vs_baseline']:+.1%} vs the seeds' 3/1/4)"
            if info["gain_vs_baseline"] is not None
            else ""
        )
        + (f"; within the noise of {', '.join(info['ties_with'])}" if info["ties_with"] else "")
    )
    print(
        f"draftgen tune: settings written to {config.settings_path}; launch: draftgen serve --settings {config.settings_path} ..."
    )
    return 0
