"""The benchmark measures how often the target's answer at an agentic answer point diverges from the source's.

An agentic row is asked at one answer point its source followed with an assistant message, chosen by its id, with
the request generate sends there (the source's earlier answers standing in for the target's); its answer is compared
as generate compares it. Pinned here: the choice (deterministic, both kinds of point), the request (generate's own
when the target answered earlier turns as the source did), the comparison, the columns stored levels and
requests.parquet carry, and on the simulator the measured share following its ``tool_divergence_rate``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import polars as pl
import pytest
from bench_helpers import facts, record
from test_agentic_turns import SAME, TOOLS, parallel, result, target_call
from test_generate_multiturn import agent_loop

from draftgen.bench.answer_point import chosen_point, sent_point
from draftgen.bench.checkpoint import _level_from_json, level_identity
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.report import build_report
from draftgen.bench.run import run_benchmark
from draftgen.generate.turns import Conversation
from draftgen.params import build_config
from draftgen.prompts.rows import PromptRow
from draftgen.sim import SimFleet
from draftgen.training.tools import wire_messages

MODEL = "Qwen/Qwen3.6-27B"


def _row(row_id: str, messages=None, tools=TOOLS) -> PromptRow:  # type: ignore[no-untyped-def]
    return PromptRow(row_id, tuple(messages or parallel()), 1, tools=tools)


# ----- which point, and what is sent there -------------------------------------------------------------------------
def test_an_agentic_row_is_asked_at_one_compared_point_chosen_by_its_id():
    # parallel(): answer points 0 (the source called), 3 (it answered in text) and 5 (the end: nothing to compare)
    chosen = Counter(chosen_point(_row(f"r{i}")) for i in range(400))
    assert set(chosen) == {0, 3} and min(chosen.values()) > 150  # uniform between the two
    assert all(chosen_point(_row(f"r{i}")) == chosen_point(_row(f"r{i}")) for i in range(20))
    assert chosen_point(_row("plain", tools=None)) is None  # no tools: sent whole, as before
    whole = sent_point(_row("plain", tools=None))
    assert (whole.messages, whole.after, whole.source_called) == (tuple(parallel()), None, None)
    last_only = parallel()[:1]  # a single question: its one point is the end
    assert chosen_point(_row("q", last_only)) is None
    # turns: last, as generate sends it then: every row whole, nothing compared
    assert {chosen_point(_row(f"r{i}"), "last") for i in range(20)} == {None}
    assert sent_point(_row("r1"), "last").messages == tuple(parallel())


def test_the_request_at_a_point_is_generates_when_the_target_answered_earlier_turns_as_the_source():
    ids = {chosen_point(_row(f"r{i}")): f"r{i}" for i in range(20)}
    first, later = sent_point(_row(ids[0])), sent_point(_row(ids[3]))
    assert (first.after, first.source_called, later.after, later.source_called) == (0, True, 3, False)
    conversation = Conversation(_row("g"), "all")
    assert wire_messages(first.messages) == conversation.wire_request()
    # generate's second request once the target called what the source did, under the source's ids
    source_calls = [
        target_call(c["id"], c["function"]["name"], json.dumps(c["function"]["arguments"]))
        for c in parallel()[1]["tool_calls"]
    ]
    conversation.record(result("", source_calls, "tool_calls"), attempts=1)
    assert wire_messages(later.messages) == conversation.wire_request()
    assert "Sunny, ten o'clock." not in json.dumps(
        later.messages
    )  # the source's reply there is what is compared


def test_the_answer_is_compared_as_generate_compares_it():
    point = sent_point(_row(next(f"r{i}" for i in range(20) if chosen_point(_row(f"r{i}")) == 0)))
    assert point.diverged(parallel(), result("", SAME, "tool_calls")) is False  # same calls, another order
    rome = [target_call("t1", "get_weather", '{"city": "Rome", "unit": "C"}')]
    assert point.diverged(parallel(), result("", rome, "tool_calls")) is True
    assert point.diverged(parallel(), result("thinking cut", finish="length")) is True  # cut before its calls
    text = sent_point(_row(next(f"r{i}" for i in range(20) if chosen_point(_row(f"r{i}")) == 3)))
    assert text.diverged(parallel(), result("Sunny.")) is False
    assert (
        text.diverged(parallel(), result("", SAME, "tool_calls")) is True
    )  # called where the source wrote text
    assert sent_point(_row("plain", tools=None)).diverged(parallel(), result("x")) is None


def test_the_points_are_part_of_a_stored_levels_identity_and_old_levels_load(tmp_path):
    config = build_config(BenchmarkConfig, {"servers": ["http://127.0.0.1:9"], "model": MODEL})
    plain = [_row(f"p{i}", [{"role": "user", "content": "hi"}], tools=None) for i in range(3)]
    assert "answer_points" not in level_identity(facts(), config, 8, plain)  # older stored levels still match
    agentic = level_identity(facts(), config, 8, [*plain, _row("r1")])
    assert agentic["answer_points"] == [None, None, None, chosen_point(_row("r1"))]
    last = build_config(BenchmarkConfig, {"servers": ["http://127.0.0.1:9"], "model": MODEL, "turns": "last"})
    assert "answer_points" not in level_identity(facts(), last, 8, [*plain, _row("r1")])
    # a level stored before the columns existed reads back with them unknown
    stored = {
        k: v for k, v in record(0).__dict__.items() if k not in ("answer_point", "diverged", "source_called")
    }
    level = _level_from_json(
        {
            "server": "http://s",
            "gpu": 0,
            "concurrency": 8,
            "started_at": 0.0,
            "finished_at": 1.0,
            "requests": [{**stored, "chunk_offsets": list(stored["chunk_offsets"])}],
            "metrics_window": None,
            "metrics_note": None,
            "cumulative_accept_length": None,
            "client_lag_ms": [],
        }
    )
    assert (level.requests[0].answer_point, level.requests[0].diverged, level.requests[0].source_called) == (
        None,
        None,
        None,
    )


# ----- on the simulator ------------------------------------------------------------------------------------------
def _other(row: dict) -> dict:
    """The row with the source calling with another argument than the simulator's rule: it diverges at any rate."""
    messages = [dict(m) for m in row["messages"]]
    call = dict(messages[1]["tool_calls"][0])
    call["function"] = {**call["function"], "arguments": json.dumps({"topic": "something else"})}
    messages[1] = {**messages[1], "tool_calls": [call]}
    return {**row, "messages": messages}


