"""``draftgen loop -p export_dir DIR -p prompts FILE -p target MODEL [...]``: does the export train a better drafter?

The closed loop on a pilot slice (docs/loop.md): SpecForge 0.2.0's trainer trains the same DFlash drafter on the
export's rows and on the same prompts with their source answers, each per seed, and both are evaluated on the
held-out answers of the target (validate's export/holdout/eval.jsonl). It runs where SpecForge and the target
model are installed (``specforge`` on PATH, or ``-p specforge PATH``); its run folder is ``outputs/loop/<name>/``
unless ``-p out_dir`` says otherwise. Prints the table and the verdict.
"""

from __future__ import annotations

import argparse
import time

from draftgen.cli import CommandError
from draftgen.exit_codes import ExitCode
from draftgen.params import ParameterError, build_config
from draftgen.paths import resolve_path
from draftgen.rundir import RunFolderError
from draftgen.runner import add_parameter_options, cli_parameters

STEP = "loop"


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "loop",
        help="train the same drafter on the export and on the source answers, and compare them on held-out answers",
        description="SpecForge 0.2.0 trains a DFlash drafter (offline features of the target) on (a) validate's "
        "export and (b) the same prompts with the prompt file's own answers, per seed; both are evaluated on (c) the "
        "target's held-out answers (export/holdout/eval.jsonl): accuracy per draft position and the simulated "
        "acceptance length, beside a most-frequent-token baseline. Details: docs/loop.md.",
    )
    add_parameter_options(parser)
    parser.add_argument("--name", help="the run folder's name under outputs/loop/ (default: a timestamp)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from draftgen.loop.config import LoopConfig
    from draftgen.loop.step import run as run_loop

    values = cli_parameters(args)
    values.setdefault(
        "out_dir", str(resolve_path(f"outputs/{STEP}/{args.name or time.strftime('%Y%m%d-%H%M%S')}"))
    )
    try:
        config = build_config(LoopConfig, values)
    except ParameterError as exc:
        raise CommandError(str(exc)) from None
    print(f"draftgen loop: → {config.out_dir}", flush=True)
    try:
        result = run_loop(config)
    except RunFolderError as exc:
        raise CommandError(str(exc)) from None
    print(result.table())
    print(f"draftgen loop: {result.verdict}")
    if not result.export_shown_better:
        print(
            "draftgen loop: the export has not shown, on every seed, a better drafter than the source answers and the "
            "baseline: read the table before starting the long run (more pilot rows or epochs narrow the seeds' range)"
        )
        return ExitCode.FAILED
    return ExitCode.OK
