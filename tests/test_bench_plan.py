"""The benchmark measures each arm of a sampling plan: each level sends the plan's mix, each request sampled by its
arm and tagged with it, and the figures per arm follow the simulator's ground truth."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import polars as pl
import pytest
from bench_helpers import facts

from draftgen.bench.checkpoint import level_identity
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.report import acceptance_breakdowns, build_report
from draftgen.bench.run import run_benchmark
from draftgen.bench.sample import sample_prompts
from draftgen.params import build_config
from draftgen.prompts.synthetic import BUNDLED_PROMPTS
from draftgen.sampling_plan import Arm, samples

MODEL = "Qwen/Qwen3.6-27B"
PLAN = [
    {"name": "think", "answers": 2, "temperature": 0.6},
    {"name": "nothink", "share": 0.5, "enable_thinking": False, "temperature": 1.0, "max_tokens": 512},
]


def _config(tmp_path, **values: object) -> BenchmarkConfig:
    base = {
        "servers": ["http://127.0.0.1:9"],
        "model": MODEL,
        "out_dir": str(tmp_path),
        "warmup_requests": 0,
        "concurrencies": [16],
        "num_prompts": 90,
        "max_tokens": 1024,
        "category_field": "",
    }
    return build_config(BenchmarkConfig, {**base, **values})


def test_an_arm_samples_with_the_runs_settings_under_its_own(tmp_path):
    config = _config(tmp_path, sampling_plan=PLAN)
    think, nothink, none = (config.arm_sampling(a) for a in ("think", "nothink", None))
    assert (think.temperature, think.enable_thinking, think.max_tokens) == (0.6, True, 1024)
    assert (nothink.temperature, nothink.enable_thinking, nothink.max_tokens) == (1.0, False, 512)
    assert none == config.sampling


def test_the_plan_is_part_of_a_stored_levels_identity(tmp_path):
    rows = sample_prompts(BUNDLED_PROMPTS, 4).rows
    plain, planned = _config(tmp_path), _config(tmp_path, sampling_plan=PLAN)
    without = level_identity(facts(), plain, 16, rows)
    assert (
        "sampling_plan" not in without
    )  # levels stored before the plan existed still match a run without one
    with_plan = level_identity(facts(), planned, 16, rows)
    assert with_plan["sampling_plan"] == [Arm.model_validate(a).model_dump(exclude_none=True) for a in PLAN]
    other = _config(tmp_path, sampling_plan=[{**PLAN[0], "answers": 3}, PLAN[1]])
    assert level_identity(facts(), other, 16, rows) != with_plan


def test_a_planned_sample_keeps_each_prompts_samples_side_by_side():
    sample = sample_prompts(BUNDLED_PROMPTS, 20, seed=3)
    arms = [Arm.model_validate(a) for a in PLAN]
    planned = sample.planned(arms)
    expected = [s for row in sample.rows for s in samples(row.id, arms)]
    assert [r.id for r in planned.rows] == [s.id for s in expected]
    assert [r.arm for r in planned.rows] == [s.arm for s in expected]
    assert all(r.prompt_id == s.prompt_id for r, s in zip(planned.rows, expected, strict=True))
    assert sample.planned([]) is sample


def test_the_benchmark_measures_each_arm_as_the_simulator_ran_it(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=40.0)
    config = _config(tmp_path, servers=fleet.urls, sampling_plan=PLAN)
    run = asyncio.run(run_benchmark(config))
    report = build_report(run)
    requests = report.requests
    assert requests.height == 90 and requests["ok"].all()
    arms = requests["arm"].to_list()
    assert set(arms) == {"think", "nothink"}
    # the mix generate will send: two thinking answers per prompt, and one more for about half the prompts
    per_prompt = requests.sort("seq").group_by("prompt_id", maintain_order=True).agg(pl.col("arm"))
    for arm_list in per_prompt["arm"].to_list()[1:-1]:  # the first and last prompt may be cut by the slice
        assert sorted(arm_list) in (["think", "think"], ["nothink", "think", "think"])

    truth = {r["rid"]: r for r in fleet.truth(0) if r["kind"] == "chat"}
    by_arm: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in requests.iter_rows(named=True):
        record = truth[row["response_id"]]
        assert record["temperature"] == {"think": 0.6, "nothink": 1.0}[row["arm"]]
        by_arm[row["arm"]].append((row["completion_tokens"], record["accept_expected"]))
    # thinking off: no reasoning, its own max_tokens, far shorter answers
    off = requests.filter(pl.col("arm") == "nothink")
    on = requests.filter(pl.col("arm") == "think")
    assert off["reasoning_chars"].sum() == 0 and (on["reasoning_chars"] > 0).all()
    assert off["completion_tokens"].max() <= 512
    assert off["completion_tokens"].mean() < 0.5 * on["completion_tokens"].mean()
    # two answers of one prompt in one arm are two draws: each request carries its sample's seed
    seeds = on.with_columns(
        pl.col("response_id").map_elements(lambda rid: str(truth[rid]["seed"]), pl.String).alias("s")
    )
    pairs = seeds.group_by("prompt_id").agg(pl.col("s")).filter(pl.col("s").list.len() == 2)
    assert pairs.height >= 10 and all(a != b for a, b in pairs["s"].to_list())

    table = acceptance_breakdowns(report)["arm"]
    measured = dict(zip(table["arm"], table["accept_length"], strict=True))
    for arm, items in by_arm.items():
        expected = sum(t for t, _ in items) / sum(t / m for t, m in items)
        assert measured[arm] == pytest.approx(expected, rel=0.03), arm
    assert measured["think"] - measured["nothink"] > 0.1  # the arm at temperature 1.0 accepts less
