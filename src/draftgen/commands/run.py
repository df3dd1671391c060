"""``draftgen run NOTEBOOK -f params/X.yaml [-p KEY VALUE ...]``: a papermill run in its own folder."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from draftgen.display.humanize import human_bytes
from draftgen.paths import resolve_path
from draftgen.rundir import free_bytes, is_disk_full
from draftgen.runner import (
    add_parameter_options,
    applicable_parameters,
    check_parameters,
    cli_parameters,
    execute,
    plan_run,
    resolve_notebook,
)


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="execute a notebook (generate, benchmark, estimate, validate) into outputs/<notebook>/<run>/",
        description="Execute a parameterized notebook with papermill. Parameters are validated before the kernel "
        "starts. Writes the executed notebook, report.html and parameters.yaml under outputs/<notebook>/<run>/.",
    )
    parser.add_argument(
        "notebook", help="notebook name (generate, benchmark, estimate, validate) or .ipynb path"
    )
    add_parameter_options(parser)
    parser.add_argument("--name", help="run folder name (default: <params-file>-<timestamp>)")
    parser.add_argument(
        "--out-root",
        type=Path,
        default=Path("outputs"),
        help="root of run folders (default outputs; relative: under the project root, docs/design.md#paths)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an unfinished run folder: generate skips stored prompts, benchmark reuses finished levels",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML report")
    parser.add_argument("-k", "--kernel", default="python3", help="Jupyter kernel (default python3)")
    parser.set_defaults(handler=run)


def _record_disk_full(out_dir: Path, executed: Path, exc: Exception) -> None:
    """Papermill could not save the executed notebook and stopped the kernel before generate could record the
    full disk: record it (manifest 'disk full', progress.json) from here."""
    from draftgen.generate.store import record_disk_full
    from draftgen.watch.progress_file import set_state

    detail = f"{type(exc).__name__}: {exc}"
    if record_disk_full(out_dir, executed, detail):
        with contextlib.suppress(OSError, ValueError):
            set_state(out_dir, "interrupted", f"disk full: {executed}")


def _disk_full_line(step: str, run_dir: Path, exc: Exception) -> str:
    """One line for a run stopped by a full disk (the kernel's own message when it got to say it)."""
    lines = str(exc).strip().splitlines()
    said = getattr(exc, "evalue", None) or (lines[-1] if lines else type(exc).__name__)
    return (
        f"draftgen run: {step} stopped: disk full on the filesystem holding {run_dir} "
        f"({human_bytes(free_bytes(run_dir))} free) — {said[:400]} — finished work is kept (generate: whole shards, "
        "manifest.json 'disk full'); free space and rerun the same command with --resume"
    )


def run(args: argparse.Namespace) -> int:
    notebook = resolve_notebook(args.notebook)
    parameters = cli_parameters(args)
    parameters, ignored = applicable_parameters(notebook, parameters)
    if ignored:
        print(f"draftgen run: {notebook.stem} does not use shared parameter(s) {', '.join(ignored)}: ignored")
    check_parameters(notebook, parameters)
    label = "-".join(p.stem for p in args.parameters_file) or "run"
    plan = plan_run(
        notebook,
        parameters,
        name=args.name,
        out_root=resolve_path(args.out_root),
        resume=args.resume,
        label=label,
    )
    print(f"draftgen run: {notebook} → {plan.run_dir}", flush=True)
    try:
        execute(plan, kernel=args.kernel, html=not args.no_html)
    except Exception as exc:  # papermill's PapermillExecutionError carries the cell's error
        if is_disk_full(exc):
            if notebook.stem == "generate":
                _record_disk_full(
                    Path(plan.parameters.get("out_dir") or plan.run_dir), plan.executed_path, exc
                )
            print(_disk_full_line(notebook.stem, plan.run_dir, exc), file=sys.stderr)
            return 1
        name = type(exc).__name__
        summary = getattr(exc, "evalue", None) or str(exc).strip().splitlines()[-1:] or [name]
        if isinstance(summary, list):
            summary = summary[0]
        print(
            f"draftgen run: {notebook.stem} failed: {getattr(exc, 'ename', name)}: {summary}", file=sys.stderr
        )
        print(f"draftgen run: executed notebook kept at {plan.executed_path}", file=sys.stderr)
        return 1
    print(f"draftgen run: done. notebook {plan.executed_path}  report {plan.html_path}")
    return 0
