"""A real prompt set's shape under the production parameters: long multi-turn conversations with pasted context,
where the trainer's max_length leaves a long conversation's later turns little room and most of them end at it.

Those cuts are the trainer's own, by design: the garbage guard must not halt on them and validate must publish the
export, counting them apart ("cut at max_length (expected)"). A run whose answers really are cut by max_tokens
still halts, and its data still fails validate. ``params/b200x7.yaml``'s values, the generator's long-chat shape
(draftgen.prompts.long_chat), the simulated fleet's own tokenizer as ``tokenizer``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest

from draftgen.defaults import CONCURRENCY_PER_SERVER
from draftgen.generate import GenerateConfig, GuardTripped, generate, preflight
from draftgen.generate.guard import Guard, GuardSettings
from draftgen.generate.length_cap import SET_ASIDE
from draftgen.params import build_config, load_params_files
from draftgen.prompts.long_chat import long_chat_rows
from draftgen.prompts.synthetic import write_rows
from draftgen.prompts.turn_budgets import TurnBudgets
from draftgen.runner import REPO_ROOT
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import (
    ValidationGateError,
    finalize_export,
    require_fit_to_train,
    validate_generation,
)

pytestmark = pytest.mark.slow(2)  # as long as two long tests together (tests/long_first.py)

CONVERSATIONS = 36  # 331 answer points: 227 turns generated, 99 of them cut at max_length (deterministic)


@pytest.fixture(scope="module")
def long_chats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("long-chat") / "prompts.jsonl"
    write_rows(path, long_chat_rows(CONVERSATIONS, seed=5))
    return path


def _production(
    fleet_urls: list[str], prompts: Path, out: Path, tokenizer: Path, **changes: object
) -> GenerateConfig:
    """params/b200x7.yaml as it is (max_tokens 4096, temperature 0.6, top_p 0.95, thinking on, turns all, 64 in flight
    per server, shards of 500), on the simulated fleet, with the tokenizer that caps each turn."""
    production = load_params_files([REPO_ROOT / "params" / "b200x7.yaml"])
    values = {
        **production,
        "servers": fleet_urls,
        "prompts": str(prompts),
        "out_dir": str(out),
        "tokenizer": str(tokenizer),
        "canary": False,
        **changes,
    }
    return build_config(GenerateConfig, values)


def _run(config: GenerateConfig):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    return asyncio.run(go())


def _validate(generation: Path, tokenizer: Path, out: Path):  # type: ignore[no-untyped-def]
    config = build_config(
        ValidateConfig, {"generation_dir": str(generation), "tokenizer": str(tokenizer), "out_dir": str(out)}
    )
    return validate_generation(config, progress=False)


def test_the_trainers_cut_on_long_conversations_neither_halts_the_run_nor_fails_validate(
    sim_fleet, sim_tokenizer_dir, long_chats, tmp_path
):
    # the B200 profile's answer lengths; the batch cap serve starts SGLang with, which the production concurrency needs
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=50.0, max_running_requests=CONCURRENCY_PER_SERVER)
    config = _production(fleet.urls, long_chats, tmp_path / "run", sim_tokenizer_dir)
    assert (config.max_tokens, config.train_max_length, config.concurrency_per_server) == (4096, 4096, 64)
    result = _run(config)
    assert result.status == "complete", result
    rows = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet").sort("started_at")
    turns = rows.select(
        "id",
        pl.col("turn_finish_reason").alias("finish"),
        pl.col("turn_budget_by").alias("by"),
        pl.col("turn_content").alias("content"),
        pl.col("turn_reasoning").alias("reasoning"),
    ).explode("finish", "by", "content", "reasoning")
    cut_by_design = turns.filter((pl.col("finish") == "length") & (pl.col("by") == "max_length")).height
    assert turns.height >= 200 and cut_by_design / turns.height > 0.3, (cut_by_design, turns.height)
    assert turns.filter((pl.col("finish") == "length") & (pl.col("by") == "max_tokens")).height == 0
    assert (rows["turns_set_aside"] > 0).any(), "no conversation reached the floor: the set is too short"
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["guard"]["totals"]["cut_at_max_length"] == cut_by_design
    assert progress["guard"]["totals"]["truncated"] == 0

    # The test tests something: the same turns, in the order their conversations started, halt a guard that
    # counts every cut as a cut by max_tokens (at a threshold under the share cut here) — and the guard as it is,
    # at that threshold, lets them through.
    threshold = 0.25
    assert cut_by_design / turns.height > threshold + 0.05

    def replay(by: str | None) -> None:
        guard = Guard(GuardSettings(max_rates={**GuardSettings().max_rates, "truncated": threshold}))
        for turn in turns.iter_rows(named=True):
            guard.observe(
                id=turn["id"],
                server="s",
                content=turn["content"],
                reasoning=turn["reasoning"],
                finish_reason=turn["finish"],
                budget_by=by or turn["by"],
            )

    with pytest.raises(GuardTripped, match="cut by max_tokens"):
        replay("max_tokens")
    replay(None)

    checked = _validate(tmp_path / "run", sim_tokenizer_dir, tmp_path / "validate")
    at_length = checked.counts["cut_at_max_length"]
    assert checked.passed and checked.counts["length_limited"] == 0 and at_length["rows"] >= cut_by_design
    line = require_fit_to_train(checked)
    assert "cut at the trainer's max_length (expected" in line
    export = finalize_export(checked)
    assert (export / "prompts.jsonl").exists()
    # the card counts what generate set aside, by why, from the stored rows and rejected.parquet
    aside = json.loads((export / "dataset_info.json").read_text())["set_aside"]
    turns_by = rows.group_by("turns_set_aside_by").agg(pl.col("turns_set_aside").sum()).drop_nulls()
    assert {why: counts["turns"] for why, counts in aside["by"].items() if counts["turns"]} == dict(
        turns_by.iter_rows()
    )
    rejected = pl.read_parquet(tmp_path / "run" / "rejected.parquet")["reason"].to_list()
    assert sum(c["prompts"] for c in aside["by"].values()) == sum(r.startswith(SET_ASIDE) for r in rejected)
    assert aside["min_turn_budget"] == 512 and "set aside by generate" in (export / "README.md").read_text()


def test_answers_cut_by_max_tokens_still_halt_the_run_and_fail_validate(
    sim_fleet, sim_tokenizer_dir, long_chats, tmp_path
):
    # max_tokens 48: far below any turn's room, so every cut is by max_tokens (thinking runs past 48 tokens).
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=50.0, max_running_requests=CONCURRENCY_PER_SERVER)
    config = _production(fleet.urls, long_chats, tmp_path / "run", sim_tokenizer_dir, max_tokens=48)
    with pytest.raises(GuardTripped) as halted:
        _run(config)
    report = halted.value.report
    assert report.defect == "truncated" and "cut by max_tokens" in report.text()
    assert "Raise max_tokens" in report.text()
    rows = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet")
    assert set(rows["turn_budget_by"].explode().drop_nulls()) == {"max_tokens"}

    checked = _validate(tmp_path / "run", sim_tokenizer_dir, tmp_path / "validate")
    assert not checked.passed and checked.counts["cut_at_max_length"]["rows"] == 0
    with pytest.raises(ValidationGateError, match="cut by max_tokens") as failed:
        require_fit_to_train(checked)
    assert "raise max_tokens" in str(failed.value)


# ----- predicted before a request is sent -----------------------------------------------------------------------
def test_expected_cuts_are_the_completions_longer_than_each_capped_turns_room():
    budgets = TurnBudgets(
        tokenizer="t",
        max_length=4096,
        min_turn_budget=0,
        max_tokens=4096,
        conversations=1,
        of_conversations=1,
        capped_rooms=(100, 1000, 5000),
    )
    lengths = [20.0 * q for q in range(101)]  # completions spread evenly over 0..2,000 tokens
    assert budgets.expected_cuts(lengths) == pytest.approx(0.95 + 0.5 + 0.0)
    assert budgets.expected_cuts([]) == 0.0


def test_preflight_predicts_the_caps_cuts_from_the_prompts_and_the_estimates_lengths(
    instant_fleet, sim_tokenizer_dir, long_chats, tmp_path
):
    fleet = instant_fleet()
    estimate = tmp_path / "estimate.json"
    estimate.write_text(
        json.dumps(
            {
                "aggregate_output_tok_s": 1000.0,
                "wall_time_s": 100.0,
                "num_prompts": CONVERSATIONS,
                "servers": 1,
                "concurrency_per_server": 64,
                "max_tokens": 4096,
                "mean_completion_tokens": 1500.0,
                "completion_tokens_percentiles": [40.0 * q for q in range(101)],  # 0..4,000 tokens
            }
        )
    )
    checks = {}
    for name, extra in (("without", {}), ("with", {"estimate": str(estimate)})):
        config = _production(fleet.urls, long_chats, tmp_path / name, sim_tokenizer_dir, **extra)
        plan = asyncio.run(preflight(config))
        plan.release()
        [checks[name]] = [c for c in plan.checks if c.check == "audit: cut prediction"]
    assert checks["without"].status == "info" and "each may end at the cap" in checks["without"].detail
    predicted = checks["with"].detail
    assert "from the estimate's completion lengths about" in predicted and "will end at the cap" in predicted
    assert "never count against max_truncated_rate" in predicted
