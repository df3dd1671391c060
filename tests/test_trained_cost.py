"""Counting in trained tokens, on the clock the simulator kept: the estimate, generate's report, status and card.

The estimate prices the run capped at the trainer's max_length and states GPU-seconds per million trained tokens;
generate's report compares it with the generation's own span (first request to last answer), on the simulated GPU's
clock as the simulator kept it, and shows the session's start-up and end beside it; ``draftgen status`` states its
rates on the same clock as every report.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from generate_helpers import URL, finished_run

from draftgen.cli import main
from draftgen.client.clock import kept_share
from draftgen.estimate.model import LengthSample
from draftgen.generate import report
from draftgen.generate.config import GenerateConfig
from draftgen.generate.gpu_time import gpu_seconds, per_million
from draftgen.generate.ramp import _idle_seconds
from draftgen.params import build_config
from draftgen.watch import progress_file


def test_the_share_of_its_clock_a_fleet_kept():
    before = [(10.0, 10.0), (5.0, 6.0), None]
    after = [
        (20.0, 22.5),
        (15.0, 18.5),
        (1.0, 1.0),
    ]  # 20 s of steps planned, 25 took; the third is no simulator
    assert kept_share(before, after) == pytest.approx(0.8)
    assert kept_share([None], [None]) is None
    assert kept_share([(1.0, 1.0)], [(1.0, 1.0)]) is None  # nothing ran
    assert kept_share([(0.0, 0.0)], [(2.0, 1.9)]) == 1.0  # early by timer noise: never above its clock


def test_gpu_time_is_wall_times_factor_times_kept_times_servers():
    sessions = [
        {"started_at": 0.0, "ended_at": 10.0, "clock_factor": 5.0, "clock_kept": 0.8, "servers": [{}, {}]},
        {"started_at": 20.0, "ended_at": 30.0, "servers": [{}]},  # real servers, recorded before clock_kept
    ]
    assert gpu_seconds(sessions) == pytest.approx(10 * 5 * 0.8 * 2 + 10)
    assert per_million(90.0, 1_000_000, 3.6) == pytest.approx(
        {"gpu_s_per_m_trained": 90.0, "usd_per_m_trained": 0.09}
    )
    assert per_million(90.0, 0) == {"gpu_s_per_m_trained": None, "usd_per_m_trained": None}


def test_the_estimates_lengths_are_capped_as_generate_caps_them():
    requests = pl.DataFrame(
        {
            "ok": [True, True, True, True],
            "prompt_id": ["a", "b", "c", "d"],
            "prompt_tokens": [100, 900, 990, 1200],
            "completion_tokens": [300, 300, 300, 50],
            "truncated": [False, False, False, False],
        }
    )
    capped = LengthSample.from_requests(requests, max_tokens=4096, max_length=1000)
    # a: fits; b: 100 room; c: 10 room; d: its prompt alone is past max_length — generate never sends it
    assert capped.tokens.tolist() == [300, 100, 10]
    assert capped.truncated.tolist() == [False, True, True]
    assert capped.set_aside == 1 and capped.prompts == 3
    uncapped = LengthSample.from_requests(requests, max_tokens=4096)
    assert uncapped.tokens.tolist() == [300, 300, 300, 50] and uncapped.set_aside == 0
    assert np.isclose(capped.per_prompt(4096).sum(), 410)


def _finished_run(tmp_path: Path) -> GenerateConfig:
    """Ten stored rows of 1,000 tokens; a session of 20 s wall whose generation ran 16 s, 2 servers at sim ×5 with
    80% of the clock kept."""
    config = build_config(
        GenerateConfig,
        {"servers": [URL], "model": "m", "prompts": "synthetic", "out_dir": str(tmp_path / "run")},
    )
    path = finished_run(config)
    manifest = json.loads(path.read_text())
    manifest["clock"] = {"factor": 5.0, "hardware": "B200", "source": "draftgen sim"}
    manifest["sessions"][0].update(
        started_at=100.0,
        ended_at=120.0,
        first_sent_at=102.0,
        last_answer_at=118.0,
        clock_factor=5.0,
        clock_kept=0.8,
        servers=[{"url": URL}, {"url": URL + "1"}],
    )
    path.write_text(json.dumps(manifest))
    return config


def test_the_report_compares_the_estimate_with_the_generation_span_on_the_kept_clock(tmp_path):
    config = _finished_run(tmp_path)
    summary = report.summary(config.out_dir).row(0, named=True)
    assert summary["wall_s"] == pytest.approx(20 * 5 * 0.8)
    assert summary["generating_s"] == pytest.approx(16 * 5 * 0.8)
    assert summary["generating_tok_s"] == pytest.approx(10_000 / 64, abs=0.1)
    assert (
        summary["trained_tokens"] == 10_000
    )  # each row's 1,000 tokens fit in max_length 4096 after its prompt
    assert summary["gpu_s_per_m_trained"] == pytest.approx(80 * 2 / 10_000 * 1e6)  # the session's GPU time
    assert summary["clock_kept"] == pytest.approx(0.8)
    estimate = tmp_path / "estimate.json"
    estimate.write_text(
        json.dumps(
            {
                "aggregate_output_tok_s": 10_000 / 64,
                "wall_time_s": 64.0,
                "num_prompts": 10,
                "mean_completion_tokens": 1000.0,
                "gpu_s_per_m_trained": 12_800.0,
                "gpu_hour_usd": 3.6,
                "servers": 2,
                "concurrency_per_server": 64,
                "max_tokens": 4096,
            }
        )
    )
    rows = {r["figure"]: r for r in report.compare_estimate(estimate, config.out_dir).iter_rows(named=True)}
    wall = next(r for name, r in rows.items() if name.startswith("wall time"))
    assert wall["actual / planned"] == pytest.approx(1.0, abs=0.002)
    assert rows["session start-up and end outside the generation (s)"]["actual"] == pytest.approx(16.0)
    assert rows["GPU-seconds per million trained tokens"]["actual"] == pytest.approx(12_800.0)
    assert rows["dollars per million trained tokens"]["planned"] == pytest.approx(12.8)


def _progress(**changes: object) -> dict:
    now = time.time()
    doc = {
        "format": progress_file.FORMAT,
        "state": "running",
        "detail": "",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": progress_file.process_start_ticks(os.getpid()),
        "session_started_at": now - 100.0,
        "heartbeat_at": now,
        "interval_s": 5.0,
        "stale_after_s": 30.0,
        "conversations": {"total": 10, "done": 5, "done_at_start": 0, "session_done": 5, "failed": 0},
        "completion_tokens": 50_000,
        "trained_tokens": 40_000,
        "clock": {"factor": 5.0, "hardware": "B200"},
        "rate": {"window_s": 60.0, "conversations_per_s": 0.5, "tok_s": 5000.0},
        "servers": [
            {"url": URL, "label": "a", "up": True, "tok_s": 2500.0},
            {"url": URL + "1", "tok_s": 2500.0},
        ],
    }
    doc.update(changes)
    return doc


def test_status_states_rates_on_the_simulated_gpus_clock_and_the_trained_tokens(tmp_path, capsys):
    (tmp_path / "progress.json").write_text(json.dumps(_progress()))
    main(["status", str(tmp_path)])
    out = capsys.readouterr().out
    assert (
        "0.10 conversations/s, 1,000 completion tok/s over the last 5.0 min (simulated B200 clock, sim ×5)"
        in out
    )
    # 100 s wall × 5 × 2 servers = 1,000 GPU-seconds for 40,000 trained tokens
    assert (
        "40,000 trained tokens this session" in out and "25,000 GPU-seconds per million trained tokens" in out
    )
    server_lines = [line for line in out.splitlines() if line.startswith("a ")]
    assert server_lines and " 500 " in server_lines[0]  # each server's 2,500 wall-clock tok/s ÷ 5
    (tmp_path / "progress.json").write_text(json.dumps(_progress(clock={})))  # real servers: the wall clock
    main(["status", str(tmp_path)])
    [rate] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rate")]
    assert rate.endswith("0.50 conversations/s, 5,000 completion tok/s over the last 60.0 s")


def test_the_start_up_waves_idle_capacity_is_integrated_from_the_running_gauge():
    # full at 48: empty for 1 s, then 12 running for 1 s, 36 for 1 s, then full
    samples = [(11.0, 12.0), (12.0, 36.0), (13.0, 48.0)]
    assert _idle_seconds(samples, 48.0, start=10.0) == pytest.approx(1.0 + 0.75 + 0.25)
    assert _idle_seconds([(10.5, 48.0)], 48.0, start=10.0) == pytest.approx(0.5)


def test_the_demo_says_whether_the_run_fell_inside_the_estimates_interval(tmp_path):
    from draftgen.commands.demo import _cost_lines

    _finished_run(tmp_path / "demo" / "x")  # a generation span of 64 simulated seconds
    (tmp_path / "demo" / "x" / "run").rename(tmp_path / "demo" / "generate")
    estimate = tmp_path / "demo" / "estimate" / "estimate.json"
    estimate.parent.mkdir(parents=True)

    def planned(low: float, point: float, high: float) -> str:
        estimate.write_text(
            json.dumps(
                {
                    "aggregate_output_tok_s": 10_000 / 64,
                    "wall_time_s": point,
                    "wall_time_low_s": low,
                    "wall_time_high_s": high,
                    "interval": 0.9,
                    "num_prompts": 10,
                    "mean_completion_tokens": 1000.0,
                    "servers": 2,
                    "concurrency_per_server": 64,
                    "max_tokens": 4096,
                }
            )
        )
        return next(line for line in _cost_lines(tmp_path / "demo") if line.startswith("planned"))

    inside = planned(60.0, 66.0, 72.0)  # seconds shown in seconds: the interval in the row's own unit
    assert "planned 66.00 (90% interval 60.00–72.00; the run inside it), actual 64.0" in inside
    assert "(actual / planned 0.970)" in inside
    assert "the run outside it" in planned(66.0, 70.0, 72.0)
