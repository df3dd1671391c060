"""The sampling plan: deterministic samples per prompt id, each stored exactly once under ``{id}#s{k}`` through a
client SIGKILL + resume and a server kill, each arm sampled its own way; the plan is in the fingerprint."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import polars as pl
import pytest
from generate_helpers import generate_here, kill_client, start_client, wait_for_shards
from test_generate_notebook import base_params, valid_ids

from draftgen.generate import report
from draftgen.generate.config import GenerateConfig
from draftgen.generate.store import FingerprintMismatch, check_fingerprint
from draftgen.params import ParameterError, SamplingParams, build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.sampling_plan import Arm, arm_sampling, expected_answers, prompt_of, samples, takes
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import finalize_export, validate_generation
from draftgen.watch import monitor

TWO_ARMS = [
    {"name": "think", "answers": 2, "temperature": 0.6},
    {"name": "nothink", "share": 0.25, "enable_thinking": False, "temperature": 0.7, "max_tokens": 300},
]


def config(tmp_path, **values: object) -> GenerateConfig:
    base = {"servers": ["http://127.0.0.1:9"], "model": "m", "prompts": "synthetic", "out_dir": str(tmp_path)}
    return build_config(GenerateConfig, {**base, **values})


# ----- units ------------------------------------------------------------------------------------------------
def test_samples_are_the_plans_in_order_and_the_same_every_time():
    arms = [Arm.model_validate(a) for a in TWO_ARMS]
    ids = [f"p{i}" for i in range(4000)]
    plans = [samples(i, arms) for i in ids]
    assert plans == [samples(i, arms) for i in ids]  # deterministic: every node and resume agrees
    taken = sum(any(s.arm == "nothink" for s in plan) for plan in plans)
    assert 0.22 < taken / len(ids) < 0.28  # the share, by a keyed hash
    for prompt_id, plan in zip(ids, plans, strict=True):
        assert [s.arm for s in plan][:2] == ["think", "think"]
        assert [s.index for s in plan] == list(range(len(plan)))
        assert [s.id for s in plan] == [f"{prompt_id}#s{k}" for k in range(len(plan))]
        assert all(prompt_of(s.id) == prompt_id for s in plan)
        assert (len(plan) == 3) == takes(prompt_id, arms[1])
    assert expected_answers(arms) == pytest.approx(2.25)
    assert samples("p", []) == samples("p", []) and samples("p", [])[0].id == "p"  # no plan: the prompt's id
    assert prompt_of("a#b") == "a#b" and prompt_of("x#s12") == "x"


def test_an_arm_overrides_only_what_it_sets():
    base = SamplingParams()
    arm = Arm(name="off", enable_thinking=False, max_tokens=100)
    sampled = arm_sampling(base, arm)
    assert (sampled.enable_thinking, sampled.max_tokens) == (False, 100)
    assert (sampled.temperature, sampled.top_p) == (base.temperature, base.top_p)
    assert arm_sampling(base, None) is base


def test_bad_plans_are_refused_naming_the_parameter(tmp_path):
    for plan, needle in (
        ([{"name": "a"}, {"name": "a"}], "distinct"),
        ([{"name": "a", "share": 0}], "share"),
        ([{"name": "a b"}], "name"),
        ([{"name": "a", "temprature": 0.5}], "temprature"),
    ):
        with pytest.raises(ParameterError) as caught:
            config(tmp_path, sampling_plan=plan)
        assert "sampling_plan" in str(caught.value) and needle in str(caught.value)


def test_the_fingerprint_covers_the_plan_and_no_plan_is_todays(tmp_path):
    plain = config(tmp_path)
    planned = config(tmp_path, sampling_plan=TWO_ARMS)
    assert plain.fingerprint() != planned.fingerprint()
    # without a plan the hash is the one runs had before the plan existed (sampling_plan left out of it, and the
    # max_length cap, off without a tokenizer, likewise)
    fields = {k: v for k, v in plain.fingerprint_fields().items() if k not in ("sampling_plan", "length_cap")}
    import hashlib

    assert plain.fingerprint() == hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    manifest = {
        "fingerprint": planned.fingerprint(),
        "fingerprint_fields": planned.fingerprint_fields(),
        "counts": {"done": 5},
    }
    changed = config(tmp_path, sampling_plan=[{**TWO_ARMS[0], "answers": 3}, TWO_ARMS[1]])
    with pytest.raises(FingerprintMismatch) as caught:
        check_fingerprint(changed, manifest)
    assert "sampling_plan" in str(caught.value) and "'answers': 3" in str(caught.value)
    check_fingerprint(config(tmp_path, sampling_plan=TWO_ARMS), manifest)  # the same plan resumes


# ----- end to end -------------------------------------------------------------------------------------------
@pytest.mark.slow  # started first (tests/long_first.py)
def test_a_two_arm_plan_stores_every_planned_sample_once_through_a_sigkill_and_a_server_kill(
    sim_fleet, tmp_path, tokenizer_dir, tokenizer
):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(
        prompts, 80, seed=21
    )  # 180 samples: 100 stored (two shards) before the kills, 80 by the resume
    fleet = sim_fleet(servers=3, profile="b200-mtp", speed=20.0)
    params = base_params(
        fleet,
        prompts,
        batch_save_size=50,
        sampling_plan=TWO_ARMS,
        max_tokens=1024,
        max_truncated_rate=1.0,
        server_down_after=2,
        request_timeout_s=30.0,
    )
    arms = [Arm.model_validate(a) for a in TWO_ARMS]
    expected = {s.id: s for p in valid_ids(prompts) for s in samples(p, arms)}
    run_dir = tmp_path / "run"
    proc = start_client(run_dir, params)
    try:
        wait_for_shards(run_dir, 2, proc)
        fleet.kill(1)  # a server dies under the first session...
        time.sleep(0.5)
        kill_client(proc)  # ...then the client itself
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    fleet.restart(1)
    assert generate_here(run_dir, params).result.status == "complete"  # the resume

    rows = pl.read_parquet(sorted((run_dir / "shards").glob("part-*.parquet")))
    counts = Counter(rows["id"].to_list())
    assert max(counts.values()) == 1, "a sample was stored twice"
    assert set(counts) == set(expected), f"missing {len(set(expected) - set(counts))}"
    for row in rows.iter_rows(named=True):
        sample = expected[row["id"]]
        assert (row["prompt_id"], row["arm"], row["sample"]) == (sample.prompt_id, sample.arm, sample.index)
        if row["arm"] == "nothink":  # thinking off: no reasoning, and its own max_tokens
            assert not (row["reasoning_content"] or "").strip()
            assert max(row["turn_completion_tokens"]) <= 300
        else:
            assert max(row["turn_completion_tokens"]) <= 1024
    think = rows.filter(pl.col("arm") == "think").sort("id")
    by_prompt = think.group_by("prompt_id").agg(pl.col("reasoning_content").n_unique().alias("answers"))
    assert (by_prompt["answers"] == 2).all()  # two answers per prompt, two different draws
    lengths = (
        rows.explode("turn_completion_tokens").group_by("arm").agg(pl.col("turn_completion_tokens").mean())
    )
    mean = dict(zip(lengths["arm"], lengths["turn_completion_tokens"], strict=True))
    assert mean["nothink"] < 0.7 * mean["think"]  # thinking off answers are far shorter
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["fingerprint_fields"]["sampling_plan"][1]["name"] == "nothink"
    assert manifest["counts"]["done"] == len(expected)
    sessions = manifest["sessions"]  # the SIGKILLed session recorded nothing; the resume did the rest
    assert 0 < sessions[-1]["completed"] < len(expected)

    arms_table = report.acceptance_breakdowns(run_dir)["arm"]
    assert dict(zip(arms_table["arm"], arms_table["requests"], strict=True)) == {
        arm: rows.filter(pl.col("arm") == arm)["turn_completion_tokens"].list.len().sum()
        for arm in ("think", "nothink")
    }
    watched = monitor.acceptance_breakdowns(run_dir)["arm"]  # monitor shows the same, over the shards so far
    assert watched.equals(arms_table)

    # validate: every sample is expected, each arm checked by its own rule, whole prompts held out
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(run_dir),
            "tokenizer": str(tokenizer_dir),
            "out_dir": str(tmp_path / "validate"),
            "holdout_share": 0.2,
            "max_truncated_share": 1.0,
            "max_degenerate_share": 1.0,
        },
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    assert result.coverage.checked and result.coverage.missing == 0 and result.coverage.unexpected == 0
    records = result.records
    nothink = records.filter(
        pl.col("prompt_id").is_in([i for i, s in expected.items() if s.arm == "nothink"])
    )
    assert nothink.height > 0 and not nothink["empty_reasoning"].any()  # thinking off expects no reasoning
    assert not records["empty_reasoning"].any()
    assert not nothink["template_mismatch"].any()  # rendered with the trainer's template in that arm's mode
    export = finalize_export(result)
    info = json.loads((export / "dataset_info.json").read_text())  # the card's per-arm table matches the rows
    per_arm = {row["arm"]: row for row in info["arms"]}
    for arm in ("think", "nothink"):
        mine = records.filter(pl.col("arm") == arm)
        assert per_arm[arm]["rows"] == mine.height
        assert per_arm[arm]["exported"] == mine.filter(~pl.col("dropped") & ~pl.col("held_out")).height
        assert per_arm[arm]["generated_tokens"] == mine["generated_tokens"].sum()
    assert "## The sampling plan, per arm" in (export / "README.md").read_text()
    lines = [json.loads(x) for x in (export / "train.jsonl").read_text().splitlines()]
    assert len({x["id"] for x in lines}) == len(lines)  # one row per generated turn per sample, distinct ids
    assert {x["arm"] for x in lines} == {"think", "nothink"}
    held = {json.loads(x)["id"] for x in (export / "holdout" / "prompts.jsonl").read_text().splitlines()}
    assert held and held <= {s.prompt_id for s in expected.values()}  # the prompt's own ids, once each
    rows_out = lines + [json.loads(x) for x in (export / "prompts.jsonl").read_text().splitlines()]
    trained = {prompt_of(x["id"].rsplit("#", 1)[0] if x["id"].count("#") > 1 else x["id"]) for x in rows_out}
    assert not trained & held  # no sample of a held-out prompt trains
    assert trained | held == {s.prompt_id for s in expected.values()}
