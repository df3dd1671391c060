"""Acceptance where it is low: the prompt row's category reaches the stored row, and the breakdowns by category,
output length and turn match the simulator's ground truth (its per-category acceptance)."""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

from draftgen.breakdown import breakdown, breakdowns, length_bucket
from draftgen.generate import GenerateConfig, generate, preflight, report
from draftgen.params import build_config
from draftgen.prompts.rows import PromptRow, iter_prompts, normalize_record, row_category
from draftgen.prompts.synthetic import BUNDLED_PROMPTS, LONG_CHAT
from draftgen.sim import categories
from draftgen.sim.profiles import B200_CATEGORY_ACCEPT_LENGTH, B200_MTP
from draftgen.sim.speculative import mean_accept_length
from draftgen.training.conversation import (
    Answer,
    generated_calls,
    request_messages,
    stored_messages,
    stored_tools,
)

MODEL = "Qwen/Qwen3.6-27B"


# ----- the prompt row's category ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("record", "field", "expected"),
    [
        ({"prompt": "q", "category": "code"}, None, "code"),
        ({"prompt": "q", "source": "sharegpt"}, None, "sharegpt"),
        ({"prompt": "q", "task_category": "math", "source": "magpie"}, None, "math"),
        ({"prompt": "q", "domain": 7}, None, "7"),
        ({"prompt": "q", "kind": "x", "category": "y"}, "kind", "x"),
        ({"prompt": "q", "category": "y"}, "kind", None),  # a named field replaces the common names
        ({"prompt": "q", "category": ["a", "b"]}, None, None),  # structured: no category, not a rejection
        ({"prompt": "q", "category": "  "}, None, None),
        ({"prompt": "q", "category": True}, None, None),
        ({"prompt": "q"}, None, None),
    ],
)
def test_the_category_comes_from_the_common_names_or_the_named_field(record, field, expected):
    assert row_category(record, field) == expected
    assert normalize_record(record, 1, category_field=field).category == expected


def test_a_long_category_is_cut_and_the_bundled_rows_keep_theirs(tmp_path):
    assert len(row_category({"category": "x" * 500}) or "") == 100
    rows = [r for r in iter_prompts(BUNDLED_PROMPTS) if hasattr(r, "category")]
    first = json.loads(BUNDLED_PROMPTS.read_text().splitlines()[0])
    assert rows[0].category == first["category"]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "q", "kind": "k"}) + "\n")
    assert next(iter_prompts(path, category_field="kind")).category == "k"


# ----- the simulator's ground truth ------------------------------------------------------------------------
def test_the_simulator_classifies_every_bundled_prompt_as_its_generator_labelled_it():
    """The generator's own kinds by their wording; its long chats (real sets' shape, ShareGPT rows among them) by
    the simulator's rules for what they are: a system prompt, several user turns, or one question."""
    long_chats = 0
    for row in iter_prompts(BUNDLED_PROMPTS, keep_duplicates=True):
        assert isinstance(row, PromptRow)
        found = categories.classify(row.messages, row.tools)
        if row.category != LONG_CHAT:
            assert found == row.category, row.id
            continue
        long_chats += 1
        roles = [m["role"] for m in row.messages]
        if "system" in roles:
            assert found == categories.SYSTEM, row.id
        elif roles.count("user") > 1:
            assert found == categories.MULTI_TURN, row.id
        else:
            assert found in (categories.CHAT, categories.CODE, categories.MATH, categories.LONG, None), row.id
    assert long_chats > 0
    assert categories.classify([{"role": "user", "content": "Say hi."}]) is None


def test_the_category_factors_give_the_profiles_lengths_at_its_launched_setting():
    probs = B200_MTP.position_probabilities()
    for category, length in B200_CATEGORY_ACCEPT_LENGTH.items():
        factor = categories.factor_of(B200_MTP.category_accept, category)
        assert mean_accept_length(categories.scaled(probs, factor)) == pytest.approx(length)
    assert categories.factor_of(B200_MTP.category_accept, None) == 1.0
    assert mean_accept_length(probs) == pytest.approx(B200_MTP.accept_mean)


