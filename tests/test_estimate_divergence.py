"""The estimate prices the agentic conversations generate ends early: where the target's answer diverges from the
source's, as often as the benchmark measured it (``diverged`` by the kind of the source's reply).

Hand-made inputs and no servers, as in test_estimate_later_turns: the shares and their fallbacks, the turn budgets
ending a conversation at its first compared point (or never), the benchmark columns read (or absent), and the
estimate's planned requests falling with a measured divergence.
"""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pytest
from test_estimate_later_turns import CAP, CHAT, _benchmark, small_fleet_values

from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.inputs import load_benchmark, measured_answers, measured_divergence
from draftgen.estimate.plan import Estimate, run_estimate
from draftgen.estimate.report import estimate_json
from draftgen.params import build_config
from draftgen.prompts.answer_lengths import AnswerLengths
from draftgen.prompts.audit_report import AuditReport, findings
from draftgen.prompts.divergence import MIN_KIND_REQUESTS, DivergenceShares
from draftgen.prompts.turn_budgets import CAPPED, DIVERGED, _Prompts, classify, turn_budgets

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
# points 0 (the source called), 2 (it answered the result in text) and 4 (the end: nothing compared)
AGENT = [
    {"role": "user", "content": "u" * 100},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "r" * 50},
    {"role": "assistant", "content": "a" * 10},
    {"role": "user", "content": "u" * 100},
]


def _shares(called: float, text: float, n: int = 20) -> DivergenceShares:
    return DivergenceShares(round(called * n), n, round(text * n), n, "test")


def _names(messages, shares: DivergenceShares | None, tools=TOOLS) -> list[str]:  # type: ignore[no-untyped-def]
    prompts = _Prompts(messages, CAP, True, "all", tools, drawn=True)
    rng = np.random.default_rng(0)
    diverges = shares.drawer(rng) if shares is not None else None
    return [c.name for c in classify(prompts, CAP, 950, lambda: (200, 20), diverges)]


# ----- the shares ------------------------------------------------------------------------------------------------
def test_each_kind_has_its_share_a_rare_kind_the_pooled_one_and_none_compared_none():
    shares = DivergenceShares.of([True] * 20 + [False] * 30, [True] * 5 + [False] * 15 + [False] * 30, "b")
    assert (shares.share(True), shares.share(False)) == (0.25, 0.0)
    assert "25.0% where the source called tools (5 of 20)" in shares.note and "(0 of 30)" in shares.note
    rare = DivergenceShares.of(
        [True] * 20 + [False] * (MIN_KIND_REQUESTS - 1), [True] * 10 + [False] * 19, "b"
    )
    assert rare.share(True) == 0.5 and rare.share(False) == pytest.approx(10 / 29)  # the pooled share
    assert "both kinds' share" in rare.note
    nothing = DivergenceShares.of([], [], "b")
    assert nothing.share(True) == 0.0 and "no agentic answer was compared" in nothing.note


# ----- the turn budgets ----------------------------------------------------------------------------------------
def test_a_share_of_one_ends_every_agentic_conversation_after_its_first_compared_point():
    assert _names(AGENT, None) == [CAPPED, CAPPED, CAPPED]
    assert _names(AGENT, _shares(1.0, 1.0)) == [CAPPED, DIVERGED, DIVERGED]  # the source called at point 0
    assert _names(AGENT, _shares(0.0, 1.0)) == [
        CAPPED,
        CAPPED,
        DIVERGED,
    ]  # ...and answered in text at point 2
    assert _names(AGENT, _shares(0.0, 0.0)) == [CAPPED, CAPPED, CAPPED]
    # no tools: generate compares nothing, so nothing diverges whatever the share
    assert _names(AGENT, _shares(1.0, 1.0), tools=None) == [CAPPED, CAPPED, CAPPED]
    assert _names(CHAT, _shares(1.0, 1.0), tools=None) == [CAPPED, CAPPED, CAPPED]


def test_turn_budgets_count_the_diverged_points_as_not_sent_and_a_share_of_zero_changes_nothing():
    conversations = [(AGENT, TOOLS, None), (CHAT, None, None)]
    lengths = AnswerLengths.of([200, 300], [20, 30], [None, None], "test")
    plain = turn_budgets(conversations, CAP, 950, True, "all", 2, answers=lengths, draws=4)
    zero = turn_budgets(
        conversations,
        CAP,
        950,
        True,
        "all",
        2,
        answers=AnswerLengths.of([200, 300], [20, 30], [None, None], "test", _shares(0.0, 0.0)),
        draws=4,
    )
    assert zero.by_class == plain.by_class and zero.conversation_rooms == plain.conversation_rooms
    assert plain.sent_per_conversation == 3.0
    every = turn_budgets(
        conversations,
        CAP,
        950,
        True,
        "all",
        2,
        answers=AnswerLengths.of([200, 300], [20, 30], [None, None], "test", _shares(1.0, 0.0)),
        draws=4,
    )
    assert every.by_class[DIVERGED] == 2 * 4 and every.sent == 4 * (1 + 3)
    assert every.sent_per_conversation == 2.0 and every.sent_turns == {1: 4, 3: 4}
    assert {len(r) for r in every.conversation_rooms} == {1, 3}
    assert "100.0% where the source called tools (20 of 20)" in every.note


