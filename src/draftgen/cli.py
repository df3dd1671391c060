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
    "draftgen.commands.tokenizer",
    "draftgen.commands.status",
)


class CommandError(Exception):
    """A user mistake: printed as one line, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftgen",
        description="Regenerate drafter training data on a fleet of SGLang servers (or the simulated fleet).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_command(subparsers)
    return parser


def _version() -> str:
    from draftgen import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
