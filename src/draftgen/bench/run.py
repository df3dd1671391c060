"""Run the benchmark: per server and concurrency level, a bounded closed loop of streaming chat requests.

Each server gets one ``ServerClient``. A level keeps exactly ``concurrency`` requests in flight on its server
(a new one is sent the moment one finishes) until the level's requests (``num_prompts``, or ``rounds``
× concurrency) have been sent, scraping ``/metrics`` before
and after so the level's own counter differences are known. Servers run in parallel (one GPU each, independent)
unless the config says otherwise. Each finished level is saved at once (``checkpoint``), so ``resume`` picks up an
interrupted benchmark at the level it lost. Nothing here summarizes: records come back raw, ``stats`` turns them
into rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftgen.bench.answer_point import sent_point
from draftgen.bench.checkpoint import LevelStore, level_identity
from draftgen.bench.config import WARMUP_MAX_TOKENS, BenchmarkConfig
from draftgen.bench.records import BenchmarkRun, LevelRun, RequestRecord, ServerFacts, WorkerWindow
from draftgen.bench.sample import PromptSample, sample_prompts
from draftgen.client import introspect
from draftgen.client.clock import kept_share, read_clock, read_clock_kept
from draftgen.client.errors import RequestError
from draftgen.client.metrics import (
    MetricsParseError,
    MetricsSnapshot,
    counter_window,
    merge_windows,
    parse_metrics,
)
from draftgen.client.records import Capabilities
from draftgen.client.retry import PROBE_RETRY, retrying
from draftgen.client.served import ModelNotResolved, one_model, read_served
from draftgen.client.server import ServerClient
from draftgen.exit_codes import Refused
from draftgen.prompts.rows import PromptRow
from draftgen.rundir.layout import BENCH_LEVELS
from draftgen.sampling_plan import sample_seed
from draftgen.training.tools import wire_messages

LAG_PROBE_INTERVAL_S = 0.05
STOP_POLL_INTERVAL_S = 0.05  # how often a level asks SendLimit.stop_sending between finishes


class BenchmarkError(Refused):
    """The benchmark cannot start (a server unreachable, the model not served): nothing was measured."""


# ----- server facts ---------------------------------------------------------------------------------------------
async def _server_facts(index: int, client: ServerClient, config: BenchmarkConfig) -> ServerFacts:
    models = await introspect.served_models(client)
    assert config.model is not None, "run_benchmark fills in the model first"
    served = models.serves(config.model)
    if served is None:
        status = (await introspect.health(client)).status
        if status != 200:
            raise BenchmarkError(
                f"server {client.url} did not answer GET /v1/models (health: {status or 'unreachable'}); "
                "start it (draftgen serve / draftgen sim) or remove it from `servers`"
            )
        # Healthy but no model list (transformers serve answers 500): the probe request below names the model.
    elif not served:
        raise BenchmarkError(
            f"server {client.url} serves {', '.join(models.ids)}, not {config.model!r}: "
            "fix `model` or the server list"
        )
    try:
        caps: Capabilities = await retrying(
            lambda: introspect.probe(client, config.model, config.sampling), PROBE_RETRY
        )
    except RequestError as exc:
        raise BenchmarkError(
            f"server {client.url} failed a one-token probe request {PROBE_RETRY.max_attempts} times: {exc}"
        ) from exc
    info = await introspect.server_info(client)
    clock = await read_clock(client)
    return ServerFacts(
        index=index,
        url=client.url,
        engine=caps.engine,
        version=caps.version,
        model_ids=models.ids,
        extra_fields=caps.extra_fields,
        sglext=caps.spec_details,
        metrics=caps.metrics or bool(caps.workers),
        max_running_requests=introspect.batch_cap(info, caps),
        speculative_algorithm=info.speculative_algorithm,
        speculation=info.speculation,
        workers=caps.workers,
        clock_factor=clock.factor,
        hardware=clock.hardware,
    )


async def _with_served_model(config: BenchmarkConfig, clients: list[ServerClient]) -> BenchmarkConfig:
    """``model: ""``: the one model every server lists in GET /v1/models (``draftgen.client.served``)."""
    if config.model is not None:
        return config
    fleet = await asyncio.gather(*(read_served(client) for client in clients))
    try:
        name = one_model(fleet)
    except ModelNotResolved as exc:
        raise BenchmarkError(str(exc)) from None
    print(f'model: "" → {name!r}, the one model every server lists', flush=True)
    return config.model_copy(update={"model": name})


async def read_server_facts(index: int, client: ServerClient, config: BenchmarkConfig) -> ServerFacts:
    """What one server is, checked as the benchmark checks it (model served, probe request); for other tools."""
    return await _server_facts(index, client, config)


async def warm_up(client: ServerClient, config: BenchmarkConfig) -> None:
    """The benchmark's warm-up requests on one server (not measured); for other tools."""
    await _warm_up(client, config)


