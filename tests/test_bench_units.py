"""Benchmark pieces without servers: token and acceptance sources, occupancy, the knee, config, sampling."""

from __future__ import annotations

import json

import polars as pl
import pytest
from bench_helpers import URL, facts, record

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.occupancy import level_occupancy, occupancy_frame
from draftgen.bench.records import LevelRun
from draftgen.bench.report import find_knee, measurement_warnings, recommend
from draftgen.bench.sample import sample_prompts
from draftgen.bench.stats import level_acceptance, level_row, request_rows, resolve_request_tokens
from draftgen.client.metrics import CounterWindow
from draftgen.params import ParameterError, build_config


def level(requests, window: CounterWindow | None = None, note: str | None = None) -> LevelRun:
    return LevelRun(
        server=URL,
        gpu=0,
        concurrency=2,
        started_at=100.0,
        finished_at=110.0,
        requests=tuple(requests),
        metrics_window=window,
        metrics_note=note,
        cumulative_accept_length=3.0,
        client_lag_ms=(0.1, 0.2),
    )


def window(tokens: float, verifies: float | None = None) -> CounterWindow:
    deltas = {"sglang:generation_tokens_total": tokens}
    if verifies is not None:
        deltas["sglang:spec_verify_calls_total"] = verifies
    return CounterWindow(seconds=10.0, deltas=deltas)


# ----- where tokens come from -------------------------------------------------------------------------------
def test_tokens_prefer_usage_then_sglext():
    run = level([record(0), record(1, usage_reported=False, completion_tokens=None)], window(999.0))
    tokens = resolve_request_tokens(run)
    assert (tokens[0].tokens, tokens[0].source) == (40.0, "usage")
    assert (tokens[1].tokens, tokens[1].source) == (40.0, "sglext")  # 4.0 x 10 verify steps


def test_without_usage_or_sglext_the_metrics_difference_is_shared_by_text_length():
    bare = {
        "usage_reported": False,
        "completion_tokens": None,
        "spec_accept_length": None,
        "spec_verify_ct": None,
    }
    run = level(
        [
            record(0, **bare, reasoning_chars=300, content_chars=0),
            record(1, **bare, reasoning_chars=100, content_chars=0),
        ],
        window(200.0),
    )
    tokens = resolve_request_tokens(run)
    assert [t.source for t in tokens] == ["metrics", "metrics"]
    assert [t.tokens for t in tokens] == pytest.approx([150.0, 50.0])
    row = level_row(run, facts(sglext=False), request_rows(run, facts(), 4096), 4096)
    assert row["output_tokens"] == 200.0
    assert row["output_tokens_source"].startswith("metrics")
    assert "usage" in row["missing"]


def test_without_any_count_the_chunks_are_a_stated_lower_bound():
    bare = {
        "usage_reported": False,
        "completion_tokens": None,
        "spec_accept_length": None,
        "spec_verify_ct": None,
    }
    run = level([record(0, **bare)], None, note="server has no /metrics")
    tokens = resolve_request_tokens(run)
    assert (tokens[0].tokens, tokens[0].source) == (4.0, "chunks")
    row = level_row(run, facts(sglext=False, metrics=False), request_rows(run, facts(), 4096), 4096)
    assert row["output_tokens_source"] == "chunks"
    assert "server has no /metrics" in row["missing"]


def test_failed_requests_count_no_tokens_but_keep_their_time():
    run = level([record(0), record(1, ok=False, error="timeout", completion_tokens=None, chunk_offsets=())])
    row = level_row(run, facts(), request_rows(run, facts(), 4096), 4096)
    assert (row["ok"], row["failed"], row["output_tokens"]) == (1, 1, 40.0)
    assert row["window_s"] == pytest.approx(3.0)  # 100.0 → 103.0 (the failed one ran 101 → 103)


# ----- where acceptance comes from --------------------------------------------------------------------------
def test_acceptance_prefers_sglext_over_the_counters():
    run = level([record(0), record(1, completion_tokens=30)], window(70.0, 35.0))
    value, source = level_acceptance(run, resolve_request_tokens(run), facts())
    assert (value, source) == (pytest.approx(70.0 / 20.0), "sglext")