RATES = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, sim_tokenizer_dir):  # type: ignore[no-untyped-def]
    """One benchmark on three instant servers diverging at 0, 0.5 and 1: its requests, and the rows' ids that
    the source called otherwise than the simulator's rule."""
    folder = tmp_path_factory.mktemp("bench-divergence")
    rows = [agent_loop(f"loop-{i:03d}", f"question {i} about tides", f"result {i}") for i in range(200)]
    others = {r["id"] for r in rows[::8]}
    rows = [_other(r) if r["id"] in others else r for r in rows]
    rows += [{"id": f"plain-{i}", "prompt": f"question {i} about the sea"} for i in range(30)]
    prompts = folder / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fleet = SimFleet(
        tokenizer=sim_tokenizer_dir,
        servers=len(RATES),
        profile="instant",
        per_server_faults={i: [f"tool_divergence_rate={rate}"] for i, rate in enumerate(RATES)},
        work_dir=folder / "sim",
    )
    fleet.start()
    try:
        config = build_config(
            BenchmarkConfig,
            {
                "servers": fleet.urls,
                "model": MODEL,
                "prompts": str(prompts),
                "out_dir": str(folder / "bench"),
                "warmup_requests": 0,
                "concurrencies": [16],
                "num_prompts": 76,
                "max_tokens": 1024,
                "category_field": "",
            },
        )
        report = build_report(asyncio.run(run_benchmark(config)))
    finally:
        fleet.cleanup()
    rate_of = {url: rate for url, rate in zip(fleet.urls, RATES, strict=True)}
    requests = report.requests.with_columns(
        pl.col("server").replace_strict(rate_of, return_dtype=pl.Float64).alias("rate")
    )
    return requests, others


def test_the_benchmark_records_the_point_its_kind_and_whether_the_answer_diverged(measured):
    requests, _ = measured
    assert requests["ok"].all() and requests.height == 3 * 76
    assert requests.schema["answer_point"] == pl.Int64 and requests.schema["diverged"] == pl.Boolean
    plain = requests.filter(pl.col("prompt_id").str.starts_with("plain"))
    agentic = requests.filter(pl.col("prompt_id").str.starts_with("loop"))
    assert plain.height > 0 and plain["answer_point"].is_null().all() and plain["diverged"].is_null().all()
    assert plain["source_called"].is_null().all()
    # agent_loop: the source calls after message 0, answers in text after message 2
    assert set(agentic["answer_point"].to_list()) == {0, 2}
    assert agentic["source_called"].to_list() == [p == 0 for p in agentic["answer_point"].to_list()]
    assert agentic["diverged"].is_not_null().all()
    # the simulator answers tool results in text, as the source did: a text point never diverges
    assert not agentic.filter(~pl.col("source_called"))["diverged"].any()


def test_the_measured_share_follows_the_simulators_divergence_rate(measured):
    requests, others = measured
    called = requests.filter(pl.col("source_called").fill_null(False))
    called = called.with_columns(pl.col("prompt_id").is_in(sorted(others)).alias("other"))
    at = {rate: called.filter(pl.col("rate") == rate) for rate in RATES}
    # rate 0: exactly the rows whose source called otherwise; rate 1: every one
    assert at[0.0]["diverged"].to_list() == at[0.0]["other"].to_list() and at[0.0]["other"].any()
    assert at[1.0]["diverged"].all()
    # rate 0.5: about half of the rows the rule matches (each a seeded draw of the simulator's)
    matching = at[0.5].filter(~pl.col("other"))
    assert matching.height >= 20
    assert 0.2 < matching["diverged"].mean() < 0.8  # type: ignore[operator]