# ----- one request ------------------------------------------------------------------------------------------
async def _one_request(
    client: ServerClient,
    facts: ServerFacts,
    config: BenchmarkConfig,
    concurrency: int,
    seq: int,
    row: PromptRow,
) -> RequestRecord:
    # an agentic row is asked at one answer point, and its answer compared with the source's there
    point = sent_point(row, config.turns)
    started_at = time.time()
    t0 = time.perf_counter()
    base = {
        "server": facts.url,
        "gpu": facts.index,
        "concurrency": concurrency,
        "seq": seq,
        "prompt_id": row.prompt_id or row.id,  # a sample's prompt: its answers are grouped by prompt
        "category": row.category,
        "arm": row.arm,
        "answer_point": point.after,
    }
    try:
        result = await client.stream_chat(
            wire_messages(point.messages),
            config.arm_sampling(row.arm),
            config.model,
            timeout_s=config.request_timeout_s,
            seed=sample_seed(row.id) if row.arm is not None else None,
            tools=row.tools,  # an agentic prompt is asked as generate asks it: with its tools
        )
    except RequestError as exc:
        return RequestRecord(
            **base,
            ok=False,
            error=str(exc),
            started_at=started_at,
            e2e_s=time.perf_counter() - t0,
            ttft_s=None,
            chunk_offsets=(),
        )
    content = result.content or ""
    return RequestRecord(
        **base,
        ok=True,
        error=None,
        started_at=result.started_at,
        e2e_s=result.latency_s,
        ttft_s=result.ttft_s,
        chunk_offsets=tuple(result.chunk_offsets),
        response_id=result.response_id,
        usage_reported=result.usage_reported,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        finish_reason=result.finish_reason,
        reasoning_chars=len(result.reasoning_content or ""),
        content_chars=len(content),
        content_blank=not content.strip(),
        spec_accept_length=result.spec_accept_length,
        spec_verify_ct=result.spec_verify_ct,
        done_sentinel=result.done_sentinel,
        diverged=point.diverged(row.messages, result),
        source_called=point.source_called,
    )


# ----- one level ------------------------------------------------------------------------------------------------
async def _scrape(client: ServerClient) -> tuple[MetricsSnapshot | None, str | None]:
    text = await client.metrics_text()
    if text is None:
        return None, f"GET {client.url}/metrics failed during the level"
    try:
        return parse_metrics(text), None
    except MetricsParseError as exc:
        return None, f"{client.url}/metrics unreadable: {exc}"


async def _worker_snapshots(
    clients: Sequence[ServerClient],
) -> list[tuple[MetricsSnapshot | None, str | None]]:
    return list(await asyncio.gather(*(_scrape(c) for c in clients)))


def _worker_windows(
    clients: Sequence[ServerClient],
    before: Sequence[tuple[MetricsSnapshot | None, str | None]],
    after: Sequence[tuple[MetricsSnapshot | None, str | None]],
) -> tuple[WorkerWindow, ...]:
    windows = []
    for client, (start, note), (end, note_after) in zip(clients, before, after, strict=True):
        window = counter_window(start, end) if start is not None and end is not None else None
        if window is not None and window.reset:
            note = f"counters went down during the level (restarted?): {', '.join(window.reset)}"
        windows.append(WorkerWindow(client.url, window, note or note_after))
    return tuple(windows)


