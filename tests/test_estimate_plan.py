"""The estimate prices a sampling plan: requests per prompt, each arm's lengths and acceptance (measured by a
benchmark run with the plan, or assumed), so a two-arm run's wall time is predicted as a one-answer run's is."""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pytest
from bench_helpers import bench_estimate_generate

from draftgen.estimate.arms import price_plan
from draftgen.estimate.config import ArmAssumption, EstimateConfig
from draftgen.estimate.model import RateModel, estimate_wall
from draftgen.generate import report
from draftgen.params import ParameterError, build_config
from draftgen.prompts.synthetic import BUNDLED_PROMPTS
from draftgen.sampling_plan import Arm

PLAN = [
    {"name": "think", "answers": 2, "temperature": 0.6},
    {"name": "nothink", "share": 0.5, "enable_thinking": False, "temperature": 1.0, "max_tokens": 512},
]
ARMS = [Arm.model_validate(a) for a in PLAN]


def _requests(rng: np.random.Generator) -> pl.DataFrame:
    """A benchmark's requests.parquet for the plan: thinking answers ~1,000 tokens at acceptance 3.6, thinking-off
    answers ~200 at 3.0 (verify steps = tokens / acceptance)."""
    rows = []
    for p in range(40):
        for arm, mean, accept, k in (("think", 1000, 3.6, 2), ("nothink", 200, 3.0, p % 2)):
            for _ in range(k):
                tokens = int(rng.integers(mean // 2, mean * 3 // 2))
                rows.append(
                    {
                        "prompt_id": f"p{p}",
                        "arm": arm,
                        "ok": True,
                        "completion_tokens": tokens,
                        "truncated": False,
                        "spec_verify_ct": round(tokens / accept),
                        "spec_accept_length": None,
                    }
                )
    return pl.DataFrame(rows)


# ----- units ------------------------------------------------------------------------------------------------
def test_each_arm_is_priced_from_its_own_requests():
    requests = _requests(np.random.default_rng(1))
    recorded = [arm.model_dump(mode="json") for arm in ARMS]  # as benchmark.json holds it: unset fields null
    plan = price_plan(requests, 4096, recorded, ARMS, [], 4096)
    assert plan.requests_per_prompt == pytest.approx(2.5)
    think, nothink = plan.arms
    own = requests.filter(pl.col("arm") == "nothink")
    assert nothink.per_prompt().mean() == pytest.approx(
        own.group_by("prompt_id").agg(pl.col("completion_tokens").mean())["completion_tokens"].mean()
    )
    reference = requests["completion_tokens"].sum() / requests["spec_verify_ct"].sum()
    assert plan.reference_accept == pytest.approx(reference)
    assert nothink.accept_length == pytest.approx(3.0, rel=0.01) and think.accept_length == pytest.approx(
        3.6, rel=0.01
    )
    assert nothink.speed == pytest.approx(nothink.accept_length / reference)
    draws = plan.draws()
    assert draws.weights is not None and draws.weights.sum() == pytest.approx(1.0)
    expected = (2 * think.per_prompt().mean() + 0.5 * nothink.per_prompt().mean()) / 2.5
    assert draws.mean_tokens == pytest.approx(expected)
    # work: each arm's tokens at the benchmark's acceptance, so a slow arm's tokens cost more
    assert draws.mean(draws.work) == pytest.approx(
        (2 * think.per_prompt().mean() / think.speed + 0.5 * nothink.per_prompt().mean() / nothink.speed)
        / 2.5
    )
    assert plan.notes == ()
    hotter = [ARMS[0], Arm(**{**PLAN[1], "temperature": 1.2})]
    (note,) = price_plan(requests, 4096, recorded, hotter, [], 4096).notes
    assert "arm nothink" in note and "benchmarked as" in note and "'temperature': 1.0" in note
    table = plan.table(1000)
    assert table["arm"].to_list() == ["think", "nothink"] and table["requests"].to_list() == [800, 200]
    assert table["share_of_tokens"].sum() == pytest.approx(1.0, abs=1e-3)


def test_a_plan_leaning_on_a_slower_arm_than_the_benchmark_did_costs_more_per_token():
    """The rate curve was measured on the benchmark's mix, so the mix it measured costs what it measured (work =
    tokens); a plan with more of the arm that accepts fewer drafts costs more time per token."""
    requests = _requests(np.random.default_rng(2))
    rate = RateModel(alpha_s=0.01, beta_s=0.001, max_running=48)
    same = price_plan(requests, 4096, PLAN, ARMS, [], 4096).draws()
    assert same.mean(same.work) == pytest.approx(same.mean_tokens, rel=0.01)
    more_off = [ARMS[0], Arm(**{**PLAN[1], "share": 1.0, "answers": 4})]
    plan = price_plan(requests, 4096, PLAN, more_off, [], 4096)
    leaning = plan.draws()
    think, nothink = plan.arms
    assert plan.requests_per_prompt == 6.0
    per_token = leaning.mean(leaning.work) / leaning.mean_tokens
    expected = (
        2 * think.per_prompt().mean() / think.speed + 4 * nothink.per_prompt().mean() / nothink.speed
    ) / (2 * think.per_prompt().mean() + 4 * nothink.per_prompt().mean())
    assert per_token == pytest.approx(expected) and per_token > 1.02
    wall = estimate_wall(leaning.work, 5000, 4, 32, rate, np.random.default_rng(0), weights=leaning.weights)
    # the steady part is the work at the full-batch rate, not the tokens
    assert wall.steady_s == pytest.approx(5000 * leaning.mean(leaning.work) / (4 * rate.tok_s(32)))


def test_an_unmeasured_arm_is_priced_by_assumption_or_said_to_be_a_guess():
    requests = _requests(np.random.default_rng(3)).filter(pl.col("arm") == "think")  # a plan-less benchmark's
    hot = [Arm(name="think", answers=2), Arm(name="hot", share=0.5, temperature=1.0)]
    plan = price_plan(requests.drop("arm"), 4096, [], hot, [], 4096)
    assert plan.arms[1].lengths_source == "the benchmark's (arm not measured)"
    assert any("arm hot" in n and "arm_assumptions" in n for n in plan.notes)
    assumed = [ArmAssumption(arm="hot", length_factor=0.25, accept_length=1.8)]
    plan = price_plan(requests.drop("arm"), 4096, [], hot, assumed, 4096)
    think, cold = plan.arms
    assert cold.per_prompt().mean() == pytest.approx(0.25 * think.per_prompt().mean())
    assert (cold.accept_source, cold.accept_length) == ("assumed", 1.8)
    assert cold.speed == pytest.approx(1.8 / plan.reference_accept)
    assert not any("arm hot" in n for n in plan.notes)
    # no plan: the benchmark's whole sample, drawn uniformly, as before the plan existed
    none = price_plan(requests, 4096, PLAN, [], [], 4096)
    assert none.requests_per_prompt == 1.0 and none.draws().weights is None
    assert any("measured a sampling plan" in n for n in none.notes)


def test_assumptions_must_name_an_arm_of_the_plan(tmp_path):
    (tmp_path / "results.parquet").write_bytes(b"")
    base = {"benchmark_dir": str(tmp_path), "sampling_plan": PLAN}
    with pytest.raises(ParameterError, match="not in sampling_plan: typo"):
        build_config(EstimateConfig, {**base, "arm_assumptions": [{"arm": "typo", "length_factor": 0.5}]})
    with pytest.raises(ParameterError, match="length_factor, accept_length or both"):
        build_config(EstimateConfig, {**base, "arm_assumptions": [{"arm": "nothink"}]})
    config = build_config(
        EstimateConfig, {**base, "arm_assumptions": [{"arm": "nothink", "accept_length": 3.0}]}
    )
    assert config.arm_assumptions[0].accept_length == 3.0


def test_generate_says_when_it_runs_another_plan_than_the_estimate_priced(tmp_path):
    values = {"servers": ["http://127.0.0.1:9"], "concurrency_per_server": 64, "max_tokens": 4096}
    estimate = tmp_path / "estimate.json"
    priced = {
        **{
            "aggregate_output_tok_s": 1.0,
            "wall_time_s": 1.0,
            "num_prompts": 1,
            "mean_completion_tokens": 1.0,
        },
        "servers": 1,
        "concurrency_per_server": 64,
        "max_tokens": 4096,
        "config": {"sampling_plan": PLAN},
    }
    estimate.write_text(json.dumps(priced))
    as_run = [
        Arm.model_validate(a).model_dump(mode="json") for a in PLAN
    ]  # unset fields as null, as a config
    assert report.estimate_assumptions(estimate, {**values, "sampling_plan": as_run}) == []
    notes = report.estimate_assumptions(estimate, {**values, "sampling_plan": []})
    assert len(notes) == 1 and "sampling plan" in notes[0] and "this run uses none" in notes[0]


# ----- end to end on the simulated fleet -------------------------------------------------------------------
PROMPTS = 64
CONCURRENCY = 8
MAX_TOKENS = 768


@pytest.mark.timing
def test_the_estimate_of_a_two_arm_plan_predicts_the_generate_run(sim_fleet, tmp_path):
    """benchmark → estimate → generate with the same two-arm plan (2 answers per prompt thinking at 0.6, and half
    the prompts once more with thinking off at 1.0), on one simulated B200+MTP fleet. As in
    tests/test_estimate_notebook.py, each side is put back on its simulator's clock (``clock_kept``) and the
    difference between the client's turnarounds is added to the 5%, so load on the machine moves neither."""
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=3.0)
    prompts = tmp_path / "prompts.jsonl"
    with open(BUNDLED_PROMPTS) as source:
        prompts.write_text("".join(line for _, line in zip(range(PROMPTS), source, strict=False)))
    common = {"prompts": str(prompts), "max_tokens": MAX_TOKENS, "turns": "last", "sampling_plan": PLAN}
    run = bench_estimate_generate(fleet, tmp_path, common, 40, CONCURRENCY, {"max_truncated_rate": 1.0})
    estimate, gen = run.estimate, run.gen
    kept_bench, kept_gen = run.kept_bench, run.kept_gen
    bench_turnaround, gen_turnaround = run.bench_turnaround, run.gen_turnaround
    manifest = json.loads((gen / "manifest.json").read_text())
    rows = pl.read_parquet(gen / "shards" / "*.parquet")

    # the plan's requests: 2 thinking answers per prompt and one more for about half of them
    assert rows.height == estimate["num_prompts"] == pytest.approx(PROMPTS * 2.5, rel=0.15)
    assert estimate["requests_per_prompt"] == pytest.approx(2.5)
    arms = {a["arm"]: a for a in estimate["arms"]}
    assert set(arms) == {"think", "nothink"}
    assert all(a["lengths_from"].startswith("measured") for a in arms.values())
    assert not any(re.search(r"\barm\b", note) for note in estimate["notes"])  # each measured as run
    for arm, row in arms.items():
        actual = rows.filter(pl.col("arm") == arm)
        assert row["mean_completion_tokens"] == pytest.approx(actual["completion_tokens"].mean(), rel=0.1), (
            arm
        )
        accept = actual["completion_tokens"].sum() / actual["spec_verify_ct"].sum()
        assert row["accept_length"] == pytest.approx(accept, rel=0.03), arm
    assert arms["nothink"]["mean_completion_tokens"] < 0.5 * arms["think"]["mean_completion_tokens"]
    assert arms["nothink"]["relative_speed"] < 1 < arms["think"]["relative_speed"]
    assert estimate["mean_completion_tokens"] == pytest.approx(rows["completion_tokens"].mean(), rel=0.05)

    # Each side on the clock its simulator kept, converted once: the estimate put each benchmark level on its own
    # recorded clock_kept already, and each generate session records its own (as tests/test_estimate_notebook.py).
    wall = sum(
        (s["ended_at"] - s["started_at"]) * s["clock_factor"] * s["clock_kept"] for s in manifest["sessions"]
    )
    planned, actual = estimate["wall_time_s"], wall
    margin = 0.05 + abs(gen_turnaround - bench_turnaround)
    measured = (estimate["wall_time_s"], wall, kept_bench, kept_gen, bench_turnaround, gen_turnaround)
    assert planned == pytest.approx(actual, rel=margin), measured
