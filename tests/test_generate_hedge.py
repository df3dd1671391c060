"""Hedging the tail: requests still running on a slow server are copied to idle ones once nothing is left to send;
the first answer is stored (exactly once), the other request is cancelled (the simulator records the abort)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl
import pytest

from draftgen.generate import GenerateConfig, generate, preflight, report
from draftgen.generate.hedge import HedgePolicy, RateBook, Running, plan_hedges
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic


# ----- the planner ------------------------------------------------------------------------------------------------
def book_with(rates: dict[str, list[float]]) -> RateBook:
    book = RateBook()
    for server, values in rates.items():
        for rate in values:
            book.observe(server, int(rate * 10), 10.0)
    return book


def test_slow_servers_are_those_well_below_the_fleets_median_rate() -> None:
    book = book_with({"a": [100.0] * 20, "b": [95.0] * 20, "c": [105.0] * 20, "slow": [35.0] * 20})
    assert book.slow_servers(["a", "b", "c", "slow"], HedgePolicy(0.7)) == {"slow"}
    assert (
        book.slow_servers(["a", "b", "c", "slow"], HedgePolicy(0.3)) == set()
    )  # 0.35 of the median: not below
    # too few answers to judge: not slow yet
    assert (
        book_with({"a": [100.0] * 20, "new": [10.0] * 3}).slow_servers(["a", "new"], HedgePolicy(0.7))
        == set()
    )
    # a server alone has no fleet to be compared with
    assert book_with({"slow": [1.0] * 20}).slow_servers(["slow"], HedgePolicy(0.7)) == set()


def test_plan_copies_the_newest_requests_of_slow_servers_onto_idle_slots_once() -> None:
    running = [
        Running(key="old", server="slow", started=1.0, hedged=False),
        Running(key="new", server="slow", started=3.0, hedged=False),
        Running(key="mid", server="slow", started=2.0, hedged=False),
        Running(key="done-before", server="slow", started=4.0, hedged=True),  # already has a copy
        Running(key="fast-one", server="a", started=5.0, hedged=False),  # not on a slow server
    ]
    plan = plan_hedges(running, {"slow"}, {"a": 1, "b": 2, "slow": 5})
    assert [key for key, _ in plan] == ["new", "mid", "old"]  # newest first: the most left to do
    assert sorted(target for _, target in plan) == ["a", "b", "b"]  # never onto the slow server itself
    assert plan_hedges(running, {"slow"}, {"a": 0, "slow": 3}) == []  # no idle slot elsewhere: nothing


# ----- a real run on the simulator ----------------------------------------------------------------------------
def run_config(fleet, prompts: Path, out_dir: Path, **changes: object) -> GenerateConfig:  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "max_tokens": 512,
        "concurrency_per_server": 8,
        "batch_save_size": 50,
        "max_truncated_rate": 1.0,
        "canary": False,
        **changes,
    }
    return build_config(GenerateConfig, values)


@pytest.mark.timing
@pytest.mark.parametrize("slow_ratio", [0.7, 0.0])
def test_a_slow_servers_tail_is_hedged_stored_once_and_the_losing_copy_aborted(
    sim_fleet, tmp_path: Path, slow_ratio: float
) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 160, seed=21)
    # Decode 8x slower on server 1. The slowed server sleeps its steps; the others are the ones a loaded machine
    # starves (at 4x behind their clock, a slow=4 server measured no slower than them and nothing was hedged):
    # 8x keeps it below 0.7x the fleet's rate until the others fall more than 5.6x behind.
    fleet = sim_fleet(servers=3, profile="b200-mtp", speed=10.0, per_server_faults={1: ["slow=8"]})
    config = run_config(fleet, prompts, tmp_path / "run", hedge_slow_ratio=slow_ratio)

    async def run():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    result = asyncio.run(run())
    frame = pl.read_parquet(sorted((tmp_path / "run" / "shards").glob("*.parquet")))
    assert frame.height == 160 and frame["id"].n_unique() == 160  # exactly once
    assert result.status == "complete" and result.failed == 0
    stats = {s.url: s for s in result.outcome.servers}
    slow_url = fleet.urls[1]
    truth = [r for r in fleet.truth() if r.get("kind") == "chat"]
    run_records = [r for r in truth if r["arrival"] >= result.outcome.started_at]
    cancelled = [r for r in run_records if r["outcome"] == "client_disconnected"]
    summary = report.summary(config.out_dir).to_dicts()[0]
    if slow_ratio == 0:  # the control: no copies, nothing cancelled
        assert result.outcome.hedged == 0 and cancelled == [] and summary["hedged"] == 0
        assert len(run_records) == result.outcome.turns  # one request per turn answered
        return
    hedged = result.outcome.hedged
    assert hedged >= 1
    assert stats[slow_url].hedges == 0  # copies go to the fast servers, never onto the slow one
    assert sum(s.hedges for s in stats.values()) == hedged
    # every copy is one more request on the servers: one answer kept, the other aborted (or, rarely, both finished)
    assert len(run_records) == result.outcome.turns + hedged
    assert 1 <= len(cancelled) <= hedged
    stored = set(frame["response_id"].to_list())
    assert not stored & {r["rid"] for r in cancelled}  # an aborted request was never stored
    assert all(r["outcome"] == "ok" for r in run_records if r["rid"] in stored)
    assert (summary["hedged"], summary["hedge_wins"]) == (hedged, result.outcome.hedge_wins)
    wins_stored_on_fast = frame.filter(pl.col("server") != slow_url).height
    assert wins_stored_on_fast >= result.outcome.hedge_wins
    events = [what for _, _, what in result.events]
    assert any("hedged" in e and slow_url in e for e in events)
