"""``draftgen tune -f params/tune.yaml [-p KEY VALUE ...]``: measure the candidates, write the chosen settings.

The same run as ``draftgen run tune`` (the notebook) without a kernel, through the same runner and the same function
(``draftgen.runner.run_here`` → ``draftgen.tune.step.run``): the same parameters taken and checked first (a
candidate SGLang would refuse stops everything before a server starts), the same run folder
(``outputs/tune/<name>/``, its parameters.yaml and ``.complete``; a finished one is never overwritten); progress is
printed per job, then whether every candidate started (grouped checks, as the notebook shows them), and the table,
plots, tune.json and the settings file are in the run folder.
"""

from __future__ import annotations

import argparse

from draftgen.cli import CommandError
from draftgen.exit_codes import ExitCode, Refused
from draftgen.params import build_config
from draftgen.rundir import RunFolderError
from draftgen.runner import (
    add_parameter_options,
    add_run_folder_options,
    cli_parameters,
    plan_run,
    run_here,
    run_label,
    taken_parameters,
)
from draftgen.sglang_rules.speculation import AUTO_NUMBERS
from draftgen.steps import get_step
from draftgen.tune import report, verdict_report

STEP = "tune"


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="find the SGLang settings with the most tok/s per GPU: one candidate per GPU group at once",
        description="Start each candidate (MTP off, steps/topk/draft tokens, max running requests) on a GPU group "
        "with serve's launcher, measure it with the benchmark on a sample of your prompts, keep the best half each "
        "round, and write the winner to a settings file for draftgen serve --settings. Details: docs/tune.md.",
    )
    add_parameter_options(parser)
    add_run_folder_options(parser, "continue an unfinished run folder (tune starts over in it)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    step = get_step(STEP)
    config_class = step.config_class()
    values = taken_parameters(config_class.model_fields, cli_parameters(args), command="tune", step=step.name)
    build_config(config_class, values)  # every problem at once, before a folder is made
    plan = plan_run(
        None,
        values,
        step=step,
        name=args.name,
        out_root=args.out_root,
        resume=args.resume,
        label=run_label(args),
    )
    print(f"draftgen tune: → {plan.run_dir}", flush=True)
    try:
        tuned = run_here(plan)
    except Refused:  # a check before any work (a port busy, SGLang missing), or another process writes there
        raise
    except RunFolderError as exc:  # the folder cannot be made
        raise CommandError(str(exc)) from None
    print(report.startup_view(tuned.run))
    if tuned.verdict is not None:
        print(verdict_report.format_table(tuned.verdict))
        print(verdict_report.headline(tuned.verdict))
    if tuned.table is None:  # race off: the verdict alone, where a tie is an answer too
        return ExitCode.OK if tuned.answered else ExitCode.FAILED
    print(report.format_table(tuned.table))
    if not tuned.answered:
        print("draftgen tune: no candidate could be measured; see the failures above")
        return ExitCode.FAILED
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
    settings = tuned.run.config.settings_path
    print(f"draftgen tune: settings written to {settings}; launch: draftgen serve --settings {settings} ...")
    return ExitCode.OK
