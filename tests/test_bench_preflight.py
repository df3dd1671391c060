"""The benchmark refuses to start, naming each bad server, before anything is measured."""

from __future__ import annotations

import asyncio

import pytest

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.run import BenchmarkError, run_benchmark


def test_unreachable_and_wrong_model_servers_are_all_named(sim_fleet):
    fleet = sim_fleet(servers=1, profile="instant")
    config = BenchmarkConfig(
        servers=[fleet.urls[0], "http://127.0.0.1:9"],
        model="someone/else",
        num_prompts=2,
        concurrencies=[1],
        warmup_requests=0,
    )
    with pytest.raises(BenchmarkError) as caught:
        asyncio.run(run_benchmark(config))
    text = str(caught.value)
    assert f"server {fleet.urls[0]} serves Qwen/Qwen3.6-27B, not 'someone/else'" in text
    assert "server http://127.0.0.1:9 did not answer GET /v1/models (health: unreachable)" in text
    assert not [r for r in fleet.truth() if r.get("kind") == "chat"]  # nothing was sent
