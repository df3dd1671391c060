"""The ``draftgen`` command line: one module per subcommand under draftgen.commands.

Every command exits with a code of one table, by cause (``draftgen.exit_codes``), and prints a mistake as one line;
``--debug`` (or ``DRAFTGEN_DEBUG=1``) adds the traceback behind it. Every relative path a command is given is
relative to the project root, as in the notebooks (``draftgen.paths``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from draftgen.exit_codes import ExitCode, Refused, help_table

# Each module defines add_command(subparsers) and sets ``handler`` on its parser (a function of args → exit code).
COMMAND_MODULES = (
    "draftgen.commands.sim",
    "draftgen.commands.prompts",
    "draftgen.commands.demo",
    "draftgen.commands.serve",
    "draftgen.commands.run",
    "draftgen.commands.smoke",
    "draftgen.commands.tune",
    "draftgen.commands.loop",
    "draftgen.commands.tokenizer",
    "draftgen.commands.status",
)
DEBUG_ENV = "DRAFTGEN_DEBUG"
DEBUG_HELP = f"show the traceback behind an error's one line (also {DEBUG_ENV}=1)"


class CommandError(Exception):
    """A user mistake: printed as one line, no traceback (exit code USAGE)."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given ``argv`` naming a command, only that command's module is imported (``draftgen status``
    answers in a fraction of a second instead of paying for the HTTP client, pydantic and papermill first)."""
    parser = argparse.ArgumentParser(
        prog="draftgen",
        description="Regenerate drafter training data on a fleet of SGLang servers (or the simulated fleet).",
        epilog=help_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    first = next((arg for arg in argv or () if not arg.startswith("-")), None)
    chosen = [name for name in COMMAND_MODULES if name.rsplit(".", 1)[1] == first]
    for name in chosen or COMMAND_MODULES:
        importlib.import_module(name).add_command(subparsers)
    for command in subparsers.choices.values():
        _add_debug(command)
    return parser


def _add_debug(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after the command too (and after a subcommand's own, as in ``prompts audit``)."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for inner in action.choices.values():
                _add_debug(inner)


def _version() -> str:
    from draftgen import __version__

    return __version__


def debug_wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _error(args: argparse.Namespace, exc: BaseException, code: ExitCode) -> int:
    if args.debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"draftgen {args.command}: error: {exc}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.debug = debug_wanted(args)
    try:
        return int(args.handler(args) or 0)
    except Refused as exc:
        return _error(args, exc, ExitCode.REFUSED)
    except (CommandError, ValueError, FileNotFoundError) as exc:
        return _error(args, exc, ExitCode.USAGE)
    except KeyboardInterrupt as exc:
        if args.debug:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"draftgen {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
