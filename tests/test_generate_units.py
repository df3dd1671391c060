"""generate's building blocks without servers: config, shard split, retry policy, guard, store, resume."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import polars as pl
import pytest
from generate_helpers import URL, finished_run, row

from draftgen.generate import report
from draftgen.generate.config import GenerateConfig, parse_shard
from draftgen.generate.deadline import MIN_SAMPLES, HangPolicy, ServerDeadline
from draftgen.generate.guard import Guard, GuardSettings, GuardTripped, classify
from draftgen.generate.source import prompt_source
from draftgen.generate.store import (
    FAILED,
    FingerprintMismatch,
    RunStore,
    StoreError,
    atomic_write_parquet,
    read_done_ids,
    read_manifest,
)
from draftgen.params import ParameterError, build_config
from draftgen.prompts.rows import PromptRow
from draftgen.prompts.synthetic import write_synthetic


def make_config(tmp_path: Path, **changes: object) -> GenerateConfig:
    values: dict[str, object] = {
        "servers": [URL],
        "model": "m",
        "prompts": "synthetic",
        "out_dir": str(tmp_path / "run"),
        "batch_save_size": 3,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


# ----- config -----------------------------------------------------------------------------------------------
def test_every_bad_parameter_is_named_at_once(tmp_path):
    with pytest.raises(ParameterError) as caught:
        build_config(
            GenerateConfig,
            {
                "servers": [],
                "model": "m",
                "prompts": str(tmp_path / "missing.jsonl"),
                "out_dir": "x",
                "concurrency_per_server": 0,
                "batch_save_size": -5,
                "temperature": "hot",
                "shard": "3/2",
                "max_empty_answer_rate": 1.5,
                "maxtokens": 10,
                "api_key_env": "sk-abc123",
            },
        )
    names = {name for name, _ in caught.value.problems}
    assert {
        "servers",
        "prompts",
        "concurrency_per_server",
        "batch_save_size",
        "temperature",
        "shard",
        "max_empty_answer_rate",
        "maxtokens",
        "api_key_env",
    } <= names
    assert "did you mean 'max_tokens'" in str(caught.value)
    assert "missing.jsonl" in str(caught.value)


def test_cross_field_rules_and_unset_literals(tmp_path):
    with pytest.raises(ParameterError, match="backoff_max_s"):
        make_config(tmp_path, backoff_base_s=10.0, backoff_max_s=1.0)
    with pytest.raises(ParameterError, match="guard_min_results"):
        make_config(tmp_path, guard_window=10, guard_min_results=20)
    config = make_config(tmp_path, api_key_env="", top_k=0, min_p=0.0)
    assert (config.api_key_env, config.top_k, config.min_p) == (None, None, None)


@pytest.mark.parametrize(
    ("value", "expected"), [("", None), ("0/4", (0, 4)), ("3/4", (3, 4)), ([1, 2], (1, 2)), ("0/1", (0, 1))]
)
def test_parse_shard(value, expected):
    assert parse_shard(value) == expected


@pytest.mark.parametrize("value", ["4/4", "-1/3", "a/b", "1", "1/0", [2, 2], [1]])
def test_parse_shard_rejects(value):
    with pytest.raises(ValueError):
        parse_shard(value)


def test_fingerprint_tracks_generation_parameters_only(tmp_path):
    base = make_config(tmp_path)
    assert (
        base.fingerprint() == make_config(tmp_path, concurrency_per_server=8, batch_save_size=9).fingerprint()
    )
    assert base.fingerprint() != make_config(tmp_path, max_tokens=100).fingerprint()
    assert base.fingerprint() != make_config(tmp_path, model="other").fingerprint()
    assert base.fingerprint() != make_config(tmp_path, enable_thinking=False).fingerprint()
    assert base.fingerprint() != make_config(tmp_path, shard="1/2").fingerprint()


# ----- shard split ----------------------------------------------------------------------------------------
def test_shards_split_deterministically_without_overlap(tmp_path):
    path = tmp_path / "p.jsonl"
    write_synthetic(path, 600, seed=3)
    everything = {r.id for r in prompt_source(make_config(tmp_path, prompts=str(path)))}
    assert len(everything) == 600
    parts = []
    for index in range(3):
        config = make_config(tmp_path, prompts=str(path), shard=f"{index}/3")
        first = [r.id for r in prompt_source(config)]
        assert first == [r.id for r in prompt_source(config)]  # deterministic
        parts.append(set(first))
        assert 120 < len(first) < 280  # a hash split, not everything on one side
    assert parts[0] | parts[1] | parts[2] == everything
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])


def test_limit_counts_valid_rows_of_the_shard(tmp_path):
    path = tmp_path / "p.jsonl"
    write_synthetic(path, 50)
    with open(path, "a") as handle:
        handle.write("not json\n")
    rows = list(prompt_source(make_config(tmp_path, prompts=str(path), limit=10)))
    assert [r.id for r in rows if isinstance(r, PromptRow)] == [f"syn-0-{i:07d}" for i in range(10)]


# ----- guard ----------------------------------------------------------------------------------------------
def test_classify():
    assert classify(thinking=True, content="a", reasoning="r", finish_reason="stop", failed=False) == ()
    assert classify(thinking=True, content=" \n", reasoning="r", finish_reason="stop", failed=False) == (
        "empty_answer",
    )
    assert classify(thinking=True, content="OK.", reasoning="\n", finish_reason="stop", failed=False) == (
        "empty_reasoning",
    )
    assert classify(thinking=False, content="OK.", reasoning=None, finish_reason="stop", failed=False) == ()
    assert classify(thinking=True, content=None, reasoning="r", finish_reason="length", failed=False) == (
        "truncated",
    )
    assert classify(thinking=True, content=None, reasoning=None, finish_reason=None, failed=True) == (
        "failed",
    )


def _feed(guard: Guard, count: int, *, empty: bool, start: int = 0) -> None:
    for i in range(start, start + count):
        guard.observe(
            id=f"p{i}", server=URL, content="" if empty else "fine", reasoning="r", finish_reason="stop"
        )


def test_guard_trips_above_threshold_with_examples():
    guard = Guard(GuardSettings(window=100, min_results=20, max_rates={"empty_answer": 0.1}))
    _feed(guard, 18, empty=False)
    _feed(guard, 2, empty=True, start=18)  # 10% of 20: at the threshold, not above
    with pytest.raises(GuardTripped) as caught:
        _feed(guard, 1, empty=True, start=20)
    report = caught.value.report
    assert report.defect == "empty_answer" and report.seen == 21
    assert [e.id for e in report.examples] == ["p18", "p19", "p20"]
    assert "p20" in str(caught.value) and "empty answer" in str(caught.value)


def test_guard_waits_for_min_results():
    guard = Guard(GuardSettings(window=50, min_results=30, max_rates={"empty_answer": 0.1}))
    _feed(guard, 29, empty=True)  # 100% empty but too few to judge
    with pytest.raises(GuardTripped):
        _feed(guard, 1, empty=True, start=29)


def test_guard_window_slides():
    guard = Guard(GuardSettings(window=50, min_results=10, max_rates={"empty_answer": 0.2}))
    _feed(guard, 40, empty=False)
    _feed(guard, 10, empty=True, start=40)  # 10/50 = 20%: not above
    _feed(guard, 50, empty=False, start=50)  # the empties slide out of the window
    assert guard.rates()["empty_answer"] == 0.0
    _feed(guard, 10, empty=True, start=100)  # 10/50 again: still fine
    with pytest.raises(GuardTripped):
        _feed(guard, 1, empty=True, start=110)


def test_guard_trips_within_the_first_batch_at_90_percent_empty():
    guard = Guard(GuardSettings())  # the production defaults
    rng = random.Random(0)
    with pytest.raises(GuardTripped) as caught:
        for i in range(500):
            guard.observe(
                id=f"p{i}",
                server=URL,
                content="OK.",
                reasoning="\n" if rng.random() < 0.9 else "r",
                finish_reason="stop",
            )
    assert caught.value.report.seen <= GuardSettings().min_results
    assert caught.value.report.defect == "empty_reasoning"


# ----- store ----------------------------------------------------------------------------------------------
def test_store_writes_shards_every_batch_and_resumes(tmp_path):
    config = make_config(tmp_path)
    with RunStore.open(config) as store:
        assert store.add(row("a")) is False
        store.add(row("b"))
        assert store.add(row("c")) is True  # batch_save_size 3
        store.add(row("d"))
        store.close("interrupted")
    assert sorted(read_done_ids(config.out_dir).to_list()) == ["a", "b", "c", "d"]
    manifest = read_manifest(config.out_dir)
    assert manifest["counts"]["done"] == 4 and [s["rows"] for s in manifest["shards"]] == [3, 1]
    assert manifest["sessions"][-1]["status"] == "interrupted"
    with RunStore.open(config) as store:
        assert store.done_ids == {"a", "b", "c", "d"}
        with pytest.raises(StoreError, match="finished twice"):
            store.add(row("a"))
        store.add(row("e"))
        store.close("complete")
    frames = [pl.read_parquet(p) for p in sorted((Path(config.out_dir) / "shards").glob("*.parquet"))]
    assert [f.height for f in frames] == [3, 1, 1]
    assert frames[0].columns[:12] == [
        "id",
        "messages",
        "reasoning_content",
        "content",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "spec_accept_length",
        "spec_verify_ct",
        "server",
        "latency_s",
        "attempts",
    ]
    assert frames[0]["messages"][0].to_list() == [{"role": "user", "content": "q a"}]


def test_interrupted_write_leaves_no_partial_shard(tmp_path, monkeypatch):
    config = make_config(tmp_path)
    store = RunStore.open(config)
    store.add(row("a"))
    store.add(row("b"))
    store.add(row("c"))  # shard 1 written

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    store.add(row("d"))
    store.add(row("e"))
    with pytest.raises(OSError, match="disk gone"):
        store.add(row("f"))
    monkeypatch.undo()
    store.release()  # the process "dies" here
    shard_dir = Path(config.out_dir) / "shards"
    assert [p.name for p in shard_dir.glob("*.parquet")] == ["part-000001.parquet"]
    assert list(shard_dir.glob(".*.tmp"))  # the interrupted write, under a temporary name
    with RunStore.open(config) as store:  # resume: leftovers removed, only whole shards count
        assert store.done_ids == {"a", "b", "c"}
    assert not list(shard_dir.glob(".*.tmp"))


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "x.parquet"
    atomic_write_parquet(pl.DataFrame({"a": [1, 2]}), path)
    atomic_write_parquet(pl.DataFrame({"a": [3]}), path)
    assert pl.read_parquet(path)["a"].to_list() == [3]
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]


def test_corrupt_shard_is_named(tmp_path):
    config = make_config(tmp_path)
    with RunStore.open(config) as store:
        for name in "abc":
            store.add(row(name))
        store.close("complete")
    (Path(config.out_dir) / "shards" / "part-000002.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(StoreError, match=r"part-000002\.parquet is unreadable"):
        RunStore.open(config)


def test_fingerprint_mismatch_needs_force(tmp_path):
    config = make_config(tmp_path)
    with RunStore.open(config) as store:
        store.add(row("a"))
        store.close("interrupted")
    other = make_config(tmp_path, max_tokens=128, temperature=1.0)
    with pytest.raises(FingerprintMismatch) as caught:
        RunStore.open(other)
    message = str(caught.value)
    assert "max_tokens: stored 4096, now 128" in message and "temperature" in message and "force" in message
    with RunStore.open(make_config(tmp_path, max_tokens=128, temperature=1.0, force=True)) as store:
        assert store.done_ids == {"a"}


def test_fingerprint_not_checked_before_anything_was_generated(tmp_path):
    with RunStore.open(make_config(tmp_path)) as store:
        store.flush()  # manifest written, no rows
    with RunStore.open(make_config(tmp_path, model="corrected")) as store:
        assert store.done_ids == set()


def test_one_writer_per_run_folder(tmp_path):
    config = make_config(tmp_path)
    with RunStore.open(config):
        with pytest.raises(StoreError, match="another process"):
            RunStore.open(config)
    RunStore.open(config).release()  # free again


def test_failures_are_kept_until_the_prompt_succeeds(tmp_path):
    config = make_config(tmp_path)
    failure = {
        "id": "x",
        "messages": [{"role": "user", "content": "q"}],
        "error": "timeout: no answer",
        "error_kind": "timeout",
        "status": None,
        "attempts": 5,
        "server": URL,
        "failed_at": 1.0,
        "source_row": 4,
    }
    with RunStore.open(config) as store:
        store.add_failure(failure)
        store.add_failure({**failure, "id": "y"})
        store.close("complete_with_failures")
    assert sorted(pl.read_parquet(Path(config.out_dir) / FAILED)["id"].to_list()) == ["x", "y"]
    with RunStore.open(config) as store:  # resume: x succeeds this time
        assert store.failed_count == 2
        store.add(row("x"))
        store.close("interrupted")
    assert pl.read_parquet(Path(config.out_dir) / FAILED)["id"].to_list() == ["y"]
    assert json.loads((Path(config.out_dir) / "manifest.json").read_text())["counts"]["failed"] == 1


def test_resume_reads_only_ids_quickly_enough_to_scale(tmp_path):
    """Functional check of the resume path on many shards (timing lives in benchmarks/resume_time.py)."""
    shard_dir = tmp_path / "run" / "shards"
    shard_dir.mkdir(parents=True)
    for index in range(20):
        frame = pl.DataFrame([row(f"id-{index}-{j}") for j in range(50)])
        frame.write_parquet(shard_dir / f"part-{index + 1:06d}.parquet")
    ids = read_done_ids(tmp_path / "run")
    assert len(ids) == 1000 and ids.n_unique() == 1000


# ----- report: planned vs actual --------------------------------------------------------------------------
def test_estimate_comparison_projects_the_whole_set(tmp_path):
    config = make_config(tmp_path, batch_save_size=10)
    with RunStore.open(config) as store:
        for index in range(10):
            store.add(row(f"p{index}", tokens=1000))
        store.session.started_at = 0.0  # 10,000 tokens in this session ...
        store.close("complete")
    manifest_path = Path(config.out_dir) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sessions"][0]["started_at"] = 100.0
    manifest["sessions"][0]["ended_at"] = 110.0  # ... over 10 s: 1,000 tok/s
    manifest_path.write_text(json.dumps(manifest))
    estimate = tmp_path / "estimate.json"
    estimate.write_text(
        json.dumps(
            {
                "aggregate_output_tok_s": 2000.0,
                "wall_time_s": 7200.0,
                "num_prompts": 1000,
                "servers": 7,
                "concurrency_per_server": 64,
                "max_tokens": 4096,
                "mean_completion_tokens": 800.0,
            }
        )
    )
    table = report.compare_estimate(estimate, config.out_dir)
    rows = {r["figure"]: r for r in table.iter_rows(named=True)}
    assert rows["aggregate output tok/s"]["planned"] == 2000.0
    assert rows["aggregate output tok/s"]["actual"] == 1000.0
    assert rows["aggregate output tok/s"]["actual / planned"] == 0.5
    assert rows["requests in the set"]["planned"] == 1000
    wall = rows["wall time for the set (h)"]
    assert wall["planned"] == 2.0 and wall["actual"] == pytest.approx(1000 * 1000 / 1000 / 3600, abs=0.01)
    notes = report.estimate_assumptions(estimate, config.public_dict())
    assert "estimate assumed 7 servers, this run used 1" in notes
    assert not any("max_tokens" in n for n in notes)  # same max_tokens: no note
    estimate.write_text(json.dumps({"aggregate_output_tok_s": 1}))
    with pytest.raises(ValueError, match="lacks wall_time_s"):
        report.compare_estimate(estimate, config.out_dir)


def test_a_run_of_the_estimates_whole_set_is_compared_by_its_own_span(tmp_path):
    """The estimate planned 1,000 requests for 10 conversations; the run sent 10 (fewer answer points than planned):
    its wall time for the set is the span it took, not its rate projected onto the planned requests. A run of part
    of the set (another count, a limit, unfinished) is still projected."""
    config = make_config(tmp_path, batch_save_size=10)
    manifest_path = finished_run(config)
    manifest = json.loads(manifest_path.read_text())
    session = manifest["sessions"][0]
    session.update(started_at=100.0, ended_at=110.0, first_sent_at=101.0, last_answer_at=109.0)
    manifest["prompts"] = {**(manifest.get("prompts") or {}), "valid": 10}
    manifest_path.write_text(json.dumps(manifest))
    span = report.summary(config.out_dir).row(0, named=True)
    span_s = span["generating_s"] - (span["start_wave_idle_s"] or 0.0)
    assert span_s == pytest.approx(8.0, abs=0.2)  # first request sent to last answer
    planned = {
        "aggregate_output_tok_s": 2000.0,
        "wall_time_s": 7200.0,
        "num_prompts": 1000,
        "servers": 1,
        "concurrency_per_server": 64,
        "max_tokens": 4096,
        "mean_completion_tokens": 800.0,
    }

    def actual_wall_s(**estimate: object) -> float:
        path = tmp_path / "estimate.json"
        path.write_text(json.dumps({**planned, **estimate}))
        [wall] = [
            r
            for r in report.compare_estimate(path, config.out_dir).iter_rows(named=True)
            if r["figure"].startswith("wall time for the set")
        ]
        return wall["actual"] * 3600  # hours: the planned 2 h sets the unit

    projected = 1000 * 1000 / span["generating_tok_s"]  # 1,000 planned requests at the run's rate
    assert actual_wall_s(set_conversations=10) == pytest.approx(span_s, abs=2.0)
    assert actual_wall_s(set_conversations=11) == pytest.approx(projected, rel=0.01)  # not this run's set
    assert actual_wall_s() == pytest.approx(projected, rel=0.01)  # an estimate from before the field
    assert projected > 50 * span_s  # the two readings differ here by far more than the tolerances
    manifest["status"] = "interrupted"
    manifest_path.write_text(json.dumps(manifest))
    assert actual_wall_s(set_conversations=10) == pytest.approx(projected, rel=0.01)  # unfinished: projected


def test_throughput_spreads_each_request_over_its_lifetime():
    import numpy as np

    from draftgen.generate.report import spread_rate

    rng = np.random.default_rng(0)
    starts = rng.uniform(0, 100, 500)
    ends = starts + rng.uniform(1, 30, 500)
    tokens = rng.integers(1, 4096, 500).astype(float)
    edges = np.linspace(starts.min(), ends.max(), 41)
    rate = spread_rate(starts, ends, tokens, edges)
    assert np.all(rate >= -1e-9)
    assert np.isclose((rate * np.diff(edges)).sum(), tokens.sum())  # every token counted once
    # one request of 100 tokens over [2, 4]: 50 tok/s in the bins it spans, nothing elsewhere
    one = spread_rate(
        np.array([2.0]), np.array([4.0]), np.array([100.0]), np.array([0.0, 2.0, 3.0, 4.0, 6.0])
    )
    assert one.tolist() == [0.0, 50.0, 50.0, 0.0]


# ----- learned hang deadlines ---------------------------------------------------------------------------------
def test_hang_deadline_is_the_hard_limit_until_learned_then_factor_times_max_tokens_at_the_slow_rate():
    deadline = ServerDeadline(HangPolicy(request_timeout_s=1800.0, max_tokens=4096, factor=3.0, min_s=60.0))
    for _ in range(MIN_SAMPLES - 1):
        assert not deadline.observe(2000, 50.0)  # 40 tok/s per request
    assert deadline.timeout_s() == 1800.0
    assert deadline.observe(2000, 50.0)  # the one that makes it known says so, once
    assert deadline.timeout_s() == pytest.approx(3 * 4096 / 40.0)  # 307 s
    assert deadline.timeout_s(presumed_hung_before=1) == pytest.approx(2 * 3 * 4096 / 40.0)
    assert deadline.timeout_s(presumed_hung_before=3) == 1800.0  # never past request_timeout_s
    assert not deadline.observe(2000, 50.0)


def test_hang_deadline_follows_the_slow_tail_and_respects_its_floor():
    deadline = ServerDeadline(HangPolicy(request_timeout_s=1800.0, max_tokens=1000, factor=2.0, min_s=30.0))
    for i in range(100):
        deadline.observe(100, 1.0 if i % 10 else 10.0)  # 90 at 100 tok/s, 10 at 10 tok/s
    assert deadline.slow_rate == pytest.approx(10.0)
    assert deadline.timeout_s() == pytest.approx(2 * 1000 / 10.0)
    fast = ServerDeadline(HangPolicy(request_timeout_s=1800.0, max_tokens=1000, factor=2.0, min_s=30.0))
    for _ in range(MIN_SAMPLES):
        fast.observe(1000, 1.0)  # 1000 tok/s: 2 s by the formula
    assert fast.timeout_s() == 30.0


def test_hang_deadline_off_or_without_usable_samples_keeps_the_hard_limit():
    off = ServerDeadline(HangPolicy(request_timeout_s=900.0, max_tokens=4096, factor=0.0, min_s=60.0))
    blind = ServerDeadline(HangPolicy(request_timeout_s=900.0, max_tokens=4096, factor=3.0, min_s=60.0))
    for _ in range(2 * MIN_SAMPLES):
        off.observe(2000, 50.0)
        blind.observe(None, 50.0)  # no usage reported: nothing to learn from
        blind.observe(0, 50.0)
    assert off.timeout_s() == 900.0 and blind.timeout_s() == 900.0


def test_the_reports_empty_answers_are_the_guards_finished_turns_without_an_answer_or_a_call(tmp_path):
    """A turn cut at its limit, a call, or a loop ended live has no answer by its cause: not an empty answer."""
    import polars as pl
    from validate_helpers import row, write_generation

    from draftgen.generate.report import scan_results

    cases = {
        "empty": ("stop", ""),
        "cut": ("length", None),
        "call": ("tool_calls", ""),
        "loop": ("repetition_loop", ""),
    }
    rows = [
        row(name, reasoning="Thinking.", content=content, finish_reason=finish)
        for name, (finish, content) in cases.items()
    ]
    rows.append(row("answered", reasoning="Thinking.", content="The answer."))
    write_generation(tmp_path / "gen", rows)
    scanned = scan_results(tmp_path / "gen").collect()
    assert scanned.filter(pl.col("empty_answer"))["id"].to_list() == ["empty"]
