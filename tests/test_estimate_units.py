"""The estimate's model without servers: fleet simulation, rate fit, lengths, scenarios, estimate.json."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.model import (
    POINT_REPEATS,
    Conversations,
    LengthSample,
    RateModel,
    estimate_wall,
    fit_rate_model,
    simulate_fleet,
)
from draftgen.estimate.plan import run_estimate
from draftgen.estimate.report import ESTIMATE_FILE, save_estimate
from draftgen.params import ParameterError, build_config

RATE = RateModel(alpha_s=0.004, beta_s=0.0004, max_running=48)  # tpot(b) = 4 ms + 0.4 ms·b
GENERATE_KEYS = {
    "aggregate_output_tok_s",
    "wall_time_s",
    "wall_time_low_s",
    "wall_time_high_s",
    "num_prompts",
    "servers",
    "concurrency_per_server",
    "max_tokens",
    "mean_completion_tokens",
    "scenarios",
}


# ----- fleet simulation against closed forms -------------------------------------------------------------
def test_one_request_at_a_time_is_the_sum_of_lengths_at_batch_one():
    lengths = np.asarray([100.0, 300.0, 50.0])
    assert simulate_fleet(lengths, 1, 1, RATE) == pytest.approx(450 * RATE.tpot(1))


def test_equal_lengths_finish_in_waves_and_the_cap_queues_the_rest():
    tpot48 = RATE.tpot(48)
    # 64 in flight but only 48 run: 200 requests of 100 tokens = 4 full waves of 48, then 8 at batch 8.
    expected = 4 * 100 * tpot48 + 100 * RATE.tpot(8)
    assert simulate_fleet(np.full(200, 100.0), 1, 64, RATE) == pytest.approx(expected)


def test_servers_share_one_queue():
    # Two servers, one slot each: a long request on one server, the short ones all go to the other.
    lengths = np.asarray([1000.0, 10.0, 10.0, 10.0])
    assert simulate_fleet(lengths, 2, 1, RATE) == pytest.approx(1000 * RATE.tpot(1))


def test_long_runs_approach_tokens_over_the_full_batch_rate():
    rng = np.random.default_rng(0)
    per_prompt = rng.integers(200, 4096, size=500).astype(float)
    wall = estimate_wall(per_prompt, 200_000, 7, 64, RATE, rng)
    steady = 200_000 * per_prompt.mean() / (7 * RATE.tok_s(64))
    assert wall.steady_s == pytest.approx(steady)
    assert 0 < wall.tail_s < 0.01 * wall.wall_s  # a day-long run: the drain is a rounding error
    short = estimate_wall(per_prompt, 7 * 64, 7, 64, RATE, rng)
    assert short.tail_s > 0.1 * short.wall_s  # one wave: the drain is a large share of it (about a sixth)


def test_a_point_estimate_averages_its_drain_over_enough_plays_to_hold_still_between_seeds():
    # A short multi-turn run: ~4 conversations per slot, so one play's drain moves the wall time by percents.
    rng = np.random.default_rng(0)
    per_prompt = np.exp(rng.normal(np.log(1500), 0.75, size=400)).clip(1, 4096)
    turns = [[np.inf] * (6 if i % 25 == 0 else 1 + i % 2) for i in range(1_000)]
    conversations = Conversations.of(turns, ordered=True)
    requests = sum(len(t) for t in turns)

    def spread(repeats: int) -> float:
        walls = [
            estimate_wall(
                per_prompt, requests, 7, 64, RATE, np.random.default_rng(seed), repeats, conversations
            ).wall_s
            for seed in range(12)
        ]
        return float(np.std(walls) / np.mean(walls))

    one_play = spread(1)
    assert one_play > 0.015  # the noise being averaged is real
    assert spread(POINT_REPEATS) < one_play / 5  # a point estimate plays enough to shrink it 5x


# ----- rate fit -----------------------------------------------------------------------------------------
def _occupancy(rate: RateModel, seconds_by_b: dict[int, float], server: str = "s0") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "server": [server] * len(seconds_by_b),
            "gpu": [0] * len(seconds_by_b),
            "concurrency": [max(seconds_by_b)] * len(seconds_by_b),
            "in_flight": list(seconds_by_b),
            "seconds": list(seconds_by_b.values()),
            "tokens": [s * rate.tok_s(b) for b, s in seconds_by_b.items()],
        }
    )


def test_fit_recovers_the_curve_and_applies_the_cap():
    # in-flight 64 with a cap of 48 runs at the batch-48 rate
    frame = _occupancy(RATE, {1: 50.0, 4: 2.0, 8: 30.0, 20: 1.0, 48: 40.0})
    frame = pl.concat(
        [frame, _occupancy(RATE, {48: 10.0}).with_columns(pl.lit(64, dtype=pl.Int64).alias("in_flight"))]
    )
    fit = fit_rate_model(frame, 48)
    assert fit.model.alpha_s == pytest.approx(RATE.alpha_s, rel=1e-6)
    assert fit.model.beta_s == pytest.approx(RATE.beta_s, rel=1e-6)
    assert fit.max_abs_rel_error < 1e-6


def test_a_single_batch_size_fits_a_flat_tpot_and_says_so():
    fit = fit_rate_model(_occupancy(RATE, {8: 10.0}), None)
    assert fit.model.tok_s(8) == pytest.approx(RATE.tok_s(8))
    assert fit.model.beta_s == 0.0 and "one in-flight count" in fit.note


def test_a_batch_faster_per_request_than_a_smaller_one_fits_flat_at_the_largest_real_batch():
    """beta < 0 (a CPU server: a batch of 2 costs one step of 1): tpot flat at the largest in-flight count with a
    real share of the time, so a run there is priced at its own speed; a stray sample above it is not that."""
    slow_alone, fast_in_pairs = (
        RateModel(0.14, 0.0, None),
        RateModel(0.0, 0.042, None),
    )  # tpot 0.14 s vs 0.084 s
    frame = pl.concat(
        [
            _occupancy(slow_alone, {1: 60.0}),
            _occupancy(fast_in_pairs, {2: 40.0}),
            _occupancy(RateModel(0.5, 0.0, None), {3: 1.0}),  # 1% of the time at 3 in flight, very slow
        ]
    )
    fit = fit_rate_model(frame, None)
    assert fit.model.beta_s == 0.0 and "flat tpot at 2 in flight" in fit.note
    assert fit.model.tok_s(2) == pytest.approx(fast_in_pairs.tok_s(2))


# ----- lengths ------------------------------------------------------------------------------------------
def test_lengths_clip_at_max_tokens_and_flag_a_lower_bound_above_the_benchmark():
    requests = pl.DataFrame(
        {
            "prompt_id": ["a", "a", "b", "c"],
            "ok": [True, True, True, True],
            "completion_tokens": [100.0, 300.0, 1024.0, 500.0],
            "truncated": [False, False, True, False],
        }
    )
    sample = LengthSample.from_requests(requests, 1024)
    assert sample.prompts == 3
    assert sorted(sample.per_prompt(1024)) == [200.0, 500.0, 1024.0]
    assert sorted(sample.per_prompt(256)) == [178.0, 256.0, 256.0]
    assert sample.truncated_rate(256) == 0.75
    assert not sample.extrapolated(1024) and sample.extrapolated(4096)


# ----- the whole estimate on a benchmark folder with known numbers -------------------------------------------
def _benchmark_folder(tmp_path, servers: int = 2, max_tokens: int = 1024):
    """A benchmark run folder whose servers follow RATE exactly, with a known length distribution."""
    rng = np.random.default_rng(1)
    folder = tmp_path / "bench"
    folder.mkdir()
    occupancy = pl.concat(
        [
            _occupancy(RATE, {1: 20.0, 2: 1.0, 5: 1.0, 8: 20.0, 16: 10.0}, server=f"s{i}")
            for i in range(servers)
        ]
    )
    lengths = np.minimum(rng.lognormal(np.log(600), 0.6, size=300), max_tokens).round()
    requests = pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(300)],
            "ok": [True] * 300,
            "completion_tokens": lengths,
            "truncated": lengths >= max_tokens,
        }
    )
    results = pl.DataFrame(
        {
            "server": [f"s{i}" for i in range(servers) for _ in (1, 16)],
            "concurrency": [c for _ in range(servers) for c in (1, 16)],
            "max_running_requests": [48] * (2 * servers),
            "accept_length": [3.5] * (2 * servers),
            "accept_length_source": ["sglext"] * (2 * servers),
            "ttft_s_p50": [0.05] * (2 * servers),
        }
    )
    occupancy.write_parquet(folder / "occupancy.parquet")
    requests.write_parquet(folder / "requests.parquet")
    results.write_parquet(folder / "results.parquet")
    (folder / "benchmark.json").write_text(json.dumps({"max_tokens": max_tokens, "failed": 0}))
    return folder, lengths


def test_estimate_end_to_end_on_a_known_benchmark(tmp_path):
    folder, lengths = _benchmark_folder(tmp_path)
    config = build_config(
        EstimateConfig,
        {
            "benchmark_dir": str(folder),
            "dataset_size": 100_000,
            "turns": "last",  # 100,000 requests (turns: all would scale by the bundled set's answers per prompt)
            "gpus": 7,
            "concurrency_per_server": 16,
            "max_tokens": 1024,
            "gpu_hour_usd": 5.0,
            "bootstrap": 20,
            "scenarios": [{"name": "4x other", "gpus": 4, "tok_s_per_gpu": 400.0, "gpu_hour_usd": 2.0}],
            "out_dir": str(tmp_path / "est"),
        },
    )
    estimate = run_estimate(config)
    p, c1 = estimate.production, estimate.concurrency_1
    steady = 100_000 * lengths.mean() / (7 * RATE.tok_s(16))
    assert p.wall_time_s == pytest.approx(steady, rel=0.01)
    assert p.wall_time_low_s <= p.wall_time_s <= p.wall_time_high_s
    assert p.cost_usd == pytest.approx(p.wall_time_s / 3600 * 7 * 5.0)
    assert c1.wall_time_s == pytest.approx(100_000 * lengths.mean() / (7 * RATE.tok_s(1)), rel=0.01)
    other = estimate.scenarios[0]
    assert other.tok_s_per_gpu == pytest.approx(400.0)
    assert other.wall_time_s == pytest.approx(100_000 * lengths.mean() / 1600.0, rel=0.01)
    assert "assumed" in other.source and "lengths only" in other.interval_note

    data = json.loads(save_estimate(estimate, config.out_dir).read_text())
    assert GENERATE_KEYS <= set(data)
    assert (data["servers"], data["num_prompts"], data["concurrency_per_server"]) == (7, 100_000, 16)
    assert data["concurrency_1"]["times_longer_than_production"] == pytest.approx(
        c1.wall_time_s / p.wall_time_s
    )
    assert [s["scenario"] for s in data["scenarios"]][2] == "4x other"
    assert (tmp_path / "est" / ESTIMATE_FILE).is_file()


def test_max_tokens_above_the_benchmark_is_flagged_as_a_lower_bound(tmp_path):
    folder, _ = _benchmark_folder(tmp_path, servers=1)
    config = build_config(
        EstimateConfig,
        {
            "benchmark_dir": str(folder),
            "dataset_size": 1000,
            "max_tokens": 4096,
            "bootstrap": 10,
            "concurrency_per_server": 8,
        },
    )
    estimate = run_estimate(config)
    assert estimate.production.lengths_are_lower_bound
    assert any("lower bounds" in note for note in estimate.notes)
    assert "one server" in estimate.production.interval_note


def test_config_names_bad_scenarios_and_a_missing_benchmark(tmp_path):
    with pytest.raises(ParameterError) as caught:
        build_config(
            EstimateConfig,
            {
                "benchmark_dir": str(tmp_path),
                "scenarios": [
                    {"name": "x", "gpus": 4, "tok_s_per_gpu": 400.0, "benchmark_dir": str(tmp_path)},
                    {"name": "y", "gpus": 0},
                    {"name": "z", "gpus": 2, "tok_per_gpu": 1.0},
                ],
            },
        )
    text = str(caught.value)
    assert "holds no results.parquet" in text
    assert "scenarios.1.gpus" in text and "scenarios.2.tok_per_gpu" in text
    assert "not both" in text or "holds no results.parquet" in text


def test_durations_read_in_the_unit_a_person_would_use():
    from draftgen.display.humanize import duration, duration_unit

    assert duration(16.5 * 86_400) == "16.5 days"
    assert duration(5 * 3_600) == "5.0 h"
    assert duration(95) == "95.0 s" and duration(150) == "2.5 min"
    assert duration(12.34) == "12.3 s"
    assert duration_unit(7_199) == ("min", 60.0)  # under two hours still reads in minutes


def test_the_estimate_prices_the_conversations_generate_sends(tmp_path, tokenizer_dir):
    """Rows minus malformed rows and skipped duplicates; with the tokenizer, minus the turns generate sets aside."""
    folder, _ = _benchmark_folder(tmp_path)
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"Question number {i} about tides and moons."} for i in range(200)]
    rows += [{"id": f"copy{i}", "prompt": f"Question number {i} about tides and moons."} for i in range(30)]
    long = "word " * 5000  # alone past max_length 4096: set aside, never priced
    rows += [{"id": f"long{i}", "prompt": f"{i} {long}"} for i in range(20)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    values = {
        "benchmark_dir": str(folder),
        "prompts": str(prompts),
        "turns": "last",
        "gpus": 2,
        "concurrency_per_server": 16,
        "max_tokens": 1024,
        "bootstrap": 10,
        "scenarios": [],
        "out_dir": str(tmp_path / "est"),
    }
    estimate = run_estimate(build_config(EstimateConfig, values))
    assert estimate.num_prompts == 220  # 251 rows: 1 malformed, 30 duplicates skipped
    assert (
        "30 duplicates skipped" in estimate.num_prompts_source
        and "1 malformed" in estimate.num_prompts_source
    )
    assert estimate.audit is not None and estimate.audit.duplicates == 30
    kept = run_estimate(build_config(EstimateConfig, {**values, "keep_duplicates": True}))
    assert kept.num_prompts == 250
    capped = run_estimate(build_config(EstimateConfig, {**values, "tokenizer": str(tokenizer_dir)}))
    assert capped.num_prompts == 200  # the 20 whose prompt alone reaches max_length are not priced
    assert capped.audit.budgets.by_class["max_length"] == 20
    data = json.loads(save_estimate(capped, tmp_path / "est").read_text())
    assert data["prompt_audit"]["duplicates"] == 30 and data["num_prompts"] == 200


def test_each_draw_is_clipped_at_the_rooms_the_trainers_max_length_leaves():
    tokens = np.array([100.0, 1000.0])
    turns = Conversations.of([[50.0], [np.inf], [np.inf], [500.0]])  # four one-turn conversations
    # draw 100: (50 + 100 + 100 + 100) / 4; draw 1000: (50 + 1000 + 1000 + 500) / 4
    assert turns.mean_work(tokens, tokens) == pytest.approx((87.5 + 637.5) / 2)
    assert turns.mean_work(tokens, tokens, np.array([0.25, 0.75])) == pytest.approx(
        0.25 * 87.5 + 0.75 * 637.5
    )
    # work clipped in proportion: an arm whose tokens cost twice the benchmark's
    assert turns.mean_work(2 * tokens, tokens) == pytest.approx(87.5 + 637.5)


def test_the_rate_is_scaled_to_the_acceptance_of_the_sets_own_mix(tmp_path):
    """The bundled set's long chats yield 2 tokens a verify step, everything else 4; the benchmark asked a long chat
    once in ten requests, generate asks one at each of its many answer points: priced slower than the curve."""
    folder, _ = _benchmark_folder(tmp_path)
    path = folder / "requests.parquet"
    requests = pl.read_parquet(path)
    long_chat = np.arange(requests.height) % 10 == 0
    requests.with_columns(
        pl.Series("category", np.where(long_chat, "long_chat", "math")),
        (pl.col("completion_tokens") / pl.Series(np.where(long_chat, 2.0, 4.0)))
        .round()
        .alias("spec_verify_ct"),
    ).with_columns(
        (pl.col("completion_tokens") / pl.col("spec_verify_ct")).alias("spec_accept_length")
    ).write_parquet(path)
    values = {
        "benchmark_dir": str(folder),
        "gpus": 7,
        "concurrency_per_server": 16,
        "max_tokens": 1024,
        "bootstrap": 10,
        "scenarios": [],
        "out_dir": str(tmp_path / "est"),
    }
    estimate = run_estimate(build_config(EstimateConfig, values))
    mix = estimate.benchmark.mix
    assert mix is not None and mix.apart == ("long_chat", "math")
    assert mix.benchmark == pytest.approx(1 / (0.1 / 2 + 0.9 / 4), rel=0.02)
    assert mix.factor < 0.97  # long chats weigh more in the set's requests than in the benchmark's
    assert estimate.production.tok_s_per_gpu == pytest.approx(RATE.tok_s(16) * mix.factor)
    assert any("tokens per verify step" in note for note in estimate.notes)
    fitted = estimate.benchmark.fit.model.tok_s(16)
    assert fitted == pytest.approx(RATE.tok_s(16))  # the fit itself is the benchmark's
    written = json.loads(save_estimate(estimate, tmp_path / "est").read_text())["rate_model"][
        "acceptance_mix"
    ]
    assert written["factor"] == pytest.approx(mix.factor) and written["set"] == pytest.approx(mix.set)