# ----- the benchmark's columns ----------------------------------------------------------------------------------
def test_the_estimate_reads_the_benchmarks_comparisons_leaving_cut_answers_out():
    requests = pl.DataFrame(
        {
            "ok": [True, True, True, True, False, True],
            "finish_reason": ["tool_calls", "stop", "length", "stop", None, "stop"],
            "diverged": [True, False, True, False, None, None],
            "source_called": [True, True, True, False, None, None],
        }
    )
    shares = measured_divergence(requests)
    assert shares is not None and (
        shares.called_diverged,
        shares.called,
        shares.text_diverged,
        shares.text,
    ) == (
        1,
        2,
        0,
        1,
    )
    assert measured_divergence(requests.drop("diverged", "source_called")) is None  # an older benchmark
    assert measured_divergence(requests.with_columns(pl.lit(None, pl.Boolean).alias("diverged"))) is None


# ----- end to end --------------------------------------------------------------------------------------------------
def _with_divergence(folder, called_share: float) -> None:
    """Give the benchmark folder's 40 requests a comparison: 20 where the source called (``called_share`` of them
    diverged), 20 where it answered in text (none diverged)."""
    path = folder / "requests.parquet"
    requests = pl.read_parquet(path)
    called = [i < 20 for i in range(requests.height)]
    diverged = [i < round(20 * called_share) for i in range(requests.height)]
    requests.with_columns(
        pl.Series("answer_point", [0 if c else 2 for c in called], pl.Int64),
        pl.Series("source_called", called),
        pl.Series("diverged", diverged),
        pl.lit("stop").alias("finish_reason"),
    ).write_parquet(path)


def test_the_estimate_plans_fewer_requests_when_the_benchmark_measured_divergence(tmp_path, tokenizer_dir):
    """Agentic conversations of three answer points: priced with a benchmark that compared no answer, every point is
    sent; with one whose target diverged at every call, each ends after its first; at half of them, in between."""
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a topic up.",
            "parameters": {"type": "object", "properties": {"topic": {"type": "string"}}},
        },
    }
    rows = []
    for i in range(30):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"topic": "tides"}'},
        }
        rows.append(
            {
                "id": f"a{i}",
                "tools": [tool],
                "messages": [
                    {"role": "user", "content": f"{i}: look up tides for me, please."},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": "High tide at noon."},
                    {"role": "assistant", "content": "High tide is at noon."},
                    {"role": "user", "content": "And low tide?"},
                ],
            }
        )
    prompts = tmp_path / "agents.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    values = {**small_fleet_values(prompts, tokenizer_dir, train_max_length=4096), "turns": "all"}

    def planned(called_share: float | None) -> Estimate:
        folder = _benchmark(tmp_path / f"s{called_share}", 0.1)
        if called_share is not None:
            _with_divergence(folder, called_share)
        return run_estimate(build_config(EstimateConfig, {**values, "benchmark_dir": str(folder)}))

    for sub in ("sNone", "s1.0", "s0.5"):
        (tmp_path / sub).mkdir()
    older = planned(None)
    assert older.num_prompts == 90  # 30 conversations x 3 points: an older benchmark prices no divergence
    every = planned(1.0)
    assert every.num_prompts == 30  # every one ends after its first answer
    assert estimate_json(every)["num_prompts"] == 30
    assert 30 < planned(0.5).num_prompts < 90
    shown = str(AuditReport(every.audit))
    assert "about 30 after the turns set aside or after a conversation ended" in shown
    assert re.search(r"not sent: the target's calls were not the source's +60\.0 +66\.7%", shown)
    budgets = next(f for f in findings(every.audit) if f.check == "turn budgets")
    assert "66.7% not sent (an earlier answer's calls were not the source's)" in budgets.detail
    answers = measured_answers(load_benchmark(tmp_path / "s1.0" / "bench-0.1"))
    assert answers is not None and answers.divergence is not None
    assert "100.0% where the source called tools (20 of 20)" in answers.note
