"""The benchmark refuses to start, naming each bad server, before anything is measured."""

from __future__ import annotations

import asyncio

import pytest

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.run import BenchmarkError, run_benchmark


def test_unreachable_and_wrong_model_servers_are_all_named(instant_fleet):
    fleet = instant_fleet()
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


def test_a_failing_probe_is_tried_as_preflight_tries_it_before_the_benchmark_gives_up(sim_fleet):
    """One slow or failed first answer (a loaded CPU server, a 500) must not end a benchmark: its probe is tried
    as generate's preflight tries it (client.retry.PROBE_RETRY), and the error says how often."""
    from draftgen.client.retry import PROBE_RETRY

    fleet = sim_fleet(servers=1, profile="instant", faults=["error_rate=1"])
    config = BenchmarkConfig(
        servers=fleet.urls, model="Qwen/Qwen3.6-27B", num_prompts=2, concurrencies=[1], warmup_requests=0
    )
    with pytest.raises(
        BenchmarkError, match=f"failed a one-token probe request {PROBE_RETRY.max_attempts} times"
    ):
        asyncio.run(run_benchmark(config))
    probes = [r for r in fleet.truth() if r.get("kind") == "chat"]
    assert len(probes) == PROBE_RETRY.max_attempts and all(r["http_status"] == 500 for r in probes)
