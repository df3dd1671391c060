"""``draftgen status RUN_DIR``: how a generate run is doing, from its progress.json (read-only)."""

from __future__ import annotations

import argparse
import json

from draftgen.paths import resolve_path


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="how a generate run is doing: counts, rates, ETA, servers, last events; is it still alive?",
        description="Print a generate run folder's progress.json as a table and say whether the run is running, "
        "finished, stopped, or gone (stale heartbeat / dead pid). Exit code: 0 finished, 4 still running, 1 stopped "
        "early (interrupted, halted, failed) or gone (killed or crashed), 5 alive but not responding, 2 not a run "
        "folder. `draftgen status RUN && next` goes on only after a finished run; "
        "`while draftgen status RUN >/dev/null; [ $? -eq 4 ]; do sleep 600; done` waits while it runs.",
    )
    parser.add_argument(
        "run_dir",
        type=resolve_path,
        help="the generate run folder (e.g. outputs/generate/RUN; relative: under the project root)",
    )
    parser.add_argument("--json", action="store_true", help="print progress.json with the verdict added")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from draftgen.watch.progress_file import read_progress
    from draftgen.watch.status import run_status

    verdict, table = run_status(args.run_dir)
    if args.json:
        data = read_progress(args.run_dir) or {}
        data["verdict"] = {"code": verdict.code, "word": verdict.word, "sentence": verdict.sentence}
        print(json.dumps(data, indent=1))
    else:
        print(table)
    return verdict.code
