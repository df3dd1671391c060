"""Figure (a): client CPU per completed request — draftgen's dispatch against a bare aiohttp request loop.

All three clients send the same chat requests (same prompts, max_tokens, thinking on) to the same simulated fleet on
the `instant` profile (no simulated GPU time, so the client's own cost is what is left), with the same number
in flight per server. CPU is this process's user+system time (resource.getrusage), so the servers' work (other
processes) is not counted. draftgen's figure includes everything a real run does: retries bookkeeping, the
garbage guard, progress bar, parquet shards with fsync, and the manifest.

    .venv/bin/python benchmarks/generate_client_cpu.py [--servers 2] [--requests 3000] [--concurrency 16]

``--fleet-rate`` measures instead what streaming with the loop check costs at the production rate: seven
``b200-mtp`` servers with 64 in flight each, at speed 1 (the simulated B200's own rate) and at speed 2 (twice it).
generate() runs the same prompts three ways at each speed, one after another: not streamed (the loop check reads
each whole answer), streamed without the loop check, streamed with it (the default). The client's CPU (this
process) is sampled every second; the figures are over the steady window (``--ramp`` seconds after the first
request to the last prompt's send): CPU-seconds per wall second (the share of one core), the tokens the fleet
produced there (the simulators' ground truth) and CPU per token, with each streamed way's ratio to the plain one.

    .venv/bin/python benchmarks/generate_client_cpu.py --fleet-rate [--fleet-prompts 2000] [--fleet-max-tokens 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
from generate_fleet_utilization import tokens_in
from sim_generate import MODEL, sim_generate_config

from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.generate import generate, preflight
from draftgen.params import SamplingParams
from draftgen.prompts.rows import PromptRow, iter_prompts
from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim import SimFleet


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def bare_loop(urls: list[str], prompts: list[PromptRow], concurrency: int, max_tokens: int) -> int:
    """The leanest honest client: one aiohttp session, C workers per server, JSON in, JSON out."""
    queue: asyncio.Queue[PromptRow] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    done = 0

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal done
        while not queue.empty():
            prompt = queue.get_nowait()
            body = {
                "model": MODEL,
                "messages": list(prompt.messages),
                "max_tokens": max_tokens,
                "temperature": 0.6,
                "top_p": 0.95,
                "chat_template_kwargs": {"enable_thinking": True},
            }
            async with session.post(f"{url}/v1/chat/completions", json=body) as reply:
                data = await reply.json()
            if data["choices"][0]["finish_reason"]:
                done += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with asyncio.TaskGroup() as group:
            for url in urls:
                for _ in range(concurrency):
                    group.create_task(worker(session, url))
    return done


async def client_loop(
    urls: list[str],
    prompts: list[PromptRow],
    concurrency: int,
    ask: Callable[[ServerClient, PromptRow], Awaitable[bool]],
    capabilities: Capabilities | None = None,
) -> int:
    """``concurrency`` workers per server, each through its server's ServerClient, until the prompts run out;
    counts the answers ``ask`` accepts."""
    queue: asyncio.Queue[PromptRow] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    done = 0

    async def worker(client: ServerClient) -> None:
        nonlocal done
        while not queue.empty():
            if await ask(client, queue.get_nowait()):
                done += 1

    clients = [ServerClient(url, capabilities=capabilities) for url in urls]
    try:
        async with asyncio.TaskGroup() as group:
            for client in clients:
                for _ in range(concurrency):
                    group.create_task(worker(client))
    finally:
        for client in clients:
            await client.close()
    return done


async def sdk_loop(urls: list[str], prompts: list[PromptRow], concurrency: int, max_tokens: int) -> int:
    """The same loop through draftgen's ServerClient.chat (one AsyncOpenAI per server, on the client's one
    aiohttp-backed httpx2 client): the SDK's share."""
    sampling = SamplingParams(max_tokens=max_tokens)

    async def ask(client: ServerClient, prompt: PromptRow) -> bool:
        return bool((await client.chat(prompt.messages, sampling, MODEL)).finish_reason)

    return await client_loop(urls, prompts, concurrency, ask)


async def raw_stream_loop(
    urls: list[str], prompts: list[PromptRow], concurrency: int, max_tokens: int, ids: bool
) -> int:
    """ServerClient.stream_chat (every stream: SSE decoded straight off the socket), with or without the token
    ids asked for."""
    sampling = SamplingParams(max_tokens=max_tokens)

    async def ask(client: ServerClient, prompt: PromptRow) -> bool:
        result = await client.stream_chat(prompt.messages, sampling, MODEL)
        return bool(result.finish_reason) and (result.output_ids is not None) == ids

    caps = Capabilities("sglang", token_ids="sglext" if ids else None)
    return await client_loop(urls, prompts, concurrency, ask, caps)