def test_a_rendered_prompt_is_classified_like_its_messages():
    text = (
        "<|im_start|>system\nYou answer concisely.<|im_end|>\n<|im_start|>user\nWrite a Go function that x."
        "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert categories.classify_rendered(text) == "system"
    assert categories.classify_rendered(text.split("<|im_start|>user")[0].replace("system", "user")) is None
    assert categories.classify_rendered("<|im_start|>user\nWrite a Go function that x.<|im_end|>\n") == "code"


# ----- the breakdown itself --------------------------------------------------------------------------------
def _requests(rng: random.Random, groups: dict[str, float], n: int) -> pl.DataFrame:
    rows = []
    for category, length in groups.items():
        for _ in range(n):
            tokens = rng.randint(50, 3000)
            verify = max(1, round(tokens / (length * rng.uniform(0.9, 1.1))))
            rows.append(
                {
                    "category": category,
                    "completion_tokens": tokens,
                    "verify_ct": verify,
                    "latency_s": tokens / 80.0,
                    "turn": 0,
                }
            )
    return pl.DataFrame(rows)


def test_the_breakdown_is_the_ratio_of_sums_with_an_interval_that_holds_it():
    rng = random.Random(3)
    frame = _requests(rng, {"a": 3.0, "b": 4.0}, 400)
    table = breakdown(frame, "category")
    assert table["category"].to_list() == ["a", "b"]  # lowest acceptance first
    for row in table.iter_rows(named=True):
        group = frame.filter(pl.col("category") == row["category"])
        ratio = group["completion_tokens"].sum() / group["verify_ct"].sum()
        assert row["accept_length"] == pytest.approx(ratio, abs=1e-3)
        assert row["accept_length_low"] < ratio < row["accept_length_high"]
        assert row["requests"] == 400 and row["share"] == 0.5
        assert row["tok_s"] == pytest.approx(80.0, rel=1e-3)


def test_the_interval_covers_the_truth_about_95_percent_of_the_time():
    """Coverage of the delta-method interval over many independent small groups."""
    rng = random.Random(11)
    covered = 0
    trials = 400
    for _ in range(trials):
        rows = []
        for _ in range(60):
            steps = rng.randint(20, 400)
            tokens = sum(1 + (rng.random() < 0.8) + (rng.random() < 0.6) for _ in range(steps))
            rows.append({"category": "x", "completion_tokens": tokens, "verify_ct": steps})
        row = breakdown(pl.DataFrame(rows), "category").row(0, named=True)
        truth = 1 + 0.8 + 0.6
        covered += row["accept_length_low"] <= truth <= row["accept_length_high"]
    assert 0.91 <= covered / trials <= 0.99


def test_missing_verify_counts_come_from_acceptance_and_rows_without_a_category_are_grouped():
    frame = pl.DataFrame(
        {
            "category": [None, None, "c"],
            "completion_tokens": [300, 100, 90],
            "verify_ct": [None, 50, None],
            "accept_length": [3.0, None, None],
            "latency_s": [1.0, 1.0, None],
        }
    )
    table = breakdown(frame, "category").sort("category")
    none = table.filter(pl.col("category") == "(none)").row(0, named=True)
    assert none["accept_length"] == pytest.approx(400 / 150, abs=1e-3)
    assert none["requests"] == 2 and none["requests_with_acceptance"] == 2
    c = table.filter(pl.col("category") == "c").row(0, named=True)
    assert c["accept_length"] is None and c["requests"] == 1 and c["tok_s"] is None


def test_length_buckets_are_labelled_and_ordered():
    frame = pl.DataFrame(
        {"completion_tokens": [10, 256, 257, 5000, 70000], "verify_ct": [5, 100, 100, 2000, 9]}
    )
    labels = frame.select(length_bucket(pl.col("completion_tokens")).alias("b"))["b"].to_list()
    assert labels == ["≤256", "≤256", "257–512", "4097–8192", ">32768"]
    table = breakdown(frame, "length")
    assert table["output_tokens"].to_list() == ["≤256", "257–512", "4097–8192", ">32768"]
    assert set(breakdowns(frame)) == {"length"}


# ----- end to end on the simulated fleet -------------------------------------------------------------------
PROMPTS = 1000  # the bundled set's first 1,000: every category but "long" has over 100 generated turns
ENOUGH = 100  # turns a group needs for its acceptance to be checked: 2% is then many standard errors wide


def _run(fleet, out_dir: Path) -> None:
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": MODEL,
            "prompts": "synthetic",
            "limit": PROMPTS,
            "out_dir": str(out_dir),
            "max_tokens": 320,
            "concurrency_per_server": 48,
            "batch_save_size": 500,
            "max_truncated_rate": 1.0,
            "canary": False,
            "hedge_slow_ratio": 0.0,
            "acceptance_interval_s": 0.0,
        },
    )

    async def go():
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    asyncio.run(go())


