"""``draftgen prompts``: write the project's synthetic prompt set, in one of its shapes."""

from __future__ import annotations

import argparse
from pathlib import Path

SHAPES = ("mixed", "long-chat")


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prompts",
        help="write a synthetic prompt set (math, code, chat, multi-turn, system prompts; or long chats)",
        description="Write N synthetic prompt rows as JSONL, reproducible from --seed. --shape mixed (the default, "
        "the bundled set's): {id, category, messages} math, code, chat, multi-turn, system-prompted and long rows. "
        "--shape long-chat: conversations of up to 15 user turns with pasted documents, code and logs, source "
        "assistant turns (ShareGPT and messages rows), exact duplicates, shared first turns, 'continue' openers "
        "and the extra fields real sets carry.",
    )
    parser.add_argument("--n", type=int, required=True, help="number of rows")
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl path")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--shape", choices=SHAPES, default="mixed", help="mixed (default, the bundled set's) or long-chat"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from draftgen.prompts.long_chat import long_chat_rows
    from draftgen.prompts.synthetic import synthetic_rows, write_rows

    if args.n < 1:
        raise ValueError("--n must be >= 1")
    if args.out.suffix != ".jsonl":
        raise ValueError(f"--out must end in .jsonl, got {args.out}")
    rows = long_chat_rows if args.shape == "long-chat" else synthetic_rows
    count = write_rows(args.out, rows(args.n, args.seed))
    print(f"wrote {count} prompts to {args.out}")
    return 0
