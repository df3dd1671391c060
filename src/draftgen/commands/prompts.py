"""``draftgen prompts``: write the project's synthetic prompt set, in one of its shapes; ``draftgen prompts audit
FILE``: describe a prompt file before anything is spent on it (no servers)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftgen.exit_codes import ExitCode
from draftgen.paths import resolve_path

SHAPES = ("mixed", "long-chat", "single-turn")


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prompts",
        help="write a synthetic prompt set, or audit a prompt file (draftgen prompts audit FILE)",
        description="Write N synthetic prompt rows as JSONL, reproducible from --seed. --shape mixed (the default, "
        "the bundled set's): {id, category, messages} math, code, chat, multi-turn, system-prompted and long rows. "
        "--shape long-chat: conversations of up to 15 user turns with pasted documents, code and logs, source "
        "assistant turns (ShareGPT and messages rows), exact duplicates, shared first turns, 'continue' openers "
        "and the extra fields real sets carry. --shape single-turn: the mixed shape's one-question kinds only (math, "
        "code, chat, system-prompted, long). `draftgen prompts audit FILE` describes a prompt file instead.",
    )
    parser.add_argument("--n", type=int, help="number of rows (required to write)")
    parser.add_argument("--out", type=resolve_path, help="output .jsonl path (required to write)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="mixed",
        help="mixed (default, the bundled set's), long-chat or single-turn",
    )
    parser.set_defaults(handler=run)
    actions = parser.add_subparsers(dest="action", metavar="audit")
    _add_audit(actions)


def _add_audit(actions: argparse._SubParsersAction) -> None:
    from draftgen import params
    from draftgen.prompts.audit import AuditSettings

    def declared(
        name: str, declaration: object
    ) -> dict:  # generate's default and help: judged as generate will
        default, help = params.declared(declaration)
        return {"default": default, "help": f"{help} (generate's {name}; default {default})"}

    audit = actions.add_parser(
        "audit",
        help="describe a prompt file before spending: duplicates, shared first turns, openers, near-duplicates, "
        "turns, categories, prompt tokens against max_length",
        description="Read a prompt file once (streamed, no servers) and say what generate will make of it: rows "
        "read, malformed rows by reason, exact duplicate conversations (skipped unless --keep-duplicates), shared "
        "first turns, context-free 'continue' openers, near-duplicates (MinHash LSH), answer points per "
        "conversation, the category or source mix and, with --tokenizer, each answer point's prompt tokens "
        "against --max-length (set aside, below the floor, capped, full budget). Exit 0 when nothing needs "
        "fixing before spending, 1 when something does, 2 on bad input.",
    )
    audit.add_argument("file", help='prompt file (.jsonl/.parquet), or "synthetic" for the bundled set')
    audit.add_argument(
        "--tokenizer", default="", help="the target model's folder: count each answer point's prompt with it"
    )
    audit.add_argument("--max-length", type=int, **declared("train_max_length", params.TrainMaxLength))
    audit.add_argument("--min-turn-budget", type=int, **declared("min_turn_budget", params.MinTurnBudget))
    audit.add_argument("--max-tokens", type=int, **declared("max_tokens", params.MaxTokens))
    audit.add_argument("--no-thinking", action="store_true", help="render prompts with enable_thinking false")
    audit.add_argument("--turns", choices=("all", "last"), **declared("turns", params.Turns))
    audit.add_argument("--category-field", **declared("category_field", params.CategoryField))
    audit.add_argument(
        "--keep-duplicates", action="store_true", help=declared("", params.KeepDuplicates)["help"]
    )
    audit.add_argument(
        "--max-rejected-rate",
        type=float,
        default=None,
        help="malformed rows above this share make generate refuse the file (default: generate's max_rejected_rate)",
    )
    audit.add_argument(
        "--sample",
        type=int,
        default=AuditSettings.token_sample,
        help=f"conversations whose prompt tokens are counted, a uniform sample (0: all; default {AuditSettings.token_sample})",
    )
    audit.add_argument(
        "--near-limit",
        type=int,
        default=0,
        help="index the first N conversations for near-duplicates (0: all)",
    )
    audit.add_argument("--json", action="store_true", help="print the audit as JSON instead of tables")
    audit.set_defaults(handler=run_audit)


def run(args: argparse.Namespace) -> int:
    from draftgen.prompts.long_chat import long_chat_rows
    from draftgen.prompts.synthetic import CATEGORIES, SINGLE_TURN, synthetic_rows, write_rows

    if args.n is None or args.out is None:
        raise ValueError("give --n N and --out FILE.jsonl to write prompts, or `audit FILE` to audit a file")
    if args.n < 1:
        raise ValueError("--n must be >= 1")
    if args.out.suffix != ".jsonl":
        raise ValueError(f"--out must end in .jsonl, got {args.out}")
    if args.shape == "long-chat":
        rows = long_chat_rows(args.n, args.seed)
    else:
        rows = synthetic_rows(args.n, args.seed, SINGLE_TURN if args.shape == "single-turn" else CATEGORIES)
    count = write_rows(args.out, rows)
    print(f"wrote {count} prompts to {args.out}")
    return ExitCode.OK


def run_audit(args: argparse.Namespace) -> int:
    from draftgen.generate.config import GenerateConfig
    from draftgen.prompts.audit import AuditSettings, audit_prompts
    from draftgen.prompts.audit_report import AuditReport, findings
    from draftgen.prompts.rows import PromptFileError, check_prompt_source

    for flag in ("max_length", "min_turn_budget", "max_tokens", "sample", "near_limit"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if args.max_rejected_rate is None:
        args.max_rejected_rate = GenerateConfig.model_fields["max_rejected_rate"].default
    path = Path(check_prompt_source(args.file))
    cap = _length_cap(args) if args.tokenizer else None
    settings = AuditSettings(
        path=path,
        category_field=args.category_field or None,
        keep_duplicates=args.keep_duplicates,
        turns=args.turns,
        near_limit=args.near_limit,
        token_sample=args.sample,
        cap=cap,
        max_tokens=args.max_tokens,
        enable_thinking=not args.no_thinking,
        progress=not args.json,
    )
    try:
        audit = audit_prompts(settings)
    except PromptFileError as exc:
        raise ValueError(str(exc)) from None
    if args.json:
        json.dump(audit.as_dict(), sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        print(AuditReport(audit, args.max_rejected_rate))
    warned = any(f.status == "warn" for f in findings(audit, args.max_rejected_rate))
    return ExitCode.FAILED if warned else ExitCode.OK


def _length_cap(args: argparse.Namespace):
    """generate's own length cap, from the tokenizer folder (the same rule generate sends each turn by)."""
    from draftgen.generate.length_cap import LengthCap, tokenizer_counter

    if not args.max_length:
        raise ValueError("--tokenizer needs --max-length > 0 (the trainer's max_length to count against)")
    folder = str(resolve_path(args.tokenizer))
    return LengthCap(args.max_length, tokenizer_counter(folder), folder, args.min_turn_budget)
