"""Shard bytes per row with and without the per-turn token ids (turn_output_ids, turn_prompt_ids/shared).

A demo-sized set: the 2,000 bundled prompts (multi-turn rows included), every turn answered as the simulator's
b200-mtp profile answers it (reasoning and answer lengths, max_tokens 4096, thinking on) in the demo's tokenizer,
with the prompt ids its chat template gives. The same rows are written twice as generate writes its shards
(parquet, zstd, shards of 500): once with the id columns, once without them (the schema before they existed), and
the script prints both sizes per row and their ratio. Rows are built in-process (no servers): what is measured is
storage, not generation.

    .venv/bin/python benchmarks/shard_bytes.py [--prompts 2000] [--max-tokens 4096] [--vocab tiny|qwen3]

``--entropy K`` measures instead what generate's ``entropy_top_k`` K adds: each turn's top-k entropy summary
(``turn_entropy``), from the simulator's top-K logprobs of its tokens, against the same rows without it.

    .venv/bin/python benchmarks/shard_bytes.py --entropy 5
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import polars as pl

from draftgen.client.entropy import EntropySummary
from draftgen.client.records import ChatResult
from draftgen.generate.store import OUTPUT_SCHEMA, atomic_write_parquet
from draftgen.generate.turns import Conversation
from draftgen.prompts.rows import PromptRow, iter_prompts
from draftgen.prompts.synthetic import BUNDLED_PROMPTS
from draftgen.sim.logprobs import ALTERNATIVES, LogprobModel
from draftgen.sim.profiles import get_profile
from draftgen.sim.textgen import plan_completion, request_seed
from draftgen.sim.tokenizer import SimTokenizer
from draftgen.training.local_tokenizer import build_qwen3_tokenizer, build_tiny_tokenizer

ID_COLUMNS = ("turn_output_ids", "turn_prompt_ids", "turn_prompt_shared")
SHARD_ROWS = 500


@functools.cache
def logprob_model(tokenizer: SimTokenizer) -> LogprobModel:
    return LogprobModel.from_texts([t for i in range(ALTERNATIVES) if (t := tokenizer.text_of(i))])


def entropy_of(tokenizer: SimTokenizer, ids: list[int], seed: int, top: int) -> dict | None:
    """The turn's entropy summary as the client makes it from the simulator's top-``top`` logprobs."""
    model = logprob_model(tokenizer)
    summary = EntropySummary()
    summary.add({"content": model.entries(seed, [tokenizer.text_of(i) for i in ids], 0, top)})
    return summary.summary()


def answer(tokenizer: SimTokenizer, messages: list[dict], max_tokens: int, entropy: int = 0) -> ChatResult:
    """One turn as the simulator answers it, with the ids it reports (and its entropy summary, with ``entropy``)."""
    profile = get_profile("b200-mtp")
    prompt = tokenizer.encode(tokenizer.render(messages, True))
    seed = request_seed({"messages": messages, "thinking": True}, None)
    plan = plan_completion(
        seed,
        tokenizer,
        max_tokens=max_tokens,
        enable_thinking=True,
        reasoning_median=profile.reasoning_median,
        answer_median=profile.answer_median,
        sigma=profile.length_sigma,
    )
    reasoning, content = plan.split_range(0, len(plan.tokens))
    return ChatResult(
        server="http://127.0.0.1:30000",
        response_id="r",
        reasoning_content=reasoning or None,
        content=content or None,
        finish_reason=plan.finish_type,
        prompt_tokens=len(prompt),
        completion_tokens=plan.completion_tokens,
        usage_reported=True,
        spec_accept_length=3.6,
        spec_verify_ct=plan.completion_tokens // 3,
        started_at=time.time(),
        latency_s=1.0,
        prompt_ids=prompt,
        output_ids=plan.output_ids(plan.completion_tokens),
        entropy=entropy_of(tokenizer, plan.output_ids(plan.completion_tokens), seed, entropy)
        if entropy
        else None,
    )


def rows(tokenizer: SimTokenizer, limit: int, max_tokens: int, entropy: int = 0) -> list[dict]:
    out = []
    for item in iter_prompts(BUNDLED_PROMPTS):
        if len(out) >= limit:
            break
        if not isinstance(item, PromptRow):
            continue
        conversation = Conversation(item, "all")
        while not conversation.finished:
            conversation.record(answer(tokenizer, list(conversation.request()), max_tokens, entropy), 1)
        out.append(conversation.output_row())
    return out


def shard_bytes(frame: pl.DataFrame, folder: Path) -> int:
    folder.mkdir(parents=True)
    total = 0
    for index, start in enumerate(range(0, frame.height, SHARD_ROWS)):
        path = folder / f"part-{index:06d}.parquet"
        atomic_write_parquet(frame.slice(start, SHARD_ROWS), path)
        total += path.stat().st_size
    return total


def entropy_bytes(frame: pl.DataFrame, tmp: Path, top: int) -> None:
    with_summary = shard_bytes(frame, tmp / "entropy")
    without = shard_bytes(frame.drop("turn_entropy"), tmp / "plain")
    turns = int(frame["turn_after"].list.len().sum())
    tokens = int(frame["completion_tokens"].sum())
    print(f"{frame.height:,} rows, {turns:,} turns, {tokens:,} completion tokens; top_logprobs {top}")
    print(f"without turn_entropy: {without / frame.height:10,.0f} bytes/row  ({without:,} bytes)")
    print(f"with turn_entropy:    {with_summary / frame.height:10,.0f} bytes/row  ({with_summary:,} bytes)")
    print(f"ratio with/without:   {with_summary / without:10.4f}")
    print(f"the summary's cost:   {(with_summary - without) / turns:10.1f} bytes per turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--vocab", choices=("tiny", "qwen3"), default="tiny", help="tiny: the demo's tokenizer"
    )
    parser.add_argument("--entropy", type=int, default=0, help="top_logprobs K: measure turn_entropy instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftgen-shard-bytes-") as tmp:
        folder = Path(tmp) / "tokenizer"
        (build_tiny_tokenizer if args.vocab == "tiny" else build_qwen3_tokenizer)(folder)
        tokenizer = SimTokenizer(folder)
        built = rows(tokenizer, args.prompts, args.max_tokens, args.entropy)
        frame = pl.DataFrame(built, schema=OUTPUT_SCHEMA)
        if args.entropy:
            entropy_bytes(frame, Path(tmp), args.entropy)
            return
        before = frame.drop(ID_COLUMNS)
        with_ids = shard_bytes(frame, Path(tmp) / "after")
        without = shard_bytes(before, Path(tmp) / "before")
        turns = int(frame["turn_after"].list.len().sum())
        tokens = int(frame["completion_tokens"].sum())
        stored_prompt = int(frame["turn_prompt_ids"].list.eval(pl.element().list.len()).list.sum().sum())
        full_prompt = int(frame["turn_prompt_tokens"].list.sum().sum())
        print(
            f"{frame.height:,} rows, {turns:,} turns, {tokens:,} completion tokens ({args.vocab} vocabulary, "
            f"max_tokens {args.max_tokens}); prompt ids stored {stored_prompt:,} of {full_prompt:,} "
            f"({stored_prompt / full_prompt:.2f}: shared history not repeated)"
        )
        print(f"without ids (before): {without / frame.height:10,.0f} bytes/row  ({without:,} bytes)")
        print(f"with ids (after):     {with_ids / frame.height:10,.0f} bytes/row  ({with_ids:,} bytes)")
        print(f"ratio after/before:   {with_ids / without:10.2f}")
        print(f"ids' cost:            {(with_ids - without) / tokens:10.2f} bytes per completion token")


if __name__ == "__main__":
    main()
