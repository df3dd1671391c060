"""Figure: the GPU tokens the trainer's max_length cap saves, and the trained tokens it keeps.

A training row is one turn's prompt and answer cut at the trainer's ``max_length``: a turn whose prompt holds P tokens
trains at most ``max_length − P`` of its tokens. Generate capped (``tokenizer`` given) sends each turn with
``max_tokens = min(max_tokens, max_length − P)`` and sets aside a turn whose prompt alone reaches max_length;
uncapped it generates the rest and the trainer cuts it. Both runs, one after the other in one invocation, on the same
simulated fleet (B200 + MTP lengths; the simulator draws a completion from its prompt, so the same prompt gets the
same answer, and a capped one its prefix) and the same prompt file: conversations of three questions whose user
turns carry long pasted context, so later turns' histories approach max_length.

Printed, from the stored rows and the simulator's ground truth:

  * GPU tokens: completion tokens the servers generated (the simulator's truth), capped ÷ uncapped;
  * trained tokens: per turn, min(completion, max_length − prompt) — over the turns whose prompt is the same in
    both runs (they must match exactly), and over all turns (later turns of a conversation see the history as
    generated: where an earlier answer was capped, their prompts differ from the uncapped run's);
  * requests and turns set aside (never sent) by the capped run.

    .venv/bin/python benchmarks/generate_length_cap.py [--conversations 150] [--max-length 4096] [--servers 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl
from sim_generate import run_generate, sim_generate_config

from draftgen.prompts.synthetic import synthetic_rows
from draftgen.sim import SimFleet
from draftgen.training.local_tokenizer import build_tiny_tokenizer


def context(index: int, words: int) -> str:
    """Pasted context of about ``words`` words (a log, a document): what makes a history long."""
    return " ".join(f"line{index}-{j} value {j * 7 % 101}" for j in range(words // 3))


def write_prompts(path: Path, conversations: int) -> Path:
    firsts = list(synthetic_rows(conversations * 3, seed=47))
    with open(path, "w") as out:
        for i in range(conversations):
            questions = [
                next(m["content"] for m in firsts[3 * i + k]["messages"] if m["role"] == "user")
                for k in range(3)
            ]
            size = (60, 200, 450)[i % 3]  # words of pasted context per user turn
            messages = []
            for k, question in enumerate(questions):
                if k:
                    messages.append({"role": "assistant", "content": "a source answer, regenerated"})
                messages.append({"role": "user", "content": f"{context(3 * i + k, size)}\n\n{question}"})
            out.write(json.dumps({"id": f"c{i:04d}", "messages": messages}) + "\n")
    return path


def turns(folder: Path, max_length: int) -> pl.DataFrame:
    """One row per stored turn: id, turn, its prompt tokens (the server's count), the max_tokens it was sent with,
    its completion tokens and the trained ones (min(completion, max_length − prompt))."""
    frame = (
        pl.read_parquet(folder / "shards" / "*.parquet")
        .select(
            "id",
            pl.col("turn_prompt_tokens").alias("prompt"),
            pl.col("turn_max_tokens").alias("sent"),
            pl.col("turn_completion_tokens").alias("made"),
        )
        .explode("prompt", "sent", "made")
        .with_columns(pl.int_range(pl.len()).over("id").alias("turn"))
    )
    return frame.with_columns(
        pl.min_horizontal("made", pl.max_horizontal(max_length - pl.col("prompt"), 0)).alias("trained")
    )


def generated(fleet: SimFleet, since: float) -> int:
    """Completion tokens the servers generated for chat requests since ``since`` (the simulator's truth)."""
    return sum(
        r["completion_tokens"] for r in fleet.truth() if r.get("kind") == "chat" and r["arrival"] >= since
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=150)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--speed", type=float, default=50.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = build_tiny_tokenizer(folder / "tokenizer")
        prompts = write_prompts(folder / "prompts.jsonl", args.conversations)
        settings = {
            "max_tokens": args.max_tokens,
            "train_max_length": args.max_length,
            "concurrency_per_server": 32,
            "hedge_slow_ratio": 0.0,  # no tail copies: every generated token is one the run asked for
            "status_interval_s": 60.0,
        }
        with SimFleet(
            servers=args.servers,
            profile="b200-mtp",
            speed=args.speed,
            tokenizer=tokenizer,
            work_dir=folder / "sim",
        ) as fleet:
            results = {}
            for name, extra in (("uncapped", {"tokenizer": ""}), ("capped", {"tokenizer": str(tokenizer)})):
                since = time.time()
                config = sim_generate_config(fleet, prompts, folder / name, **settings, **extra)
                result = run_generate(config, progress=False)
                results[name] = (result, generated(fleet, since), turns(folder / name, args.max_length))
        (_, made_u, turns_u), (capped, made_c, turns_c) = results["uncapped"], results["capped"]
        same = turns_u.join(turns_c, on=["id", "turn"], suffix="_c").filter(
            pl.col("prompt") == pl.col("prompt_c")
        )
        manifest = json.loads((folder / "capped" / "manifest.json").read_text())
        session = manifest["sessions"][-1]
        print(
            f"{args.conversations} conversations of 3 turns, max_tokens {args.max_tokens}, trainer max_length "
            f"{args.max_length}, {args.servers} simulated b200-mtp servers"
        )
        print(
            f"GPU tokens generated: uncapped {made_u:,}, capped {made_c:,} — capped ÷ uncapped "
            f"{made_c / made_u:.3f} ({1 - made_c / made_u:.1%} saved)"
        )
        print(
            f"trained tokens, turns with the same prompt in both runs ({same.height:,} of {turns_u.height:,}): "
            f"uncapped {same['trained'].sum():,}, capped {same['trained_c'].sum():,} "
            f"({'identical' if same['trained'].sum() == same['trained_c'].sum() else 'DIFFERENT'})"
        )
        print(
            f"trained tokens, all turns: uncapped {turns_u['trained'].sum():,}, capped {turns_c['trained'].sum():,} "
            f"(ratio {turns_c['trained'].sum() / turns_u['trained'].sum():.3f}; later turns' histories differ where "
            "an earlier answer was capped)"
        )
        print(
            f"generated ÷ trained: uncapped {made_u / turns_u['trained'].sum():.3f}, capped "
            f"{made_c / turns_c['trained'].sum():.3f}"
        )
        print(
            f"capped run: {int(((turns_c['made'] >= turns_c['sent']) & (turns_c['sent'] < args.max_tokens)).sum()):,} "
            f"of {turns_c.height:,} turns ended by the cap (max_length − prompt), {session['set_aside']} prompts set "
            f"aside before their first turn, {session['turns_set_aside']} later turns set aside (never sent); "
            f"{capped.completed:,} conversations stored"
        )


if __name__ == "__main__":
    main()
