"""Dispatch behaviour that needs precise control: every server down at once, and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.generate.store import read_done_ids, read_manifest
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic


def config_for(fleet, prompts: Path, out_dir: Path, **changes: object) -> GenerateConfig:
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "max_tokens": 128,
        "concurrency_per_server": 4,
        "batch_save_size": 50,
        "max_truncated_rate": 1.0,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.2,
        "probe_interval_s": 0.1,
        "probe_max_interval_s": 0.3,
        "canary": False,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


def wait_for_shards(run_dir: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(list((run_dir / "shards").glob("*.parquet"))) < count:
        assert time.monotonic() < deadline, f"fewer than {count} shards after {timeout} s"
        time.sleep(0.05)


def test_every_server_down_pauses_without_spending_attempts(sim_fleet, tmp_path):
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 250, seed=11)
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=10.0)
    config = config_for(fleet, prompts, tmp_path / "run", server_down_after=2, max_attempts=3)

    async def scenario():
        plan = await preflight(config)
        task = asyncio.create_task(generate(config, plan, progress=False))
        await asyncio.to_thread(wait_for_shards, tmp_path / "run", 2)
        await asyncio.to_thread(fleet.kill, 0)
        await asyncio.to_thread(fleet.kill, 1)
        await asyncio.sleep(3.0)  # far longer than 3 attempts' worth of backoff
        assert not task.done()
        await asyncio.to_thread(fleet.restart, 0)
        await asyncio.to_thread(fleet.restart, 1)
        return await task

    result = asyncio.run(scenario())
    assert result.status == "complete" and result.failed == 0
    ids = read_done_ids(tmp_path / "run")
    assert sorted(ids.to_list()) == [f"syn-11-{i:07d}" for i in range(250)]
    events = [what for _, _, what in result.events]
    assert any("every server is down" in e for e in events)
    assert sum("rejoined" in e for e in events) == 2
    assert all(stats.downs >= 1 for stats in result.outcome.servers)


SCRIPT = """
import asyncio, sys
from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.params import build_config
config = build_config(GenerateConfig, __import__("json").loads(sys.argv[1]))
async def main():
    plan = await preflight(config)
    await generate(config, plan, progress=False)
asyncio.run(main())
"""


def test_sigterm_flushes_finished_work_and_resume_completes(sim_fleet, tmp_path):
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 100, seed=12)  # 20 answered at the SIGTERM, the rest by the resume
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=10.0)
    config = config_for(fleet, prompts, tmp_path / "run", batch_save_size=1000)  # one shard would take long
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config.model_dump(mode="json"))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Some answers finished on the servers (their ground truth says so), none written yet (batch_save_size 1000).
    deadline = time.monotonic() + 120
    while sum(r["kind"] == "chat" and r["outcome"] == "ok" for r in fleet.truth()) < 20:
        assert proc.poll() is None and time.monotonic() < deadline, "no answers finished"
        time.sleep(0.05)
    assert not list((tmp_path / "run" / "shards").glob("*.parquet"))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "RunInterrupted" in stderr and "stopped by SIGTERM" in stderr and "--resume" in stderr
    manifest = read_manifest(tmp_path / "run")
    assert manifest["status"] == "interrupted"
    stored = read_done_ids(tmp_path / "run")
    assert 0 < len(stored) < 100 and manifest["counts"]["done"] == len(stored)

    async def resume():
        plan = await preflight(config)
        assert plan.todo == 100 - len(stored)
        return await generate(config, plan, progress=False)

    result = asyncio.run(resume())
    assert result.completed == 100 - len(stored)
    frame = pl.scan_parquet(sorted((tmp_path / "run" / "shards").glob("*.parquet"))).select("id").collect()
    assert frame.height == 100 and frame["id"].n_unique() == 100


def test_a_wedged_server_is_presumed_hung_long_before_request_timeout_and_its_work_moves(sim_fleet, tmp_path):
    # Server 1's scheduler stops at its 150th request, /health still 200: the learned deadlines notice.
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 600, seed=13)
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=10.0, per_server_faults={1: ["wedge_after=150"]})
    config = config_for(
        fleet,
        prompts,
        tmp_path / "run",
        request_timeout_s=600.0,
        hang_min_s=2.0,
        server_down_after=3,
        server_silence_s=0,  # the silence watch is tested on its own below
    )

    async def scenario():
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    result = asyncio.run(scenario())
    assert result.status == "complete" and result.failed == 0
    events = [(server, what) for _, server, what in result.events]
    learned = [server for server, what in events if what.startswith("hang deadline learned")]
    assert sorted(learned) == sorted(fleet.urls)
    downs = [what for server, what in events if server == fleet.urls[1] and "marked down" in what]
    assert len(downs) == 1 and "presumed hung: no answer within" in downs[0], events
    frame = pl.read_parquet(sorted((tmp_path / "run" / "shards").glob("*.parquet")))
    assert frame.height == 600 and frame["id"].n_unique() == 600
    # Three requests were cut short (server_down_after=3), the fourth handed back uncounted when the server
    # went down; all four finished on server 0. The healthy server never saw a false alarm.
    turns = pl.col("turn_after").list.len()  # attempts add up over a conversation's turns
    retried = frame.filter(pl.col("attempts") > turns)
    assert (retried["attempts"] - retried["turn_after"].list.len()).to_list() == [1, 1, 1]
    assert set(retried["server"].to_list()) == {fleet.urls[0]}
    stats = {s.url: s for s in result.outcome.servers}
    assert stats[fleet.urls[0]].errors == 0 and stats[fleet.urls[1]].errors == 3


@pytest.mark.slow(2)  # started first (tests/long_first.py); it waits out a 200x slower server
def test_a_silent_server_is_benched_on_health_generate_and_a_slow_one_is_not(sim_fleet, tmp_path):
    # Server 1 wedges at its 150th request; server 2 is alive but so slow (200x) that it is often silent for
    # longer than server_silence_s. Learned deadlines are off: only the silence watch acts.
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 600, seed=14)
    fleet = sim_fleet(
        servers=3, profile="b200-mtp", speed=10.0, per_server_faults={1: ["wedge_after=150"], 2: ["slow=200"]}
    )
    config = config_for(
        fleet, prompts, tmp_path / "run", request_timeout_s=600.0, hang_factor=0, server_silence_s=1.0
    )

    async def scenario():
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    result = asyncio.run(scenario())
    assert result.status == "complete" and result.failed == 0
    fast, wedged, slow = fleet.urls
    events = [(server, what) for _, server, what in result.events]
    downs = [(server, what) for server, what in events if "marked down" in what]
    assert len(downs) == 1 and downs[0][0] == wedged, events
    assert "without an answer with 4 in flight and /health_generate 503" in downs[0][1]
    assert "4 in-flight request(s) handed to other servers" in downs[0][1]
    assert any(server == slow and "/health_generate 200: waiting" in what for server, what in events)
    frame = pl.read_parquet(sorted((tmp_path / "run" / "shards").glob("*.parquet")))
    assert frame.height == 600 and frame["id"].n_unique() == 600
    # handed back, never charged: one attempt per turn
    assert frame["attempts"].to_list() == frame["turn_after"].list.len().cast(pl.Int64).to_list()
    assert wedged not in set(frame["server"].to_list()[-100:])  # once benched it got no more work
    assert {s.url: s.errors for s in result.outcome.servers} == {fast: 0, wedged: 0, slow: 0}
