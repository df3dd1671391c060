"""The ``draftgen`` command line: one module per subcommand under draftgen.commands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module defines add_command(subparsers) and sets ``handler`` on its parser (a function of args → exit code).
COMMAND_MODULES = (
    "draftgen.commands.sim",
    "draftgen.commands.prompts",
    "draftgen.commands.demo",
    "draftgen.commands.serve",
    "draftgen.commands.run",
    "draftgen.commands.tune",
    "draftgen.commands.loop",
    "draftgen.commands.tokenizer",
    "draftgen.commands.status",
)


class CommandError(Exception):
    """A user mistake: printed as one line, no traceback."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given ``argv`` naming a command, only that command's module is imported (``draftgen status``
    answers in a fraction of a second instead of paying for the HTTP client, pydantic and papermill first)."""
    parser = argparse.ArgumentParser(
        prog="draftgen",
        description="Regenerate drafter training data on a fleet of SGLang servers (or the simulated fleet).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    first = next((arg for arg in argv or () if not arg.startswith("-")), None)
    chosen = [name for name in COMMAND_MODULES if name.rsplit(".", 1)[1] == first]
    for name in chosen or COMMAND_MODULES:
        importlib.import_module(name).add_command(subparsers)
    return parser


def _version() -> str:
    from draftgen import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (CommandError, ValueError, FileNotFoundError) as exc:
        print(f"draftgen {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"draftgen {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
