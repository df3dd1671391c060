"""Figure: a floor under a turn's budget — prompt tokens prefilled per trained token, with and without it.

A long conversation's later turns carry their whole history, so the room the trainer's ``max_length`` leaves them
shrinks turn by turn; a turn left a few hundred tokens is prefilled whole (and read whole by the trainer) to train
those few hundred. ``min_turn_budget`` sets such turns aside. Both runs, one after the other in one invocation, on
the same simulated fleet and the same prompt file — the generator's long multi-turn chats
(``draftgen prompts --shape long-chat``: up to 15 user turns, pasted documents, code and logs) — with
``params/b200x7.yaml``'s values (max_tokens 4096, temperature 0.6, top_p 0.95, thinking on, turns all, 64 in flight
per server) and the trainer's max_length 4096, each turn capped with the tokenizer (Qwen3's vocabulary, draftgen's
Qwen3-format chat template; the simulated servers serve the same). The run with the floor is then
validated with the production defaults, as a user would: the gate's line and whether the export was published.

Printed, from the simulator's ground truth (every request's prompt and completion tokens) and the stored rows:

  * prompt tokens prefilled (every request's prompt, summed; the simulator's prefix cache is not counted off),
    completion tokens generated, trained tokens (per turn, min(completion, max_length − prompt));
  * prompt tokens per trained token and GPU-seconds per million trained tokens (the session's simulated-B200
    seconds × servers), floor ÷ no floor;
  * the turns the floor set aside and what they would have trained (from the run without it: its turns with less
    room than the floor);
  * turns cut at max_length (expected) and by max_tokens, and the guard's verdict, in both runs.

    .venv/bin/python benchmarks/generate_turn_floor.py [--conversations 1000] [--servers 7] [--floor 512]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl
from sim_generate import run_generate, sim_generate_config

from draftgen.generate.report import gpu_seconds, turn_cuts
from draftgen.params import build_config, load_params_files
from draftgen.prompts.long_chat import long_chat_rows
from draftgen.prompts.synthetic import write_rows
from draftgen.runner import REPO_ROOT
from draftgen.sim import SimFleet
from draftgen.training.local_tokenizer import build_qwen3_tokenizer
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import finalize_export, gate_message, validate_generation


def turns(folder: Path, max_length: int) -> pl.DataFrame:
    """One row per stored turn: its prompt tokens (the server's count), completion and trained tokens."""
    frame = pl.read_parquet(folder / "shards" / "*.parquet").select(
        "id",
        pl.col("turn_prompt_tokens").alias("prompt"),
        pl.col("turn_completion_tokens").alias("made"),
    )
    frame = frame.explode("prompt", "made")
    return frame.with_columns(
        pl.min_horizontal("made", pl.max_horizontal(max_length - pl.col("prompt"), 0)).alias("trained"),
        (max_length - pl.col("prompt")).alias("room"),
    )


def requests(fleet: SimFleet, since: float) -> pl.DataFrame:
    """Every chat request since ``since`` as the simulator recorded it: prompt and completion tokens."""
    rows = [
        {"prompt": r["prompt_tokens"], "made": r["completion_tokens"]}
        for r in fleet.truth()
        if r.get("kind") == "chat" and r["arrival"] >= since
    ]
    return pl.DataFrame(rows, schema={"prompt": pl.Int64, "made": pl.Int64})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=7)
    parser.add_argument("--speed", type=float, default=20.0)
    parser.add_argument("--floor", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    production = load_params_files([REPO_ROOT / "params" / "b200x7.yaml"])
    max_length = 4096

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = build_qwen3_tokenizer(folder / "tokenizer")  # Qwen3's vocabulary: real sets' token counts
        prompts = folder / "prompts.jsonl"
        write_rows(prompts, long_chat_rows(args.conversations, seed=args.seed))
        runs = {}
        with SimFleet(
            servers=args.servers,
            profile="b200-mtp",
            speed=args.speed,
            tokenizer=tokenizer,
            work_dir=folder / "sim",
        ) as fleet:
            for name, floor in (("no floor", 0), ("floor", args.floor)):
                since = time.time()
                settings = {k: v for k, v in production.items() if k not in ("servers", "prompts")}
                config = sim_generate_config(
                    fleet,
                    prompts,
                    folder / name,
                    **settings,
                    max_truncated_rate=0.5,  # the production guard: a halt would end the figure
                    train_max_length=max_length,
                    min_turn_budget=floor,
                    tokenizer=str(tokenizer),
                    status_interval_s=60.0,
                )
                started = time.perf_counter()
                result = run_generate(config, progress=False)
                manifest = json.loads((folder / name / "manifest.json").read_text())
                runs[name] = {
                    "result": result,
                    "wall": time.perf_counter() - started,
                    "requests": requests(fleet, since),
                    "turns": turns(folder / name, max_length),
                    "gpu_s": gpu_seconds(manifest["sessions"]),
                    "cuts": turn_cuts(folder / name),
                    "session": manifest["sessions"][-1],
                }
        checked = validate_generation(
            build_config(
                ValidateConfig,
                {
                    "generation_dir": str(folder / "floor"),
                    "tokenizer": str(tokenizer),
                    "out_dir": str(folder / "v"),
                },
            ),
            progress=False,
        )
        published = finalize_export(checked) if checked.passed else None

    print(
        f"{args.conversations:,} long multi-turn conversations (draftgen prompts --shape long-chat, seed {args.seed}), "
        f"params/b200x7.yaml's values, trainer max_length {max_length}, tokenizer-capped, {args.servers} simulated "
        f"b200-mtp servers at speed {args.speed:g}"
    )
    figures = {}
    for name, run in runs.items():
        sent, stored = run["requests"], run["turns"]
        trained = int(stored["trained"].sum())
        prompt = int(sent["prompt"].sum())
        turns_, by_tokens, at_length = run["cuts"]
        session = run["session"]
        figures[name] = (prompt / trained, run["gpu_s"] / trained * 1e6)
        print(
            f"  {name:8}: {run['result'].status}, {len(sent):,} requests, {prompt:,} prompt tokens prefilled, "
            f"{int(sent['made'].sum()):,} generated, {trained:,} trained — {prompt / trained:.2f} prompt tokens and "
            f"{run['gpu_s'] / trained * 1e6:,.0f} GPU-s per million trained tokens; turns cut at max_length "
            f"{at_length:,} of {turns_:,}, by max_tokens {by_tokens:,}; set aside: {session['set_aside']} prompts, "
            f"{session['turns_set_aside']} later turns {session.get('set_aside_by', {})}; {run['wall']:.0f} s wall"
        )
    (prompt_none, gpu_none), (prompt_floor, gpu_floor) = figures["no floor"], figures["floor"]
    print(
        f"floor ÷ no floor: prompt tokens per trained token {prompt_floor / prompt_none:.3f}, GPU-seconds per trained "
        f"token {gpu_floor / gpu_none:.3f}"
    )
    below = runs["no floor"]["turns"].filter(pl.col("room") < args.floor)
    below_prompts = int(below["prompt"].sum())
    print(
        f"turns with less room than {args.floor} in the run without the floor: {below.height:,}, prefilled "
        f"{below_prompts:,} prompt tokens to train {int(below['trained'].sum()):,} "
        f"({below_prompts / max(1, int(below['trained'].sum())):.1f} per trained token)"
    )
    print(f"validate (floor run, production defaults): {gate_message(checked)}")
    print(f"export published: {published if published is not None else 'no'}")


if __name__ == "__main__":
    main()