def measure(label: str, run) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    count = run()
    cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    print(
        f"{label:<28} {count:>6} requests  {wall:6.2f} s wall  {cpu:6.2f} s CPU  {1000 * cpu / count:6.3f} ms CPU/request  {count / wall:7.1f} req/s"
    )
    return cpu, wall, count


FLEET_WAYS = {  # (stream, loop_check)
    "plain, loop check on whole answers": (False, True),
    "streamed, no loop check": (True, False),
    "streamed + loop check (default)": (True, True),
}


async def sampled_generate(config, cpu_samples: list[tuple[float, float]]):  # type: ignore[no-untyped-def]
    """generate() with this process's CPU time sampled every second beside it (wall clock, CPU-seconds)."""

    async def sample() -> None:
        while True:
            cpu_samples.append((time.time(), cpu_seconds()))
            await asyncio.sleep(1.0)

    plan = await preflight(config)
    async with asyncio.TaskGroup() as group:
        sampler = group.create_task(sample())
        result = await generate(config, plan, progress=False)
        cpu_samples.append((time.time(), cpu_seconds()))
        sampler.cancel()
    return result


def cpu_between(samples: list[tuple[float, float]], t0: float, t1: float) -> tuple[float, float, float]:
    """(CPU-seconds, from, to): the CPU spent between the first and last samples inside [t0, t1]."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        raise RuntimeError("the steady window holds fewer than two CPU samples: give more prompts")
    return inside[-1][1] - inside[0][1], inside[0][0], inside[-1][0]


def fleet_rate(args: argparse.Namespace) -> None:
    """The client's CPU at the production rate (speed 1) and twice it (speed 2), three ways each."""
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        path = Path(tmp) / "prompts.jsonl"
        write_synthetic(path, args.fleet_prompts, seed=4)
        for speed in (1.0, 2.0):
            for way, (stream, loop_check) in FLEET_WAYS.items():
                work = Path(tmp) / f"speed{speed:g}-{stream}-{loop_check}"
                with SimFleet(servers=7, profile="b200-mtp", speed=speed, work_dir=work / "sim") as fleet:
                    config = sim_generate_config(
                        fleet,
                        path,
                        work / "run",
                        max_tokens=args.fleet_max_tokens,
                        concurrency_per_server=64,
                        stream=stream,
                        loop_check=loop_check,
                    )
                    samples: list[tuple[float, float]] = []
                    asyncio.run(sampled_generate(config, samples))
                    records = [
                        r for r in fleet.truth() if r.get("kind") == "chat" and r.get("outcome") == "ok"
                    ]
                    kept = [fleet.info(i)["clock_kept"] for i in range(7)]
                t0 = min(r["arrival"] for r in records) + args.ramp
                t1 = max(r["arrival"] for r in records)
                cpu, start, end = cpu_between(samples, t0, t1)
                wall = end - start
                tokens = sum(tokens_in(r, start, end) for r in records)
                clock = sum(k["planned_s"] for k in kept) / max(1e-9, sum(k["actual_s"] for k in kept))
                key = f"speed {speed:g}: {way}"
                figures[key] = {
                    "core_share": cpu / wall,
                    "tok_s": tokens / wall,
                    "us_cpu_per_token": 1e6 * cpu / max(1.0, tokens),
                    "window_s": wall,
                    "clock_kept": clock,
                }
                print(
                    f"{key:<50} {cpu / wall:6.1%} of one core  {tokens / wall:8,.0f} tok/s  "
                    f"{1e6 * cpu / max(1.0, tokens):6.1f} us CPU/token  window {wall:5.1f} s  clock kept {clock:.2f}",
                    flush=True,
                )
    for speed in (1.0, 2.0):
        plain = figures[f"speed {speed:g}: plain, loop check on whole answers"]
        for way in list(FLEET_WAYS)[1:]:
            this = figures[f"speed {speed:g}: {way}"]
            print(
                f"speed {speed:g}, {way} / plain: {this['core_share'] / plain['core_share']:.2f}x the core share, "
                f"{this['us_cpu_per_token'] / plain['us_cpu_per_token']:.2f}x the CPU per token"
            )
    print(json.dumps({k: {n: round(v, 4) for n, v in f.items()} for k, f in figures.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16, help="in flight per server")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--fleet-rate", action="store_true", help="streaming's CPU at the production rate instead (above)"
    )
    parser.add_argument("--fleet-prompts", type=int, default=2000)
    parser.add_argument("--fleet-max-tokens", type=int, default=1024)
    parser.add_argument(
        "--ramp", type=float, default=10.0, help="--fleet-rate: seconds left out at the start"
    )
    args = parser.parse_args()
    if args.fleet_rate:
        fleet_rate(args)
        return
    with (
        tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp,
        SimFleet(servers=args.servers, profile="instant", work_dir=Path(tmp) / "sim") as fleet,
    ):
        path = Path(tmp) / "prompts.jsonl"
        write_synthetic(path, args.requests, seed=1)
        prompts = [r for r in iter_prompts(path) if isinstance(r, PromptRow)]
        print(
            f"{args.servers} simulated servers (instant), {args.requests} requests, {args.concurrency} in flight each"
        )
        # warm both paths once (imports, connection pools)
        asyncio.run(bare_loop(fleet.urls, prompts[:50], 4, args.max_tokens))
        bare = measure(
            "bare aiohttp loop",
            lambda: asyncio.run(bare_loop(fleet.urls, prompts, args.concurrency, args.max_tokens)),
        )
        asyncio.run(sdk_loop(fleet.urls, prompts[:50], 4, args.max_tokens))
        sdk = measure(
            "ServerClient.chat loop (SDK)",
            lambda: asyncio.run(sdk_loop(fleet.urls, prompts, args.concurrency, args.max_tokens)),
        )
        raw = {}
        for ids in (False, True):
            raw[ids] = measure(
                f"stream_chat, {'with' if ids else 'no'} ids",
                lambda ids=ids: asyncio.run(
                    raw_stream_loop(fleet.urls, prompts, args.concurrency, args.max_tokens, ids)
                ),
            )
        config = sim_generate_config(
            fleet,
            path,
            Path(tmp) / "run",
            max_tokens=args.max_tokens,
            concurrency_per_server=args.concurrency,
        )

        async def draftgen_run(ids: bool, stream: bool, out: str) -> float:
            """CPU per request of generate() alone; ``ids`` false: the servers' token ids neither asked for nor
            stored (what draftgen did before it read them)."""
            run_config = config.model_copy(update={"out_dir": str(Path(tmp) / out), "stream": stream})
            plan = await preflight(run_config)
            if not ids:
                plan.servers[:] = [
                    replace(s, capabilities=replace(s.capabilities, token_ids=None)) for s in plan.servers
                ]
            cpu0 = cpu_seconds()
            result = await generate(run_config, plan, progress=False)
            return (cpu_seconds() - cpu0) / result.completed

        figures: dict[tuple[bool, bool], float] = {}
        for rep in range(3):  # interleaved, best of three: load from elsewhere only ever adds CPU time
            for stream in (False, True):
                for ids in (False, True):
                    name = f"run-{rep}-{'stream' if stream else 'plain'}-{'ids' if ids else 'no-ids'}"
                    value = asyncio.run(draftgen_run(ids, stream, name))
                    figures[(stream, ids)] = min(value, figures.get((stream, ids), value))
        print(
            f"{'draftgen generate()':<28} {args.requests:>6} requests  {'':>14}  {'':>10}  "
            f"{1000 * figures[(False, True)]:6.3f} ms CPU/request (plain, with ids: the default)"
        )
        for stream in (False, True):
            before, after = figures[(stream, False)], figures[(stream, True)]
            print(
                f"  token ids, generate {'stream    ' if stream else 'SDK plain '}: without {1000 * before:6.3f}, with "
                f"{1000 * after:6.3f} ms CPU/request ({after / before:.2f}x)"
            )
    per_bare = bare[0] / bare[2]
    per_sdk = sdk[0] / sdk[2]
    per_ours = figures[(False, True)]
    raw_before, raw_after = raw[False][0] / raw[False][2], raw[True][0] / raw[True][2]
    print(
        f"token ids on the streamed path: without {1000 * raw_before:.3f}, with {1000 * raw_after:.3f} ms CPU/request "
        f"({raw_after / raw_before:.2f}x)"
    )
    print(f"draftgen / bare aiohttp loop: {per_ours / per_bare:.2f}x CPU per request")
    print(f"  openai SDK loop / bare aiohttp loop: {per_sdk / per_bare:.2f}x (the client library)")
    print(
        f"  draftgen / openai SDK loop: {per_ours / per_sdk:.2f}x (dispatch, guard, store, progress on top)"
    )
    print(
        json.dumps(
            {
                "bare_ms_cpu_per_request": round(1000 * per_bare, 3),
                "sdk_ms_cpu_per_request": round(1000 * per_sdk, 3),
                "draftgen_ms_cpu_per_request": round(1000 * per_ours, 3),
                "ratio_draftgen_to_bare": round(per_ours / per_bare, 2),
                "ratio_draftgen_to_sdk": round(per_ours / per_sdk, 2),
                "token_ids_ms_cpu_per_request": {
                    f"{'stream' if stream else 'plain'}_{'with' if ids else 'without'}": round(
                        1000 * value, 3
                    )
                    for (stream, ids), value in figures.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
