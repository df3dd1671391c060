"""Where a demo's estimate and its generate run part: the request count, the tokens per request, and the rate.

Reads a finished ``draftgen demo`` folder (its benchmark, estimate and generate runs) and prints, as ratios of the
run to the plan: requests sent ÷ planned; mean completion tokens per request; the wall time as the demo prints it
(``generate.report.compare_estimate``) and as the generation's own span. Then it separates the estimate's model from
its inputs, each ratio taken within this one run:

* lengths: the estimate's mean tokens per turn re-priced with the set's own lengths (the run's text turns sent with
  the full max_tokens stand in for the benchmark's sample: same rooms, same conversations), ÷ the run's mean. What
  is left between this and 1 is the model; what it moves from the first ratio is the benchmark's sample.
* rate: the run's own turns replayed through the benchmark's fitted rate curve (at the set's acceptance, as the
  estimate prices it: ``estimate.acceptance_mix``), each conversation in one slot in
  the file's order (``estimate.model.simulate_fleet``), ÷ the generation's span on the clock its simulators kept.
* drain: the same replay ÷ the estimate's model played on the run's own lengths (``estimate.model.estimate_wall``,
  every turn a fresh draw of them, ``--draws`` times): how long the last conversations of this set happened to run
  against what the model expects of such lengths; the draws' spread is the noise no estimate made before the run
  can remove (the answers do not exist yet). Then the run's longest conversation against the longest of such plays,
  and the replay with the run's own conversations permuted among those of as many turns.
* the benchmark's sample: its mean completion ÷ the set's; and with ``--seeds N``, how far the mean of such a
  sample (the benchmark's own sampler, as many prompts, N seeds) spreads, over the set's one-turn prompts, whose
  answer in the run is the one the benchmark measured for the same prompt (the simulator answers a prompt alike).

    .venv/bin/python benchmarks/estimate_vs_run.py outputs/demo [--seeds 30]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from draftgen.estimate.acceptance_mix import acceptance_mix, set_rooms
from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.inputs import audit_prompt_set, load_benchmark, measured_answers, sent_conversations
from draftgen.estimate.model import estimate_wall, fit_rate_model, simulate_fleet
from draftgen.generate.report import compare_estimate, summary
from draftgen.params import build_config
from draftgen.rundir.layout import ESTIMATE
from draftgen.training.masks import load_tokenizer


def _text_turns(shards: pl.DataFrame, think_end: int, full_room: int) -> tuple[np.ndarray, np.ndarray]:
    """Completion and answer tokens of the run's turns in text (no tool calls) sent with the full max_tokens."""
    tokens, answers = [], []
    for row in shards.iter_rows(named=True):
        calls = row.get("turn_tool_calls") or [None] * len(row["turn_max_tokens"])
        for ids, room, called in zip(row["turn_output_ids"], row["turn_max_tokens"], calls, strict=True):
            if room >= full_room and not called and ids is not None:
                ids = list(ids)
                tokens.append(len(ids))
                answers.append(len(ids) - ids.index(think_end) - 1 if think_end in ids else 0)
    return np.asarray(tokens, dtype=float), np.asarray(answers, dtype=float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo", type=Path, help="a finished draftgen demo folder")
    parser.add_argument(
        "--seeds", type=int, default=0, help="spread of a benchmark sample's mean over N seeds"
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=20,
        help="the model's plays of the run's own lengths for the drain (default 20)",
    )
    args = parser.parse_args()
    demo = args.demo
    estimate = json.loads((demo / "estimate" / ESTIMATE).read_text())
    run = summary(demo / "generate").row(0, named=True)
    compared = {
        r["figure"]: r for r in compare_estimate(demo / "estimate" / ESTIMATE, demo / "generate").to_dicts()
    }
    wall = next(r for name, r in compared.items() if name.startswith("wall time"))
    span = run["generating_s"] - run["start_wave_idle_s"]
    print(f"{demo}: simulators kept {run.get('clock_kept', 1.0):.1%} of their clock over the run")
    print(
        f"  requests sent / planned        {run['turns'] / estimate['num_prompts']:.3f}  ({run['turns']:,} / {estimate['num_prompts']:,})"
    )
    mean = run["completion_tokens"] / run["turns"]
    print(
        f"  mean tokens actual / planned   {mean / estimate['mean_completion_tokens']:.3f}  ({mean:,.1f} / {estimate['mean_completion_tokens']:,.1f})"
    )
    print(f"  wall time (the demo's line)    {wall['actual / planned']:.3f}")
    print(
        f"  wall time (the span)           {span / estimate['wall_time_s']:.3f}  ({span:,.1f} s / {estimate['wall_time_s']:,.1f} s)"
    )

    params = yaml.safe_load((demo / "estimate" / "parameters.yaml").read_text())
    config = build_config(EstimateConfig, {**params, "out_dir": str(demo / "estimate")})
    data = load_benchmark(demo / "benchmark")
    audit = audit_prompt_set(config, measured_answers(data))
    conversations = sent_conversations(audit)
    tokenizer = load_tokenizer(config.tokenizer)
    shards = pl.read_parquet(demo / "generate" / "shards" / "*.parquet").sort("source_row")
    own, own_answers = _text_turns(
        shards, tokenizer.convert_tokens_to_ids("</think>"), config.max_tokens - 100
    )
    if conversations is not None:
        repriced = conversations.mean_work(own, own, None, own_answers)
        print(
            f"  lengths: model on the set's own lengths / run   {repriced / mean:.3f}  ({repriced:,.1f}, {own.size:,} turns)"
        )

    rate = fit_rate_model(data.occupancy, data.max_running).model
    mix = acceptance_mix(data.requests, set_rooms(audit))
    if mix is not None:  # the curve the estimate priced with: at the set's acceptance
        rate = rate.scaled(mix.factor, "at the set's acceptance")
        print(f"  acceptance: the set's tokens per verify step / the benchmark's   {mix.factor:.3f}")
    jobs = np.asarray([float(sum(turns)) for turns in shards["turn_completion_tokens"].to_list()])
    servers, slots = int(estimate["servers"]), int(estimate["concurrency_per_server"])
    replay = simulate_fleet(jobs, servers, slots, rate)
    print(
        f"  rate: run's span / its turns replayed on the fitted curve   {span / replay:.3f}  ({replay:,.1f} s)"
    )

    if conversations is not None and args.draws:
        rng = np.random.default_rng(0)
        walls = np.asarray(
            [
                estimate_wall(
                    own,
                    run["turns"],
                    int(estimate["servers"]),
                    int(estimate["concurrency_per_server"]),
                    rate,
                    rng,
                    repeats=1,
                    conversations=conversations,
                    tokens=own,
                    answers=own_answers,
                ).wall_s
                for _ in range(args.draws)
            ]
        )
        print(
            f"  drain: the replay / the model on the run's own lengths   {replay / walls.mean():.3f}  "
            f"({walls.mean():,.1f} s; over {args.draws} draws sd {walls.std() / walls.mean():.1%}, "
            f"range {walls.min() / walls.mean():.3f}–{walls.max() / walls.mean():.3f})"
        )
        _longest(
            shards,
            jobs,
            replay,
            conversations,
            own,
            own_answers,
            lambda j: simulate_fleet(j, servers, slots, rate),
        )

    measured = data.requests.filter(pl.col("ok"))["completion_tokens"]
    print(f"  the benchmark's sample: its mean / the set's text turns'   {measured.mean() / own.mean():.3f}")
    if args.seeds:
        _sample_spread(shards, config.prompt_path, measured.len(), args.seeds)


def _longest(shards, jobs, replay, conversations, own, own_answers, play, plays: int = 100) -> None:  # type: ignore[no-untyped-def]
    """The run's longest conversation against the longest of the model's plays, and the replay with the run's own
    conversations permuted among those of as many turns (is the file's order of them unusual?)."""
    rng = np.random.default_rng(0)
    longest = int(np.argmax(jobs))
    maxima = []
    for _ in range(plays):
        maxima.append(conversations.play(rng, len(jobs), own, own_answers)[1].max())
    print(
        f"  the longest conversation: row {shards['source_row'][longest]}, {len(shards['turn_after'][longest])} turns, "
        f"{jobs[longest]:,.0f} tokens; longer than the longest of {np.mean(np.asarray(maxima) < jobs[longest]):.1%} "
        "of the model's plays"
    )
    turns = shards["turn_after"].list.len().to_numpy()
    permuted = []
    for _ in range(20):
        shuffled = jobs.copy()
        for count in np.unique(turns):
            same = np.flatnonzero(turns == count)
            shuffled[same] = jobs[rng.permutation(same)]
        permuted.append(play(shuffled))
    print(
        f"  the order: the replay / the run's conversations permuted among those of as many turns   "
        f"{replay / np.mean(permuted):.3f}  (s.d. {np.std(permuted) / np.mean(permuted):.1%})"
    )


def _sample_spread(shards: pl.DataFrame, prompts: Path, count: int, seeds: int) -> None:
    """The mean answer length of the one-turn prompts a benchmark sample of ``count`` would hold, ÷ all of theirs."""
    from draftgen.bench.sample import sample_prompts

    one_turn = shards.filter(pl.col("turn_after").list.len() == 1)
    answered = dict(zip(one_turn["id"], one_turn["completion_tokens"], strict=True))
    whole = float(np.mean(list(answered.values())))
    means = []
    for seed in range(seeds):
        picked = [answered[r.id] for r in sample_prompts(prompts, count, seed=seed).rows if r.id in answered]
        means.append(float(np.mean(picked)) / whole)
    spread = np.asarray(means)
    print(
        f"  a {count}-prompt sample's mean / the set's, over {seeds} seeds: seed 0 {spread[0]:.3f}, "
        f"sd {spread.std():.3f}, range {spread.min():.3f}–{spread.max():.3f}"
    )


if __name__ == "__main__":
    main()
