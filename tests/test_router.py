"""What SMG, SGLang's gateway (smg 1.13.0), passes on and what it drops, measured, not assumed.

Two simulated workers sit behind recording pass-through proxies (tests_real/recording_proxy.py), SMG in front of
the proxies: every measurement compares what the client sent and got with what the worker itself received and
answered. docs/engines.md's SMG table is read here: each row's verdict is measured again and must equal the one
written there, and the rows measured are exactly the rows written, so the table cannot drift.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest
from sim_helpers import get, post, sse_json

from draftgen.bench.checkpoint import _level_from_json, _level_to_json
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.report import build_report, save_report
from draftgen.bench.run import run_benchmark
from draftgen.client import introspect
from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.generate import GenerateConfig, preflight, report
from draftgen.generate import generate as generate_run
from draftgen.generate.acceptance import ACCEPTANCE_FILE, metrics_targets
from draftgen.params import SamplingParams, build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.serve.config import ROUTER_PIN, ROUTER_POLICIES
from draftgen.serve.router import RouterProcess, healthy_workers
from draftgen.sim.fleet import find_free_base_port

ROOT = Path(__file__).resolve().parents[1]
# Nothing is in flight when a test's gateway stops; with its default grace period SMG takes 5 s to exit even so.
QUICK_STOP = ("--shutdown-grace-period-secs", "1")
MODEL = "Qwen/Qwen3.6-27B"
OPENAI_FIELDS = ("model", "messages", "temperature", "top_p", "max_tokens")
EXTRAS = {
    "top_k": 20,
    "min_p": 0.05,
    "chat_template_kwargs": {"enable_thinking": True},
    "return_spec_tokens_details": True,
}
IDS_FIELDS = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What is 17 times 23?"}],
    "max_tokens": 40,
    "temperature": 0.6,
    "top_p": 0.95,
    **EXTRAS,
}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def _recording_proxy_module() -> ModuleType:
    """The real-server tier's recording proxy (one copy of that code in the repository)."""
    path = ROOT / "tests_real" / "recording_proxy.py"
    spec = importlib.util.spec_from_file_location("recording_proxy", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there; ids_worker imports it
    spec.loader.exec_module(module)
    return module


def read_truth(fleet, index: int) -> list[dict]:  # type: ignore[no-untyped-def]
    path = fleet.truth_path(index)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    """A proxy records an exchange after relaying the whole reply, so SMG can answer a moment before the record
    exists: wait for it rather than race it (a wait, not a timing test)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Gateway:
    fleet: object
    proxies: list
    router: RouterProcess

    def worker_chats(self) -> list:  # type: ignore[type-arg]
        return [e for proxy in self.proxies for e in proxy.chats()]

    def clear(self) -> None:
        for proxy in self.proxies:
            with proxy._lock:
                proxy._exchanges.clear()

    def exchange(self, body: dict) -> tuple[bytes, object]:
        """POST ``body`` through SMG: (the client's raw answer, the one worker exchange behind it)."""
        self.clear()
        status, raw = post(f"{self.router.url}/v1/chat/completions", body)
        assert status == 200, raw
        wait_until(lambda: len(self.worker_chats()) == 1, "the worker's record of the chat")
        (exchange,) = self.worker_chats()
        return raw, exchange


def _gateway(
    factory: pytest.TempPathFactory, worker_cls_name: str, faults: list[str], smg_args: tuple[str, ...] = ()
) -> Iterator[Gateway]:
    from draftgen.sim import SimFleet

    fleet = SimFleet(servers=2, profile="b200-mtp", speed=50.0, faults=faults, work_dir=factory.mktemp("sim"))
    fleet.start()
    proxies = []
    router = None
    try:
        module = _recording_proxy_module()
        if worker_cls_name == "IdsWorker":
            from ids_worker import IdsWorker as worker_cls
        else:
            worker_cls = module.RecordingProxy
        for url in fleet.urls:
            proxy = worker_cls(url)
            proxy.start()
            proxies.append(proxy)
        router = RouterProcess(
            [p.url for p in proxies],
            policy="round_robin",
            log_dir=factory.mktemp("router"),
            extra_args=(*QUICK_STOP, *smg_args),
        )
        router.start()
        yield Gateway(fleet, proxies, router)
    finally:
        if router is not None:
            router.stop()
        for proxy in proxies:
            proxy.stop()
        fleet.cleanup()


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """SMG in front of two simulated SGLang 0.5.23 workers."""
    yield from _gateway(tmp_path_factory, "RecordingProxy", [])


@pytest.fixture(scope="module")
def ids_routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """SMG in front of two stand-in workers that answer with sglext token ids (tests/ids_worker.py)."""
    yield from _gateway(tmp_path_factory, "IdsWorker", [])


@pytest.fixture(scope="module")
def empty_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SMG whose only worker URL has nothing listening: what it answers before any worker is registered."""
    base = find_free_base_port(3)
    router = RouterProcess(
        [f"http://127.0.0.1:{base + 2}"], log_dir=tmp_path_factory.mktemp("empty"), extra_args=QUICK_STOP
    )
    router.port, router.metrics_port = base, base + 1
    try:
        router.start(wait=False)
        wait_until(lambda: _status(f"{router.url}/health") == 200, "SMG to listen")
        yield router.url
    finally:
        router.stop()


def _status(url: str) -> int | None:
    try:
        return get(url, timeout=2)[0]
    except OSError:
        return None


# ----- docs/engines.md's table, and one measurement per row -------------------------------------------------
def doc_table() -> dict[str, str]:
    """docs/engines.md's SMG table: row ("what", backticks removed) → verdict."""
    text = (ROOT / "docs" / "engines.md").read_text()
    section = text[text.index("## Behind SMG") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and rule
    table = {}
    for line in rows:
        cells = [c.strip().replace("`", "") for c in line.strip("|").split("|")]
        table[cells[0]] = cells[1]
    return table


class Context:
    """What the measurements need: the gateways, made lazily so one fixture's failure names itself."""

    def __init__(self, request: pytest.FixtureRequest):
        self.request = request

    @property
    def routed(self) -> Gateway:
        return self.request.getfixturevalue("routed")

    @property
    def ids(self) -> Gateway:
        return self.request.getfixturevalue("ids_routed")

    @property
    def empty(self) -> str:
        return self.request.getfixturevalue("empty_gateway")


MEASURE: dict[str, Callable[[Context], str]] = {}


def measures(row: str) -> Callable[[Callable[[Context], str]], Callable[[Context], str]]:
    def register(func: Callable[[Context], str]) -> Callable[[Context], str]:
        MEASURE[row] = func
        return func

    return register


def _arrival(sent: dict, body: dict, keys: tuple[str, ...]) -> str:
    """passed, or which of ``keys`` were dropped or changed on the way to the worker."""
    dropped = [k for k in keys if k not in sent]
    changed = [k for k in keys if k in sent and sent[k] != body[k]]
    if not dropped and not changed:
        return "passed"
    return "; ".join(
        part
        for part in (
            f"dropped {', '.join(dropped)}" if dropped else "",
            f"changed {', '.join(changed)}" if changed else "",
        )
        if part
    )


@measures("OpenAI fields")
def _openai_fields(ctx: Context) -> str:
    _, exchange = ctx.routed.exchange(BODY)
    return _arrival(exchange.request_json(), BODY, OPENAI_FIELDS)


@measures("top_k, min_p")
def _sampling_extras(ctx: Context) -> str:
    _, exchange = ctx.routed.exchange(BODY)
    return _arrival(exchange.request_json(), BODY, ("top_k", "min_p"))


@measures("chat_template_kwargs")
def _template_kwargs(ctx: Context) -> str:
    _, exchange = ctx.routed.exchange(BODY)
    return _arrival(exchange.request_json(), BODY, ("chat_template_kwargs",))


@measures("return_spec_tokens_details")
def _spec_details_field(ctx: Context) -> str:
    _, exchange = ctx.routed.exchange(BODY)
    return _arrival(exchange.request_json(), BODY, ("return_spec_tokens_details",))


@measures("return_input_ids_in_sglext, return_output_ids_in_sglext")
def _ids_fields(ctx: Context) -> str:
    body = {**BODY, **IDS_FIELDS}
    _, exchange = ctx.ids.exchange(body)
    return _arrival(exchange.request_json(), body, tuple(IDS_FIELDS))


@measures("unknown fields")
def _unknown_fields(ctx: Context) -> str:
    body = {**BODY, "foo_unknown": 7}
    _, exchange = ctx.routed.exchange(body)
    return _arrival(exchange.request_json(), body, ("foo_unknown",))


@measures("fields added")
def _fields_added(ctx: Context) -> str:
    _, exchange = ctx.routed.exchange(BODY)
    sent = exchange.request_json()
    added = sorted(set(sent) - set(BODY))
    assert sent.get("logprobs") is False and sent.get("stream") is False, sent
    return "added " + ", ".join(added) if added else "none"


def _same(a: object, b: object) -> str:
    return "unchanged" if a == b else f"changed: {a!r} != {b!r}"


@measures("answer (plain)")
def _plain_answer(ctx: Context) -> str:
    raw, exchange = ctx.routed.exchange(BODY)
    return _same(raw, exchange.response_body)


def _stream(gateway: Gateway, body: dict) -> tuple[list[dict], bool, list[dict], bool]:
    raw, exchange = gateway.exchange({**body, **STREAM})
    events, done = sse_json(raw)
    worker_events, worker_done = sse_json(exchange.response_body)
    return events, done, worker_events, worker_done


def _sglext_chunks(events: list[dict]) -> list[dict]:
    return [e["sglext"] for e in events if e.get("sglext") and e["choices"] == []]


@measures("sglext.spec_tokens_details")
def _spec_details(ctx: Context) -> str:
    raw, exchange = ctx.routed.exchange(BODY)
    answer, worker = json.loads(raw), exchange.response_json()
    assert worker["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0, worker
    plain = _same(answer.get("sglext"), worker["sglext"])
    events, _, worker_events, _ = _stream(ctx.routed, BODY)
    (chunk,) = _sglext_chunks(worker_events)
    assert "spec_tokens_details" in chunk, chunk
    stream = _same(_sglext_chunks(events), [chunk])
    return plain if plain == stream else f"plain {plain}, stream {stream}"


@measures("sglext.input_ids, sglext.output_ids")
def _ids(ctx: Context) -> str:
    from ids_worker import INPUT_IDS, OUTPUT_IDS

    body = {**BODY, **IDS_FIELDS}
    raw, exchange = ctx.ids.exchange(body)
    answer, worker = json.loads(raw), exchange.response_json()
    assert worker["sglext"] == {"input_ids": INPUT_IDS, "output_ids": [OUTPUT_IDS]}, worker
    assert json.loads(answer["choices"][0]["message"]["content"]) == exchange.request_json()  # the echo
    plain = _same(answer.get("sglext"), worker["sglext"])
    events, _, worker_events, _ = _stream(ctx.ids, body)
    stream = _same(_sglext_chunks(events), _sglext_chunks(worker_events))
    return plain if plain == stream else f"plain {plain}, stream {stream}"


@measures("reasoning split")
def _reasoning(ctx: Context) -> str:
    raw, exchange = ctx.routed.exchange({**BODY, "max_tokens": 400})
    message = json.loads(raw)["choices"][0]["message"]
    worker = exchange.response_json()["choices"][0]["message"]
    assert worker["reasoning_content"], worker
    split = ("reasoning_content", "content")
    return _same({k: message[k] for k in split}, {k: worker[k] for k in split})


@measures("usage")
def _usage(ctx: Context) -> str:
    raw, exchange = ctx.routed.exchange(BODY)
    plain = _same(json.loads(raw)["usage"], exchange.response_json()["usage"])
    events, _, worker_events, _ = _stream(ctx.routed, BODY)
    usage = [e for e in events if e.get("usage") and e["choices"] == []]
    assert usage and usage[-1]["usage"]["completion_tokens"] == BODY["max_tokens"], events[-3:]
    stream = _same(usage, [e for e in worker_events if e.get("usage") and e["choices"] == []])
    return plain if plain == stream else f"plain {plain}, stream {stream}"


@measures("streaming")
def _streaming(ctx: Context) -> str:
    events, done, worker_events, worker_done = _stream(ctx.routed, BODY)
    assert worker_done and any(
        e["choices"] and e["choices"][0]["delta"].get("reasoning_content") for e in worker_events
    )
    return _same((events, done), (worker_events, worker_done))


@measures("/health, /liveness")
def _health(ctx: Context) -> str:
    answers = {
        get(f"{url}{path}") for url in (ctx.empty, ctx.routed.router.url) for path in ("/health", "/liveness")
    }
    return "gateway" if answers == {(200, b"OK")} else f"answered {answers}"


@measures("/readiness")
def _readiness(ctx: Context) -> str:
    status, body = get(f"{ctx.empty}/readiness")
    before = (status, json.loads(body).get("reason"))
    status, body = get(f"{ctx.routed.router.url}/readiness")
    after = (status, json.loads(body))
    ready = {"status": "ready", "healthy_workers": 2, "total_workers": 2}
    if before == (503, "insufficient healthy workers") and after == (200, ready):
        return "gateway"
    return f"before workers {before}, with two {after}"


@measures("/health_generate")
def _health_generate(ctx: Context) -> str:
    status, body = get(f"{ctx.empty}/health_generate")
    assert status == 503 and json.loads(body)["error"]["code"] == "no_workers", (status, body)
    gateway = ctx.routed
    gateway.clear()
    for _ in range(3):
        assert get(f"{gateway.router.url}/health_generate")[0] == 200

    def asked() -> list[int]:
        return [len(p.exchanges("/health_generate")) for p in gateway.proxies]

    wait_until(lambda: sum(asked()) >= 3, "the workers' record of /health_generate")
    # all three on one worker: the first healthy one (round_robin spreads chats, not this)
    return "first worker" if sorted(asked()) == [0, 3] else f"asked {asked()}"


@measures("/v1/models")
def _models(ctx: Context) -> str:
    gateway = ctx.routed
    gateway.clear()
    models = json.loads(get(f"{gateway.router.url}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == [MODEL], models
    time.sleep(0.5)  # a relayed request would be on record by now
    asked = [e for p in gateway.proxies for e in p.exchanges("/v1/models")]
    return "gateway" if not asked else f"relayed to {len(asked)} worker(s)"


@measures("/get_server_info")
def _server_info(ctx: Context) -> str:
    gateway = ctx.routed
    assert get(f"{gateway.router.url}/server_info")[0] == 404
    gateway.clear()
    info = json.loads(get(f"{gateway.router.url}/get_server_info")[1])
    assert "internal_states" in info and info["version"] == "0.5.23", info  # SGLang's, not the gateway's
    assert get(f"{gateway.router.url}/health_generate")[0] == 200

    def asked(path: str) -> list[int]:
        return [len(p.exchanges(path)) for p in gateway.proxies]

    wait_until(lambda: sum(asked("/get_server_info")) + sum(asked("/health_generate")) == 2, "the records")
    # the same worker as /health_generate's: the first healthy one
    return "first worker" if asked("/get_server_info") == asked("/health_generate") else "another worker"


@measures("/metrics on the API port")
def _api_metrics(ctx: Context) -> str:
    return str(get(f"{ctx.routed.router.url}/metrics")[0])


@measures("Prometheus port")
def _prometheus(ctx: Context) -> str:
    status, own = get(ctx.routed.router.metrics_url)
    assert status == 200, own
    return "gateway" if b"smg_" in own and b"sglang:" not in own else "mixed"


@measures("/engine_metrics")
def _engine_metrics(ctx: Context) -> str:
    status, text = get(f"{ctx.routed.router.url}/engine_metrics")
    assert status == 200
    labelled = [
        f'sglang:generation_tokens_total{{model_name="{MODEL}",worker_addr="{proxy.url}"}}' in text.decode()
        for proxy in ctx.routed.proxies
    ]
    return "workers" if all(labelled) else f"labelled {labelled}"


@measures("/workers")
def _workers(ctx: Context) -> str:
    workers = json.loads(get(f"{ctx.routed.router.url}/workers")[1])["workers"]
    assert all(w["labels"]["version"] == "0.5.23" and w["labels"]["max_running_requests"] for w in workers)
    listed = sorted((w["url"], w["is_healthy"], w["status"]) for w in workers)
    expected = sorted((p.url, True, "ready") for p in ctx.routed.proxies)
    return "gateway" if listed == expected else f"listed {listed}"


@measures("/get_loads")
def _loads(ctx: Context) -> str:
    expected = sorted(p.url for p in ctx.routed.proxies)

    def listed() -> list[str]:
        loads = json.loads(get(f"{ctx.routed.router.url}/get_loads")[1])
        assert loads["version"] == ROUTER_PIN.replace("==", "-"), loads
        return sorted({row["worker"] for row in loads["loads"]})

    # SMG polls each worker's load every --load-monitor-interval (10 s): a worker appears after its first poll
    wait_until(lambda: listed() == expected, "a load row per worker", timeout_s=30)
    return "gateway"


@measures("policies")
def _policies(ctx: Context) -> str:
    refused = []
    for policy in ROUTER_POLICIES:
        try:
            with RouterProcess(
                [p.url for p in ctx.routed.proxies], policy=policy, extra_args=QUICK_STOP
            ) as router:
                status, raw = post(f"{router.url}/v1/chat/completions", {**BODY, "max_tokens": 4})
                assert status == 200, (policy, raw)
        except Exception as exc:  # named in the verdict
            refused.append(f"{policy}: {exc}")
    return "accepted" if not refused else "refused " + "; ".join(refused)


def test_the_table_and_the_measurements_name_the_same_rows() -> None:
    assert sorted(doc_table()) == sorted(MEASURE)


@pytest.mark.parametrize("row", sorted(MEASURE))
def test_each_row_of_the_table_holds_against_a_live_smg(row: str, request: pytest.FixtureRequest) -> None:
    written = doc_table().get(row)
    measured = MEASURE[row](Context(request))
    assert measured == written, f"docs/engines.md says {row!r}: {written!r}; SMG measured: {measured!r}"


def test_smg_is_the_pinned_release() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"{ROUTER_PIN}"' in pyproject
    assert "sglang-router" not in re.sub(r"#.*", "", pyproject)  # SMG is the only router


# ----- the client, generate and benchmark through the gateway ----------------------------------------------
def test_client_detects_smg_its_release_and_workers(routed: Gateway) -> None:
    async def detect():  # type: ignore[no-untyped-def]
        async with ServerClient(routed.router.url) as client:
            return await introspect.probe(client, MODEL, SamplingParams(max_tokens=8, top_k=20))

    caps = asyncio.run(detect())
    assert caps.engine == "smg" and caps.version == ROUTER_PIN.split("==")[1]
    assert sorted(caps.workers) == sorted(p.url for p in routed.proxies)
    assert caps.extra_fields and caps.template_kwargs  # top_k / chat_template_kwargs are passed on
    assert caps.spec_details  # sglext survives the gateway
    assert caps.token_ids == "sglext"  # asked for, and the workers' ids came back through it
    assert not caps.metrics  # no /metrics on its API port


def _generate_config(gateway: Gateway, tmp_path: Path, prompts: int, seed: int) -> GenerateConfig:
    path = tmp_path / "p.jsonl"
    write_synthetic(path, prompts, seed=seed)
    return build_config(
        GenerateConfig,
        {
            "servers": [gateway.router.url],
            "model": MODEL,
            # behind SMG the simulated workers look like real engines (no /sim/info) whose model folder this machine
            # lacks: the trainer's cap, which would need the tokenizer, is not these tests' subject
            "train_max_length": 0,
            "prompts": str(path),
            "out_dir": str(tmp_path / "gen"),
            "max_tokens": 256,
            "concurrency_per_server": 24,
            "max_truncated_rate": 1.0,
            "canary": False,
            "acceptance_interval_s": 0.5,
        },
    )


def test_generate_through_smg_stores_acceptance_per_request(routed: Gateway, tmp_path: Path) -> None:
    config = _generate_config(routed, tmp_path, 120, seed=43)

    async def run():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        before = {i: len(read_truth(routed.fleet, i)) for i in range(2)}  # after preflight's probe
        return plan, before, await generate_run(config, plan, progress=False)

    plan, before, result = asyncio.run(run())
    (engine,) = [c for c in plan.checks if c.check == "engine"]
    assert "engine smg 1.13.0" in engine.detail and engine.status == "ok", engine
    assert "smg: acceptance per request (sglext) through the gateway" in engine.detail
    assert result.status == "complete"
    assert not (Path(config.out_dir) / ACCEPTANCE_FILE).exists()  # nothing scraped: the answers carry it
    frame = pl.read_parquet(sorted((Path(config.out_dir) / "shards").glob("*.parquet")))
    assert frame.height == 120 and set(frame["server"].to_list()) == {routed.router.url}
    records = [
        r
        for i in range(2)
        for r in read_truth(routed.fleet, i)[before[i] :]
        if r["kind"] == "chat" and r["outcome"] == "ok"
    ]
    truth = {r["rid"]: r for r in records}
    for row in frame.iter_rows(named=True):
        record = truth[row["response_id"]]  # the worker's own record of this row's last turn
        assert row["turn_spec_verify_ct"][-1] == record["verify_steps"]
        expected = record["completion_tokens"] / record["verify_steps"]
        assert row["turn_spec_accept_length"][-1] == pytest.approx(expected)
    # every turn of every row against every chat the workers answered during the run
    assert frame["spec_verify_ct"].sum() == sum(r["verify_steps"] for r in records)
    assert frame["completion_tokens"].sum() == sum(r["completion_tokens"] for r in records)
    # the workers' own token ids, through the gateway, for every turn: as many output ids as completion tokens
    assert "token ids from the server (sglext)" in engine.detail
    for row in frame.iter_rows(named=True):
        assert [len(ids) for ids in row["turn_output_ids"]] == row["turn_completion_tokens"]


@pytest.fixture(scope="module")
def routed_old(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """SMG in front of workers that speak SGLang 0.5.9 (no sglext in chat): acceptance only from /metrics."""
    yield from _gateway(tmp_path_factory, "RecordingProxy", ["sglang_version=0.5.9"])


def test_without_sglext_generate_scrapes_each_worker_behind_smg(routed_old: Gateway, tmp_path: Path) -> None:
    config = _generate_config(routed_old, tmp_path, 120, seed=41)

    async def run():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        before = {i: len(read_truth(routed_old.fleet, i)) for i in range(2)}
        result = await generate_run(config, plan, progress=False)
        return plan, before, result

    plan, before, result = asyncio.run(run())
    (engine,) = [c for c in plan.checks if c.check == "engine"]
    assert "engine smg" in engine.detail
    assert "acceptance per worker over time from the /metrics of its 2 worker(s)" in engine.detail
    assert result.status == "complete"
    table = report.acceptance(config.out_dir)
    assert sorted(table["worker"].to_list()) == sorted(p.url for p in routed_old.proxies)
    assert set(table["via"].to_list()) == {routed_old.router.url}
    for index, proxy in enumerate(routed_old.proxies):
        # the simulator's own record of the requests this worker ran during the run
        records = [r for r in read_truth(routed_old.fleet, index)[before[index] :] if r["kind"] == "chat"]
        tokens = sum(r["completion_tokens"] for r in records)
        verifies = sum(r["verify_steps"] for r in records)
        (row,) = table.filter(pl.col("worker") == proxy.url).to_dicts()
        assert row["windows"] >= 2  # over time, not one number
        assert row["generated_tokens"] == pytest.approx(tokens, rel=0.02)
        assert row["accept_length"] == pytest.approx(tokens / verifies, rel=0.02)
    plot = report.plot_acceptance(config.out_dir)  # acceptance over time: one line per worker
    workers = [line for line in plot.figure.axes[0].lines if not line.get_label().startswith("run mean")]
    assert plot.path.exists() and len(workers) == 2  # (and the run's mean, once there are windows enough)


def test_whom_acceptance_is_scraped_from() -> None:
    workers = ("http://w1:30000", "http://w2:30000")
    gateway = "http://gw:30100"
    with_sglext = Capabilities(
        engine="smg", model_ids=(MODEL,), metrics=False, spec_details=True, workers=workers
    )
    targets = metrics_targets([(gateway, with_sglext), (gateway, replace(with_sglext, spec_details=False))])
    assert [(t.worker, t.via) for t in targets] == [(w, gateway) for w in workers]


def test_benchmark_through_smg_reads_acceptance_per_request_and_keeps_each_worker(
    routed: Gateway, tmp_path: Path
) -> None:
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
    assert facts.engine == "smg" and facts.sglext
    assert sorted(facts.workers) == sorted(p.url for p in routed.proxies)
    assert facts.max_running_requests == 2 * 48  # one worker's cap (SMG asks the first) × the workers
    report_ = build_report(run)
    workers = report_.workers
    assert workers.height == 4  # two workers × two levels
    truth = [r for i in range(2) for r in read_truth(routed.fleet, i)[before[i] :] if r["kind"] == "chat"]
    for level in run.levels:
        rows = workers.filter(pl.col("concurrency") == level.concurrency)
        (result,) = report_.results.filter(pl.col("concurrency") == level.concurrency).to_dicts()
        assert result["accept_length_source"] == "sglext"  # per request, through the gateway
        mine = [r for r in truth if r["rid"] in {q.response_id for q in level.requests}]
        assert len(mine) == len(level.requests)
        expected = sum(r["completion_tokens"] for r in mine) / sum(r["verify_steps"] for r in mine)
        assert result["accept_length"] == pytest.approx(expected)
        assert result["metrics_generation_tokens"] == pytest.approx(rows["generated_tokens"].sum())
    for index, proxy in enumerate(routed.proxies):
        start = run.levels[0].started_at  # after the probe request
        records = [
            r
            for r in read_truth(routed.fleet, index)[before[index] :]
            if r["kind"] == "chat" and r["arrival"] >= start
        ]
        assert records, "round_robin sends each worker its share"
        mine = workers.filter(pl.col("worker") == proxy.url)
        assert mine["generated_tokens"].sum() == pytest.approx(sum(r["completion_tokens"] for r in records))
    level = run.levels[0]  # a stored level reads back with its workers' windows (benchmark resume)
    assert _level_from_json(json.loads(json.dumps(_level_to_json(level)))) == replace(level, reused=True)
    save_report(report_, tmp_path)
    assert pl.read_parquet(tmp_path / "workers.parquet").equals(workers)


def test_router_process_waits_for_every_worker(routed: Gateway) -> None:
    assert healthy_workers(routed.router.url) == {p.url: True for p in routed.proxies}


@pytest.fixture(scope="module")
def sticky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """SMG (round robin) with sticky sessions: requests sharing x-smg-routing-key go to one worker."""
    yield from _gateway(tmp_path_factory, "RecordingProxy", [], ("--routing-key-override",))


def _conversation_workers(gateway: Gateway) -> dict[str, set[int]]:
    """Each conversation (its first user message) → the workers its requests reached."""
    seen: dict[str, set[int]] = {}
    for index, proxy in enumerate(gateway.proxies):
        for exchange in proxy.chats():
            messages = exchange.request_json()["messages"]
            first = next(m["content"] for m in messages if m["role"] == "user")
            seen.setdefault(first, set()).add(index)
    return seen


@pytest.mark.parametrize("gateway", ["routed", "sticky"])
def test_through_smg_a_conversation_stays_on_one_worker_only_with_sticky_sessions(
    gateway: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """generate sends each request to a gateway with its conversation's routing key (client.server.routing_key):
    with --routing-key-override SMG pins every turn of a conversation to one worker (where its prefix is cached);
    as shipped it ignores the key, and round robin spreads the turns (five turns each: were placement random, a
    conversation would stay on one of the two workers by chance with probability 1/16, and half of twelve would
    about once in 20,000 runs)."""
    routed_gateway: Gateway = request.getfixturevalue(gateway)
    routed_gateway.clear()
    path = tmp_path / "p.jsonl"
    with open(path, "w") as out:
        for i in range(12):
            messages = []
            for k in range(5):
                if k:
                    messages.append({"role": "assistant", "content": "an older answer"})
                messages.append({"role": "user", "content": f"conversation {i}, question {k}"})
            out.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")
    config = build_config(
        GenerateConfig,
        {
            "servers": [routed_gateway.router.url],
            "model": MODEL,
            # behind SMG the simulated workers look like real engines (no /sim/info) whose model folder this machine
            # lacks: the trainer's cap, which would need the tokenizer, is not these tests' subject
            "train_max_length": 0,
            "prompts": str(path),
            "out_dir": str(tmp_path / "gen"),
            "max_tokens": 32,
            "concurrency_per_server": 4,
            "max_truncated_rate": 1.0,
            "canary": False,
            "turns": "all",
        },
    )

    async def run():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        routed_gateway.clear()  # preflight's probe
        return await generate_run(config, plan, progress=False)

    assert asyncio.run(run()).status == "complete"
    workers = _conversation_workers(routed_gateway)
    assert len(workers) == 12
    on_one = sum(len(w) == 1 for w in workers.values())
    if gateway == "sticky":
        assert on_one == 12
        assert len(set().union(*workers.values())) == 2  # pinned, yet the conversations spread over both
    else:
        assert on_one < 6
