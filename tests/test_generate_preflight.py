"""Preflight against live (simulated) servers: every problem in one table, before any prompt is sent."""

from __future__ import annotations

import asyncio

import polars as pl
import pytest

from draftgen.generate import PreflightError, generate, preflight
from draftgen.generate.config import GenerateConfig
from draftgen.generate.store import RunStore
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim.fleet import find_free_base_port


def make(fleet_urls, tmp_path, **changes) -> GenerateConfig:
    values = {
        "servers": fleet_urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": "synthetic",
        "out_dir": str(tmp_path / "run"),
        "max_tokens": 256,
        "limit": 200,
        "concurrency_per_server": 4,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


def test_every_problem_is_one_row_of_one_table(sim_fleet, tmp_path, monkeypatch):
    fleet = sim_fleet(servers=1, profile="instant")
    dead = f"http://127.0.0.1:{find_free_base_port(1)}"
    monkeypatch.delenv("DRAFTGEN_MISSING_KEY", raising=False)
    config = make([*fleet.urls, dead], tmp_path, model="Qwen/Other", api_key_env="DRAFTGEN_MISSING_KEY")
    with pytest.raises(PreflightError) as caught:
        asyncio.run(preflight(config))
    failed = {(c.check, c.target) for c in caught.value.checks if c.status == "fail"}
    assert ("api key", "DRAFTGEN_MISSING_KEY") in failed
    assert ("model", fleet.urls[0]) in failed
    assert ("reachable", dead) in failed
    message = str(caught.value)
    assert "'Qwen/Qwen3.6-27B'" in message  # what the server does serve
    assert "nothing was sent" in message


def test_stored_rows_with_other_parameters_fail_preflight(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="instant")
    first = make(fleet.urls, tmp_path, limit=30)
    asyncio.run(_run(first))
    changed = make(fleet.urls, tmp_path, limit=30, temperature=1.0)
    with pytest.raises(PreflightError, match=r"temperature: stored 0\.6, now 1\.0"):
        asyncio.run(preflight(changed))
    plan = asyncio.run(preflight(make(fleet.urls, tmp_path, limit=30, temperature=1.0, force=True)))
    assert any(c.status == "warn" and c.check == "out_dir" for c in plan.checks)
    assert plan.todo == 0


async def _run(config: GenerateConfig):
    plan = await preflight(config)
    return await generate(config, plan, progress=False)


def test_streaming_run_records_time_to_first_token(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=100.0)
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 120, seed=5)
    config = make(
        fleet.urls, tmp_path, prompts=str(prompts), stream=True, max_truncated_rate=1.0, batch_save_size=50
    )
    result = asyncio.run(_run(config))
    assert result.completed == 120
    frame = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet")
    assert frame["ttft_s"].null_count() == 0 and (frame["ttft_s"] <= frame["latency_s"]).all()
    assert frame["spec_accept_length"].null_count() == 0  # sglext arrives in its own streamed chunk
    assert frame.height == frame["id"].n_unique() == 120


def test_lock_held_by_another_run_fails_preflight(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="instant")
    config = make(fleet.urls, tmp_path)
    with RunStore.open(config), pytest.raises(PreflightError, match="another process"):
        asyncio.run(preflight(config))


def test_preflight_warns_that_a_loop_check_without_streaming_saves_no_gpu_time(tmp_path):
    from draftgen.generate.preflight import check_environment

    servers = ["http://127.0.0.1:30000"]
    said = [c for c in check_environment(make(servers, tmp_path, stream=False)) if c.check == "loop check"]
    assert [(c.status, c.target) for c in said] == [("warn", "stream: false")]
    assert "stream: true ends it live" in said[0].detail
    assert not [c for c in check_environment(make(servers, tmp_path)) if c.check == "loop check"]  # streams
    assert not [
        c for c in check_environment(make(servers, tmp_path, loop_check=False)) if c.check == "loop check"
    ]