async def _snapshot(client: ServerClient, facts: ServerFacts) -> tuple[MetricsSnapshot | None, str | None]:
    if facts.workers:
        return None, None  # a gateway: its workers are scraped instead (_worker_windows)
    if not facts.metrics:
        advice = " (start SGLang with --enable-metrics)" if facts.engine == "sglang" else ""
        return None, f"server has no /metrics{advice}"
    text = await client.metrics_text()
    if text is None:
        return None, "GET /metrics failed during the level"
    try:
        return parse_metrics(text), None
    except MetricsParseError as exc:
        return None, f"/metrics unreadable: {exc}"


async def _watch_lag(samples: list[float], stop: asyncio.Event) -> None:
    """Record how late the event loop wakes up: a busy client delays every timestamp it takes."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        expected = loop.time() + LAG_PROBE_INTERVAL_S
        await asyncio.sleep(LAG_PROBE_INTERVAL_S)
        samples.append(max(0.0, loop.time() - expected) * 1000.0)


@dataclass(frozen=True)
class SendLimit:
    """How a level may end before every row is sent, and what happens to the requests still in flight.

    Benchmark's own levels send every row and drain. Tune's jobs also stop when ``stop_sending(elapsed_s,
    finished_ok)`` says so (asked at each finish and every 50 ms; it must stay true once true). Only requests
    that finish while every slot is busy count as steady, so with ``cancel_in_flight`` the level ends the moment
    it stops refilling (the clock said stop, or only the last row is left: a request sent then could never
    count, so it is not sent), and the requests in flight are cancelled (the server aborts them) instead of
    drained: up to one request's duration of GPU time saved per job. ``on_end(elapsed_s)`` is told then.
    """

    stop_sending: Callable[[float, int], bool] | None = None
    cancel_in_flight: bool = False
    on_end: Callable[[float], None] | None = None


async def run_level(
    client: ServerClient,
    facts: ServerFacts,
    config: BenchmarkConfig,
    concurrency: int,
    rows: Sequence[PromptRow],
    limit: SendLimit | None = None,
) -> LevelRun:
    """Keep ``concurrency`` requests in flight on one server until every row has been sent once (or ``limit``).

    For a gateway, each worker's /metrics is read before and after instead: the level's window is their sum, and
    each worker's own window is kept (acceptance per worker).
    """
    workers = [ServerClient(url, api_key=config.api_key()) for url in facts.workers]
    try:
        return await _run_level(client, facts, config, concurrency, rows, workers, limit or SendLimit())
    finally:
        for worker in workers:
            await worker.close()


async def _run_level(
    client: ServerClient,
    facts: ServerFacts,
    config: BenchmarkConfig,
    concurrency: int,
    rows: Sequence[PromptRow],
    workers: Sequence[ServerClient],
    limit: SendLimit,
) -> LevelRun:
    # the simulator's clock read outside the counters' window, which stays as tight around the level as it was
    kept_before = await read_clock_kept(client) if facts.hardware else None
    before, note = await _snapshot(client, facts)
    workers_before = await _worker_snapshots(workers)
    # With cancel_in_flight the last row only marks the end (a request sent then could never count).
    sendable = len(rows) - 1 if limit.cancel_in_flight else len(rows)
    records: list[RequestRecord] = []
    lag: list[float] = []
    stop = asyncio.Event()
    sending_over = asyncio.Event()
    sent = finished_ok = in_flight = cancelled = 0
    sending_ended_at: float | None = None
    began = time.perf_counter()

    def told_to_stop() -> bool:
        return limit.stop_sending is not None and limit.stop_sending(time.perf_counter() - began, finished_ok)

    def next_row() -> tuple[int, PromptRow] | None:
        nonlocal sent
        if sent >= sendable or sending_over.is_set() or told_to_stop():
            return None
        sent += 1  # one counter hands each row to exactly one worker
        return sent - 1, rows[sent - 1]

    def end_sending() -> None:
        nonlocal sending_ended_at
        if sending_over.is_set():
            return
        sending_over.set()
        if limit.cancel_in_flight:
            sending_ended_at = time.time()
        if limit.on_end is not None:
            limit.on_end(time.perf_counter() - began)

    async def worker() -> None:
        nonlocal finished_ok, in_flight, sending_ended_at
        while (item := next_row()) is not None:
            seq, row = item
            if not limit.cancel_in_flight:
                sending_ended_at = time.time()  # draining: the window ends at the last send
            in_flight += 1
            try:
                record = await _one_request(client, facts, config, concurrency, seq, row)
            finally:
                in_flight -= 1
            records.append(record)
            finished_ok += record.ok
        end_sending()

    async def watch_stop() -> None:
        """Ask ``stop_sending`` between finishes too, so a time limit ends the level on time."""
        while not sending_over.is_set():
            if told_to_stop():
                end_sending()
                return
            try:
                await asyncio.wait_for(sending_over.wait(), STOP_POLL_INTERVAL_S)
            except TimeoutError:
                pass

    async def cancel_after_last_send(tasks: list[asyncio.Task[None]]) -> None:
        nonlocal cancelled
        await sending_over.wait()
        cancelled = in_flight
        for task in tasks:
            task.cancel()

    started_at = time.time()
    async with asyncio.TaskGroup() as outer:
        outer.create_task(_watch_lag(lag, stop))
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(worker()) for _ in range(min(concurrency, sendable))]
                if limit.cancel_in_flight and tasks:
                    group.create_task(cancel_after_last_send(tasks))
                if limit.stop_sending is not None and tasks:
                    group.create_task(watch_stop())
        finally:
            stop.set()
    finished_at = time.time()
    after, note_after = await _snapshot(client, facts)
    kept = kept_share([kept_before], [await read_clock_kept(client)]) if kept_before else None
    worker_windows = _worker_windows(workers, workers_before, await _worker_snapshots(workers))
    window = counter_window(before, after) if before is not None and after is not None else None
    if window is not None and window.reset:
        note = f"counters went down during the level (server restarted?): {', '.join(window.reset)}"
    if worker_windows:
        measured = [w.window for w in worker_windows if w.window is not None and not w.window.reset]
        if len(measured) == len(worker_windows):
            window = merge_windows(measured)
        else:
            note = "; ".join(w.note or f"{w.worker}: no window" for w in worker_windows if w.note)
    info = await introspect.server_info(client)
    return LevelRun(
        server=facts.url,
        gpu=facts.index,
        concurrency=concurrency,
        started_at=started_at,
        finished_at=finished_at,
        requests=tuple(sorted(records, key=lambda r: r.seq)),
        metrics_window=window,
        metrics_note=note or note_after,
        cumulative_accept_length=info.cumulative_accept_length,
        client_lag_ms=tuple(lag),
        worker_windows=worker_windows,
        sending_ended_at=sending_ended_at,
        cancelled=cancelled,
        clock_kept=kept,
    )


# ----- one server, then the fleet ---------------------------------------------------------------------------
async def _warm_up(client: ServerClient, config: BenchmarkConfig) -> None:
    """Short requests that are not prompts of the sample (so no measured prompt is already in the prefix cache)."""

    async def one(index: int) -> None:
        messages = [{"role": "user", "content": f"Warm-up {index}: count from 1 to 20."}]
        try:
            await client.chat(
                messages,
                config.sampling,
                config.model,
                max_tokens=min(WARMUP_MAX_TOKENS, config.max_tokens),
                timeout_s=config.request_timeout_s,
            )
        except RequestError as exc:
            print(f"  warm-up request on {client.url} failed ({exc}); continuing", flush=True)

    async with asyncio.TaskGroup() as group:
        for index in range(config.warmup_requests):
            group.create_task(one(index))


def _level_line(level: LevelRun) -> str:
    ok = [r for r in level.requests if r.ok]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    seconds = max(level.finished_at - level.started_at, 1e-9)
    usage = "" if all(r.usage_reported for r in ok) else " (usage missing: see the report)"
    return (
        f"  {level.server} c={level.concurrency}: {len(ok)}/{len(level.requests)} ok in {seconds:.1f}s, "
        f"{tokens / seconds:,.0f} tok/s{usage}"
    )


async def _run_server(
    client: ServerClient,
    facts: ServerFacts,
    config: BenchmarkConfig,
    sample: PromptSample,
    store: LevelStore,
) -> list[LevelRun]:
    per_server = sum(config.level_requests(c) for c in config.concurrencies)
    start = facts.index * per_server
    plan = []  # (concurrency, rows, identity, stored level or None)
    for concurrency in config.concurrencies:
        n = config.level_requests(concurrency)
        rows = sample.slice(start, n)
        start += n
        identity = level_identity(facts, config, concurrency, rows)
        stored = None
        if config.resume:
            stored, why = store.load(identity, facts.index, concurrency)
            if stored is None:
                print(f"  {facts.url} c={concurrency}: measuring ({why})", flush=True)
        plan.append((concurrency, rows, identity, stored))
    if config.warmup_requests and any(stored is None for *_, stored in plan):
        await _warm_up(client, config)
    levels = []
    for concurrency, rows, identity, stored in plan:
        if stored is not None:
            print(f"{_level_line(stored)} (reused: measured by an earlier run)", flush=True)
            levels.append(stored)
            continue
        level = await run_level(client, facts, config, concurrency, rows)
        store.save(identity, level)
        print(_level_line(level), flush=True)
        levels.append(level)
    return levels


async def run_benchmark(config: BenchmarkConfig) -> BenchmarkRun:
    """Benchmark every server at every concurrency level; returns raw records (see ``stats`` and ``report``)."""
    api_key = config.api_key()
    sample = await asyncio.to_thread(
        sample_prompts,
        config.prompt_path,
        config.prompts_needed(),
        config.seed,
        config.category_field or None,
    )
    print(
        f"prompts: {len(sample.rows)} sampled from {sample.path} ({sample.rows_read} valid rows, "
        f"{sample.rejected} rejected)",
        flush=True,
    )
    if config.sampling_plan:
        sample = sample.planned(config.sampling_plan)
        arms = ", ".join(a.name for a in config.sampling_plan)
        print(f"sampling plan: {len(sample.rows)} planned samples of them, arms {arms}", flush=True)
    store = LevelStore(Path(config.out_dir) / BENCH_LEVELS)
    store.remove_leftovers()
    if not config.resume:
        forgotten = store.clear()
        if forgotten:
            print(f"levels: {forgotten} stored by an earlier run in {store.root} discarded (resume=False)")
    clients = [
        ServerClient(url, api_key=api_key, timeout_s=config.request_timeout_s) for url in config.servers
    ]
    started_at = time.time()
    try:
        config = await _with_served_model(config, clients)
        found = await asyncio.gather(
            *(_server_facts(i, c, config) for i, c in enumerate(clients)), return_exceptions=True
        )
        problems = [str(f) for f in found if isinstance(f, BenchmarkError)]
        if problems:
            raise BenchmarkError("; ".join(problems))
        for item in found:
            if isinstance(item, BaseException):
                raise item
        facts = [f for f in found if isinstance(f, ServerFacts)]
        for f in facts:
            print(
                f"server {f.index} {f.url}: {f.engine} {f.version or ''}, max_running_requests "
                f"{f.max_running_requests or 'unknown'}, speculative {f.speculative_algorithm or 'off/unknown'}"
                + (f", simulated {f.hardware} at sim clock ×{f.clock_factor:g}" if f.hardware else ""),
                flush=True,
            )
        levels: list[LevelRun] = []
        if config.parallel_servers:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(_run_server(c, f, config, sample, store))
                    for c, f in zip(clients, facts, strict=True)
                ]
            for task in tasks:
                levels.extend(task.result())
        else:
            for client, fact in zip(clients, facts, strict=True):
                levels.extend(await _run_server(client, fact, config, sample, store))
    finally:
        for client in clients:
            await client.close()
    return BenchmarkRun(
        config=config,
        servers=tuple(facts),
        levels=tuple(levels),
        sample_size=len(sample.rows),
        sample_rows_read=sample.rows_read,
        sample_rejected=sample.rejected,
        started_at=started_at,
        finished_at=time.time(),
    )