def test_acceptance_from_counters_when_responses_carry_none():
    old = {"spec_accept_length": None, "spec_verify_ct": None}
    run = level([record(0, **old), record(1, **old)], window(80.0, 25.0))
    value, source = level_acceptance(run, resolve_request_tokens(run), facts(sglext=False))
    assert value == pytest.approx(3.2)
    assert source.startswith("metrics")
    row = level_row(run, facts(sglext=False), request_rows(run, facts(), 4096), 4096)
    assert "per-request acceptance" in row["missing"]
    assert row["server_info_cumulative_accept_length"] == 3.0  # kept for reference, never used


def test_no_speculation_reads_as_one_and_unknown_reads_as_missing():
    old = {"spec_accept_length": None, "spec_verify_ct": None}
    run = level([record(0, **old)], window(40.0))
    value, source = level_acceptance(run, resolve_request_tokens(run), facts(sglext=False, speculation=False))
    assert (value, source.split(" (")[0]) == (1.0, "no speculation")
    value, source = level_acceptance(run, resolve_request_tokens(run), facts(sglext=False, speculation=None))
    assert value is None
    assert source.startswith("missing") and "sglext" in source


def test_a_stream_without_done_is_reported():
    run = level([record(0, done_sentinel=False)])
    row = level_row(run, facts(), request_rows(run, facts(), 4096), 4096)
    assert "[DONE]" in row["missing"]


def test_truncation_and_empty_answers_are_flagged_per_request():
    run = level(
        [
            record(0, finish_reason="length", content_chars=0, content_blank=True),
            record(1, finish_reason="stop", content_chars=0, content_blank=True),
            record(2),
        ]
    )
    rows = request_rows(run, facts(), 4096)
    assert [r["truncated"] for r in rows] == [True, False, False]
    assert [r["empty_answer"] for r in rows] == [False, True, False]


# ----- occupancy ----------------------------------------------------------------------------------------------
def test_occupancy_counts_seconds_and_tokens_at_each_in_flight_count():
    rows = [
        # 0 → 4 s, 8 tokens in chunks at 1, 2, 3, 4 s
        {
            "ok": True,
            "started_at": 0.0,
            "e2e_s": 4.0,
            "ttft_s": 1.0,
            "chunk_offsets": [1.0, 2.0, 3.0, 4.0],
            "completion_tokens": 8,
        },
        # 2 → 3 s, 6 tokens in chunks at 2.5 and 3.0 s
        {
            "ok": True,
            "started_at": 2.0,
            "e2e_s": 1.0,
            "ttft_s": 0.5,
            "chunk_offsets": [0.5, 1.0],
            "completion_tokens": 6,
        },
    ]
    occupancy = level_occupancy(rows)
    assert occupancy[1] == (
        pytest.approx(3.0),
        pytest.approx(2.0 + 2.0 + 2.0),
    )  # chunks at 1, 2 and 4 s (A alone)
    assert occupancy[2] == (pytest.approx(1.0), pytest.approx(2.0 + 3.0 + 3.0))  # 2.5 s, and 3.0 s from both


def test_occupancy_frame_has_one_row_per_server_level_and_count():
    requests = pl.DataFrame(
        [
            {
                "server": URL,
                "gpu": 0,
                "concurrency": 1,
                "ok": True,
                "started_at": 0.0,
                "e2e_s": 1.0,
                "ttft_s": 0.1,
                "chunk_offsets": [0.5, 1.0],
                "completion_tokens": 4,
            },
            {
                "server": URL,
                "gpu": 0,
                "concurrency": 1,
                "ok": True,
                "started_at": 1.0,
                "e2e_s": 1.0,
                "ttft_s": 0.1,
                "chunk_offsets": [],
                "completion_tokens": 4,
            },
        ]
    )
    frame = occupancy_frame(requests)
    assert frame.select("in_flight", "seconds", "tokens").rows() == [
        (1, pytest.approx(2.0), pytest.approx(8.0))
    ]


# ----- the knee ---------------------------------------------------------------------------------------------
def test_knee_is_the_least_level_reaching_the_fraction_of_the_best():
    levels = [1, 8, 16, 32, 48, 64]
    tok_s = [250.0, 1140.0, 1550.0, 1880.0, 2030.0, 2040.0]
    assert find_knee(levels, tok_s, 0.95)[:1] == (48,)
    assert find_knee(levels, tok_s, 0.90)[:1] == (32,)
    with pytest.raises(ValueError, match="every request failed"):
        find_knee([1], [None], 0.95)


