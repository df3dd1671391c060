"""What SGLang's real router (sglang-router 0.3.2) passes on and what it drops, measured, not assumed.

Two simulated workers sit behind recording pass-through proxies (tests_real/recording_proxy.py), the router in
front of the proxies: every test compares what the client sent and got with what the worker itself received
and answered. docs/engines.md's router table states exactly what these tests assert.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import aiohttp
import polars as pl
import pytest
from sim_helpers import get, post, sse_json

from draftgen.bench.checkpoint import _level_from_json, _level_to_json
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.report import build_report, save_report
from draftgen.bench.run import run_benchmark
from draftgen.client import introspect
from draftgen.client.server import ServerClient
from draftgen.generate import GenerateConfig, preflight, report
from draftgen.generate import generate as generate_run
from draftgen.params import SamplingParams, build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.serve.router import RouterProcess

MODEL = "Qwen/Qwen3.6-27B"
EXTRAS = {
    "top_k": 20,
    "min_p": 0.05,
    "chat_template_kwargs": {"enable_thinking": True},
    "return_spec_tokens_details": True,
}
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What is 17 times 23?"}],
    "max_tokens": 40,
    "temperature": 0.6,
    "top_p": 0.95,
    **EXTRAS,
}


def _recording_proxy_module() -> ModuleType:
    """The real-server tier's recording proxy (one copy of that code in the repository)."""
    path = Path(__file__).resolve().parents[1] / "tests_real" / "recording_proxy.py"
    spec = importlib.util.spec_from_file_location("recording_proxy", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def read_truth(fleet, index: int) -> list[dict]:  # type: ignore[no-untyped-def]
    path = fleet.truth_path(index)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Setup:
    def __init__(self, fleet, proxies, router: RouterProcess):  # type: ignore[no-untyped-def]
        self.fleet = fleet
        self.proxies = proxies
        self.router = router

    def worker_chats(self) -> list:  # type: ignore[type-arg]
        return [e for proxy in self.proxies for e in proxy.chats()]

    def clear(self) -> None:
        for proxy in self.proxies:
            with proxy._lock:
                proxy._exchanges.clear()


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from draftgen.sim import SimFleet

    fleet = SimFleet(servers=2, profile="b200-mtp", speed=50.0, work_dir=tmp_path_factory.mktemp("sim"))
    fleet.start()
    proxies = []
    router = None
    try:
        module = _recording_proxy_module()
        for url in fleet.urls:
            proxy = module.RecordingProxy(url)
            proxy.start()
            proxies.append(proxy)
        router = RouterProcess(
            [p.url for p in proxies], policy="round_robin", log_dir=tmp_path_factory.mktemp("router")
        )
        router.start()
        yield Setup(fleet, proxies, router)
    finally:
        if router is not None:
            router.stop()
        for proxy in proxies:
            proxy.stop()
        fleet.cleanup()


def test_request_fields_rewritten_return_spec_tokens_details_dropped(routed: Setup) -> None:
    routed.clear()
    status, raw = post(f"{routed.router.url}/v1/chat/completions", BODY)
    assert status == 200, raw
    (sent,) = [e.request_json() for e in routed.worker_chats()]
    # passed on unchanged
    for key in ("model", "messages", "temperature", "top_p", "top_k", "min_p", "chat_template_kwargs"):
        assert sent[key] == BODY[key], key
    # renamed: max_tokens arrives as max_completion_tokens
    assert "max_tokens" not in sent and sent["max_completion_tokens"] == BODY["max_tokens"]
    # dropped: the request for per-request acceptance never reaches the worker
    assert "return_spec_tokens_details" not in sent
    # added: the router's own defaults for SGLang's extra fields
    assert sent["separate_reasoning"] is True and sent["skip_special_tokens"] is True


def test_answers_pass_through_unchanged_so_sglext_never_comes_back(routed: Setup) -> None:
    routed.clear()
    status, raw = post(f"{routed.router.url}/v1/chat/completions", BODY)
    assert status == 200
    (exchange,) = routed.worker_chats()
    answer = json.loads(raw)
    assert answer == exchange.response_json()  # the worker's answer, as it sent it
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"]  # the reasoning split (the worker's --reasoning-parser) survives
    assert answer["usage"]["completion_tokens"] == 40
    assert "sglext" not in answer
    # the same body sent straight to a worker does come back with per-request acceptance
    status, direct = post(f"{routed.fleet.urls[0]}/v1/chat/completions", BODY)
    assert status == 200 and "spec_tokens_details" in json.loads(direct)["sglext"]


def test_streams_pass_chunk_by_chunk_with_usage_and_done(routed: Setup) -> None:
    routed.clear()
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    status, raw = post(f"{routed.router.url}/v1/chat/completions", body)
    assert status == 200
    (exchange,) = routed.worker_chats()
    assert exchange.request_json()["stream_options"] == {"include_usage": True}
    events, done = sse_json(raw)
    worker_events, worker_done = sse_json(exchange.response_body)
    assert done and worker_done
    assert events == worker_events
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 40
    assert any(e["choices"] and e["choices"][0]["delta"].get("reasoning_content") for e in events)
    assert not any("sglext" in e for e in events)


def test_health_models_workers_and_metrics_endpoints(routed: Setup) -> None:
    routed.clear()
    router = routed.router
    assert get(f"{router.url}/health")[0] == 200
    status, _ = get(f"{router.url}/health_generate")
    assert status == 200  # answered by the router itself: no worker generated anything
    assert not [e for p in routed.proxies for e in p.exchanges("/health_generate")]
    models = json.loads(get(f"{router.url}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == [MODEL]
    workers = json.loads(get(f"{router.url}/workers")[1])["workers"]
    assert sorted(w["url"] for w in workers) == sorted(p.url for p in routed.proxies)
    assert all(w["is_healthy"] for w in workers)
    # no /metrics on the API port; the router's own on --prometheus-port, without any sglang: counter
    assert get(f"{router.url}/metrics")[0] == 404
    status, own = get(router.metrics_url)
    assert status == 200 and b"smg_router_requests_total" in own and b"sglang:" not in own
    # /engine_metrics: every worker's /metrics, labelled worker_addr, "sglang:" renamed "sglang_"
    status, engine = get(f"{router.url}/engine_metrics")
    assert status == 200
    for proxy in routed.proxies:
        assert (
            f'sglang_generation_tokens_total{{model_name="{MODEL}",worker_addr="{proxy.url}"}}'
            in engine.decode()
        )
    assert b"sglang:" not in engine
    # SGLang's server_info is not served; get_server_info describes the router
    assert get(f"{router.url}/server_info")[0] == 404
    assert json.loads(get(f"{router.url}/get_server_info")[1])["workers_count"] == 2


def test_client_detects_the_router_and_its_workers(routed: Setup) -> None:
    async def detect():  # type: ignore[no-untyped-def]
        async with ServerClient(routed.router.url) as client:
            return await introspect.probe(client, MODEL, SamplingParams(max_tokens=8, top_k=20))

    caps = asyncio.run(detect())
    assert caps.engine == "sglang-router"
    assert sorted(caps.workers) == sorted(p.url for p in routed.proxies)
    assert caps.extra_fields and caps.template_kwargs  # top_k / chat_template_kwargs are passed on
    assert not caps.spec_details  # no sglext through the router


def test_generate_through_the_router_records_acceptance_per_worker_from_metrics(
    routed: Setup, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 120, seed=41)
    config = build_config(
        GenerateConfig,
        {
            "servers": [routed.router.url],
            "model": MODEL,
            "prompts": str(prompts),
            "out_dir": str(tmp_path / "gen"),
            "max_tokens": 256,
            "concurrency_per_server": 24,
            "max_truncated_rate": 1.0,
            "canary": False,
            "acceptance_interval_s": 0.5,
        },
    )

    async def run():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        before = {i: len(read_truth(routed.fleet, i)) for i in range(2)}
        result = await generate_run(config, plan, progress=False)
        return plan, before, result

    plan, before, result = asyncio.run(run())
    (engine,) = [c for c in plan.checks if c.check == "engine"]
    assert "engine sglang-router" in engine.detail
    assert "acceptance per worker over time from the /metrics of its 2 worker(s)" in engine.detail
    assert result.status == "complete"
    table = report.acceptance(config.out_dir)
    assert sorted(table["worker"].to_list()) == sorted(p.url for p in routed.proxies)
    assert set(table["via"].to_list()) == {routed.router.url}
    for index, proxy in enumerate(routed.proxies):
        # the simulator's own record of the requests this worker ran during the run
        records = [r for r in read_truth(routed.fleet, index)[before[index] :] if r["kind"] == "chat"]
        tokens = sum(r["completion_tokens"] for r in records)
        verifies = sum(r["verify_steps"] for r in records)
        (row,) = table.filter(pl.col("worker") == proxy.url).to_dicts()
        assert row["windows"] >= 2  # over time, not one number
        assert row["generated_tokens"] == pytest.approx(tokens, rel=0.02)
        assert row["accept_length"] == pytest.approx(tokens / verifies, rel=0.02)
    plot = report.plot_acceptance(config.out_dir)  # acceptance over time: one line per worker
    assert plot.path.exists() and len(plot.figure.axes[0].lines) == 2


def test_router_sees_each_workers_load_and_model_info(routed: Setup) -> None:
    # The simulator serves SGLang's /get_load and /model_info, which the router polls (power_of_two balancing,
    # worker metadata); without them it reports a load of -1.
    for url in routed.fleet.urls:
        (rank,) = json.loads(get(f"{url}/get_load")[1])
        assert rank == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        info = json.loads(get(f"{url}/model_info")[1])
        assert info["model_path"] == MODEL and info["is_generation"] is True
        assert json.loads(get(f"{url}/get_model_info")[1]) == info

    # the router asked each worker for its load, and shows the answer instead of -1 (an idle fleet: 0 each, once
    # the router's view has caught up with the requests of the tests before)
    async def loads() -> list[dict]:
        seen = []
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                async with session.get(f"{routed.router.url}/get_loads") as reply:
                    seen.append({w["worker"]: w["load"] for w in (await reply.json())["workers"]})
                if set(seen[-1].values()) == {0}:
                    break
                await asyncio.sleep(0.2)
        return seen

    seen = asyncio.run(loads())
    assert seen[-1] == {p.url: 0 for p in routed.proxies}
    assert all(load >= 0 for view in seen for load in view.values())

    # A proxy records an exchange after it has relayed the whole reply, so the router can have its answer (and
    # give us ours) a moment before the record exists: wait for it rather than race it.
    async def asked() -> bool:
        for _ in range(100):
            if all(p.exchanges("/get_load") for p in routed.proxies):
                return True
            await asyncio.sleep(0.1)
        return False

    assert asyncio.run(asked()), [len(p.exchanges("/get_load")) for p in routed.proxies]


def test_benchmark_through_the_router_reports_each_worker(routed: Setup, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = BenchmarkConfig(
        servers=[routed.router.url],
        model=MODEL,
        num_prompts=16,
        concurrencies=[4, 8],
        max_tokens=256,
        warmup_requests=0,
        out_dir=str(tmp_path),
    )
    before = {i: len(read_truth(routed.fleet, i)) for i in range(2)}
    run = asyncio.run(run_benchmark(config))
    (facts,) = run.servers
    assert facts.engine == "sglang-router" and sorted(facts.workers) == sorted(p.url for p in routed.proxies)
    report = build_report(run)
    workers = report.workers
    assert workers.height == 4  # two workers × two levels
    for level in run.levels:
        rows = workers.filter(pl.col("concurrency") == level.concurrency)
        # the router's level: the workers' windows together (metrics source), each worker's own row beside it
        (result,) = report.results.filter(pl.col("concurrency") == level.concurrency).to_dicts()
        assert result["metrics_generation_tokens"] == pytest.approx(rows["generated_tokens"].sum())
        assert result["accept_length_source"].startswith("metrics (")
    for index, proxy in enumerate(routed.proxies):
        start = run.levels[0].started_at  # after the probe request
        records = [
            r
            for r in read_truth(routed.fleet, index)[before[index] :]
            if r["kind"] == "chat" and r["arrival"] >= start
        ]
        assert records, "round_robin sends each worker its share"
        mine = workers.filter(pl.col("worker") == proxy.url)
        tokens = sum(r["completion_tokens"] for r in records)
        verifies = sum(r["verify_steps"] for r in records)
        assert mine["generated_tokens"].sum() == pytest.approx(tokens)
        weighted = (mine["generated_tokens"] / mine["accept_length"]).sum()
        assert mine["generated_tokens"].sum() / weighted == pytest.approx(tokens / verifies, rel=1e-6)
    # a stored level reads back with its workers' windows (benchmark resume)
    level = run.levels[0]
    assert _level_from_json(json.loads(json.dumps(_level_to_json(level)))) == replace(level, reused=True)
    save_report(report, tmp_path)
    assert pl.read_parquet(tmp_path / "workers.parquet").equals(workers)