def _truth_by_turn(fleet, rows: pl.DataFrame) -> list[tuple[str, int, int, float]]:
    """(row category, turn, completion tokens, the simulator's expected acceptance) for every stored turn: the
    request the turn sent, classified as the simulator classifies it, at the servers' own factors."""
    probs = B200_MTP.position_probabilities()
    out = []
    for row in rows.iter_rows(named=True):
        points = row["turn_after"]
        calls = generated_calls(row, len(points))
        for turn, tokens in enumerate(row["turn_completion_tokens"]):
            earlier = [
                (p, Answer(c, k))
                for p, c, k in zip(points[:turn], row["turn_content"][:turn], calls[:turn], strict=True)
            ]
            sent = request_messages(stored_messages(row), points[turn], earlier, row["turns_mode"])
            category = categories.classify(sent, stored_tools(row))
            factor = categories.factor_of(B200_MTP.category_accept, category)
            out.append((row["category"], turn, tokens, mean_accept_length(categories.scaled(probs, factor))))
    return out


def _expected(items: list[tuple[int, float]]) -> float:
    """The ratio estimator's limit for requests of these lengths and expected acceptance: Σ t / Σ (t / m)."""
    return sum(t for t, _ in items) / sum(t / m for t, m in items)


@pytest.mark.slow  # started first (tests/long_first.py)
def test_the_report_shows_acceptance_by_category_and_length_within_2_percent_of_the_simulators_truth(
    sim_fleet, tmp_path
):
    fleet = sim_fleet(servers=2, speed=40.0, profile="b200-mtp")
    out_dir = tmp_path / "run"
    _run(fleet, out_dir)
    tables = report.acceptance_breakdowns(out_dir)
    assert set(tables) == {"category", "length", "turn"}
    rows = pl.read_parquet(sorted((out_dir / "shards").glob("*.parquet")))
    assert rows["category"].null_count() == 0  # every bundled row's category reached its stored row
    truth = _truth_by_turn(fleet, rows)
    # the servers' own ground truth: each request's category and the acceptance it was drawn with
    probs = B200_MTP.position_probabilities()
    recorded = [r for r in fleet.truth() if r["kind"] == "chat" and r["outcome"] == "ok"]
    assert len(recorded) >= len(truth)
    for record in recorded:
        factor = categories.factor_of(B200_MTP.category_accept, record["category"])
        assert record["accept_expected"] == pytest.approx(
            mean_accept_length(categories.scaled(probs, factor))
        )
    assert {r["category"] for r in recorded} >= set(B200_CATEGORY_ACCEPT_LENGTH) - {"multi_turn"} | {"chat"}

    by_category: dict[str, list[tuple[int, float]]] = defaultdict(list)
    by_length: dict[str, list[tuple[int, float]]] = defaultdict(list)
    labels = (
        pl.Series([t for _, _, t, _ in truth])
        .to_frame("t")
        .select(length_bucket(pl.col("t")).alias("b"))["b"]
    )
    for (category, _, tokens, expected), label in zip(truth, labels, strict=True):
        by_category[category].append((tokens, expected))
        by_length[label].append((tokens, expected))
    checked = 0
    for row in tables["category"].iter_rows(named=True):
        items = by_category[row["category"]]
        assert row["requests"] == len(items)
        if len(items) >= ENOUGH:
            assert row["accept_length"] == pytest.approx(_expected(items), rel=0.02), row
            assert row["accept_length_low"] < row["accept_length"] < row["accept_length_high"]
            checked += 1
    assert checked >= 6
    # the categories really differ: code's acceptance is well above long notes' (so 2% is a real check)
    accept = dict(zip(tables["category"]["category"], tables["category"]["accept_length"], strict=True))
    assert accept["code"] - accept["long"] > 0.5
    for row in tables["length"].iter_rows(named=True):
        items = by_length[row["output_tokens"]]
        assert row["requests"] == len(items)
        if len(items) >= ENOUGH:
            assert row["accept_length"] == pytest.approx(_expected(items), rel=0.02), row
    assert tables["turn"]["requests"].sum() == len(truth)
    assert all(math.isfinite(v) and v > 0 for v in tables["category"]["tok_s"].drop_nulls())

    for plot in (report.plot_acceptance_by_category(out_dir), report.plot_acceptance_by_length(out_dir)):
        assert plot.path is not None and plot.path.stat().st_size > 0