def test_recommendation_names_the_batch_cap():
    fleet = pl.DataFrame(
        {"concurrency": [8, 32, 64, 128], "per_server_tok_s_mean": [1000.0, 1500.0, 1980.0, 2000.0]}
    )
    rec = recommend(fleet, (facts(max_running_requests=48),), 0.95)
    assert rec.concurrency_per_server == 64
    assert "above max_running_requests=48" in rec.reason
    rec = recommend(fleet, (facts(max_running_requests=None),), 0.95)
    assert rec.max_running_requests is None and "unknown" in rec.reason


# ----- config and prompt sample ----------------------------------------------------------------------------
def test_config_rejects_every_bad_value_at_once(tmp_path):
    with pytest.raises(ParameterError) as caught:
        build_config(
            BenchmarkConfig,
            {
                "servers": ["http://a:1"],
                "model": "m",
                "concurrencies": [8, 8, 0],
                "prompts": str(tmp_path / "missing.jsonl"),
                "knee_fraction": 1.5,
                "num_prompt": 3,
            },
        )
    names = {name.split(".")[0] for name, _ in caught.value.problems}
    assert names >= {"concurrencies", "prompts", "knee_fraction", "num_prompt"}


def test_config_treats_empty_literals_as_unset_and_sorts_levels():
    config = build_config(
        BenchmarkConfig,
        {
            "servers": ["http://a:1"],
            "model": "m",
            "api_key_env": "",
            "top_k": 0,
            "min_p": 0.0,
            "concurrencies": [64, 1, 8],
        },
    )
    assert (config.api_key_env, config.top_k, config.min_p) == (None, None, None)
    assert config.concurrencies == [1, 8, 64]


def test_prompt_sample_is_seeded_skips_bad_rows_and_wraps(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [json.dumps({"id": f"r{i}", "prompt": f"question {i}"}) for i in range(10)] + ["{not json"]
    path.write_text("\n".join(rows) + "\n")
    first = sample_prompts(path, 4, seed=1)
    assert [r.id for r in first.rows] == [r.id for r in sample_prompts(path, 4, seed=1).rows]
    assert (len(first.rows), first.rows_read, first.rejected) == (4, 10, 1)
    everything = sample_prompts(path, 50, seed=0)
    assert len(everything.rows) == 10
    assert [r.id for r in everything.slice(8, 4)] == [r.id for r in everything.rows[8:]] + [
        r.id for r in everything.rows[:2]
    ]


def test_warnings_name_a_busy_client_failures_and_a_missing_steady_phase():
    run = level(
        [record(0), record(1, ok=False, error="timeout", completion_tokens=None, chunk_offsets=())],
    )
    row = level_row(run, facts(), request_rows(run, facts(), 4096), 4096)
    row["client_lag_ms_p99"] = 900.0  # the chunk gaps above are 0.5 s
    notes = measurement_warnings(pl.DataFrame([row]))
    assert any("ran late" in n and "900 ms late" in n for n in notes)
    assert any("1 of 2 requests failed" in n for n in notes)
    assert len(notes) == 3  # one line per kind of doubt (busy client, failures, no steady phase)
    row.update(requests=3, rounds=1.5, failed=0, client_lag_ms_p99=1.0)
    assert [n for n in measurement_warnings(pl.DataFrame([row])) if "no steady phase" in n]


def test_rounds_size_each_level_by_its_concurrency():
    base = {"servers": ["http://a:1", "http://b:2"], "model": "m", "concurrencies": [1, 16, 64]}
    fixed = build_config(BenchmarkConfig, {**base, "num_prompts": 40})
    assert [fixed.level_requests(c) for c in (1, 16, 64)] == [40, 40, 40]
    assert fixed.prompts_needed() == 2 * 3 * 40
    by_rounds = build_config(BenchmarkConfig, {**base, "num_prompts": 40, "rounds": 2.5})
    assert [by_rounds.level_requests(c) for c in (1, 16, 64)] == [8, 40, 160]  # at least 8, else ceil(2.5 c)
    assert by_rounds.prompts_needed() == 2 * (8 + 40 + 160)
    with pytest.raises(ParameterError, match="rounds"):
        build_config(BenchmarkConfig, {**base, "rounds": -1.0})
