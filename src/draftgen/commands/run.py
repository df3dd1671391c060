"""``draftgen run NOTEBOOK -f params/X.yaml [-p KEY VALUE ...]``: a papermill run in its own folder.

What each notebook's step takes, writes and does on ``--resume`` comes from ``draftgen.steps``. Exit codes
(``draftgen.exit_codes``): 0 done; 1 the notebook raised (a gate failed, the guard halted, a full disk); 2 bad
parameters or a taken name; 3 a check before any work refused (preflight), which leaves the name free.
"""

from __future__ import annotations

import argparse
import re
import sys

from draftgen.cli import CommandError
from draftgen.display.humanize import human_bytes
from draftgen.exit_codes import ExitCode, Refused
from draftgen.rundir import DiskFull, RunFolderError, free_bytes, is_disk_full
from draftgen.runner import (
    RunPlan,
    add_parameter_options,
    add_run_folder_options,
    check_parameters,
    cli_parameters,
    declared_parameters,
    execute,
    headline,
    is_refusal,
    plan_run,
    resolve_notebook,
    run_label,
    taken_parameters,
)
from draftgen.steps import STEPS


def add_command(subparsers: argparse._SubParsersAction) -> None:
    names = ", ".join(step.name for step in STEPS)
    parser = subparsers.add_parser(
        "run",
        help=f"execute a notebook ({names}) into outputs/<notebook>/<run>/",
        description="Execute a parameterized notebook with papermill. Parameters are validated before the kernel "
        "starts. Writes the executed notebook, report.html and parameters.yaml under outputs/<notebook>/<run>/.",
        epilog="What each step writes there: " + "; ".join(f"{step.name}: {step.writes}" for step in STEPS),
    )
    parser.add_argument("notebook", help=f"notebook name ({names}) or .ipynb path")
    add_parameter_options(parser)
    add_run_folder_options(
        parser,
        "continue an unfinished run folder: "
        + ", ".join(f"{step.name} {step.resume}" for step in STEPS if step.resume)
        + "; the others start over in it",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML report")
    parser.add_argument("-k", "--kernel", default="python3", help="Jupyter kernel (default python3)")
    parser.set_defaults(handler=run)


def _record_disk_full(plan: RunPlan, exc: Exception) -> None:
    """Papermill could not save the executed notebook and stopped the kernel before the step could record the
    full disk: its step's recorder (if it has one) records it from here."""
    step = plan.step
    recorder = step.disk_full_recorder() if step is not None else None
    if step is not None and recorder is not None:
        folder = step.output_folder(plan.parameters, plan.run_dir)
        said = (
            exc.reason if isinstance(exc, DiskFull) else exc
        )  # DiskFull's own text names the notebook again
        recorder(folder, plan.executed_path, f"{type(exc).__name__}: {said}")


def _disk_full_line(plan: RunPlan, exc: Exception) -> str:
    """One line for a run stopped by a full disk (the kernel's own message when it got to say it)."""
    lines = str(exc).strip().splitlines()
    said = getattr(exc, "evalue", None) or (lines[-1] if lines else type(exc).__name__)
    kept = plan.step.kept_on_disk_full if plan.step is not None else "finished work is kept"
    return (
        f"draftgen run: {plan.notebook.stem} stopped: disk full on the filesystem holding {plan.run_dir} "
        f"({human_bytes(free_bytes(plan.run_dir))} free) — {said[:400]} — {kept}; free space and rerun the same "
        "command with --resume"
    )


def run(args: argparse.Namespace) -> int:
    notebook = resolve_notebook(args.notebook)
    parameters = cli_parameters(args)
    parameters = taken_parameters(
        declared_parameters(notebook), parameters, command="run", step=notebook.stem
    )
    check_parameters(notebook, parameters)
    plan = plan_run(
        notebook,
        parameters,
        name=args.name,
        out_root=args.out_root,
        resume=args.resume,
        label=run_label(args),
    )
    print(f"draftgen run: {notebook} → {plan.run_dir}", flush=True)
    try:
        execute(plan, kernel=args.kernel, html=not args.no_html)
    except Refused:  # another process writes there: nothing ran
        raise
    except RunFolderError as exc:  # the folder cannot be made: nothing ran
        raise CommandError(str(exc)) from None
    except Exception as exc:  # papermill's PapermillExecutionError carries the cell's error
        if args.debug:  # the kernel's traceback (IPython's colours, unless on a terminal)
            said = "\n".join(getattr(exc, "traceback", None) or [repr(exc)])
            print(said if sys.stderr.isatty() else re.sub(r"\x1b\[[0-9;]*m", "", said), file=sys.stderr)
        if is_disk_full(exc):
            _record_disk_full(plan, exc)
            print(_disk_full_line(plan, exc), file=sys.stderr)
            return ExitCode.FAILED
        name = type(exc).__name__
        summary = getattr(exc, "evalue", None) or str(exc).strip().splitlines()[-1:] or [name]
        if isinstance(summary, list):
            summary = summary[0]
        block = headline(plan)
        if block:  # a gate that failed (validate) has said why in its headline before raising
            print("\n" + block + "\n", file=sys.stderr)
        if is_refusal(plan, exc):
            print(f"draftgen run: {notebook.stem} refused before any work: {summary}", file=sys.stderr)
            print(
                f"draftgen run: nothing was sent; the executed notebook is at {plan.executed_path}, and "
                f"--name {plan.name} is free: fix what it says and run the same command again",
                file=sys.stderr,
            )
            return ExitCode.REFUSED
        print(
            f"draftgen run: {notebook.stem} failed: {getattr(exc, 'ename', name)}: {summary}", file=sys.stderr
        )
        print(f"draftgen run: executed notebook kept at {plan.executed_path}", file=sys.stderr)
        return ExitCode.FAILED
    block = headline(plan)
    if block:
        print("\n" + block + "\n")
    print(f"draftgen run: done. notebook {plan.executed_path}  report {plan.html_path}")
    return ExitCode.OK
