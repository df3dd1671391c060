"""``draftgen prompts``: write the project's synthetic prompt set."""

from __future__ import annotations

import argparse
from pathlib import Path

from draftgen.prompts.synthetic import write_synthetic


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prompts",
        help="write a synthetic prompt set (math, code, chat, multi-turn, system prompts)",
        description="Write N synthetic prompt rows ({id, messages}) as JSONL, reproducible from --seed.",
    )
    parser.add_argument("--n", type=int, required=True, help="number of rows")
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl path")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise ValueError("--n must be >= 1")
    if args.out.suffix != ".jsonl":
        raise ValueError(f"--out must end in .jsonl, got {args.out}")
    count = write_synthetic(args.out, args.n, args.seed)
    print(f"wrote {count} prompts to {args.out}")
    return 0
