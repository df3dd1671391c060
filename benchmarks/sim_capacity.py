"""How many requests/s one simulated server sustains on the `instant` profile.

The figure tells whether the simulator can be the bottleneck when a client's own overhead is measured
against it: a client pipeline that reaches, say, 80% of these rates is measuring the simulator, not itself.

A bare aiohttp client loop (one session, C workers each sending back-to-back requests) drives one server
process. Each level is also run against GET /health on the same server, the HTTP stack's own ceiling for
that concurrency, so the printed ratio shows what the simulated request handling costs on top of aiohttp.
Client and server share this machine's cores, so the figures are lower bounds for a server alone.

    .venv/bin/python benchmarks/sim_capacity.py [--concurrency 1 8 32 64] [--requests 600] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass

import aiohttp

from draftgen.sim import SimFleet


@dataclass(frozen=True)
class Level:
    mode: str  # "health", "chat", "chat-stream", "generate"
    concurrency: int
    requests: int
    seconds: float
    tokens: int
    errors: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _body(mode: str, index: int, max_tokens: int) -> tuple[str, dict | None]:
    messages = [{"role": "user", "content": f"benchmark prompt {index}"}]
    if mode == "health":
        return "/health", None
    if mode == "generate":
        return "/generate", {
            "text": f"benchmark prompt {index}",
            "sampling_params": {"max_new_tokens": max_tokens},
        }
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens}
    if mode == "chat-stream":
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return "/v1/chat/completions", body


async def _one(session: aiohttp.ClientSession, base: str, mode: str, index: int, max_tokens: int) -> int:
    """Send one request and read all of it; returns completion tokens (0 for /health), -1 on an error."""
    path, body = _body(mode, index, max_tokens)
    if body is None:
        async with session.get(base + path) as response:
            await response.read()
            return 0 if response.status == 200 else -1
    async with session.post(base + path, json=body) as response:
        if response.status != 200:
            await response.read()
            return -1
        if mode != "chat-stream":
            reply = await response.json()
            usage = reply.get("usage") or reply.get("meta_info") or {}
            return int(usage.get("completion_tokens", 0))
        tokens = 0
        async for line in response.content:  # SSE lines; the usage chunk carries the count
            if line.startswith(b'data: {"id"') and b'"choices":[]' in line and b'"usage"' in line:
                tokens = int(line.split(b'"completion_tokens":')[1].split(b",")[0].split(b"}")[0])
        return tokens


async def run_level(base: str, mode: str, concurrency: int, requests: int, max_tokens: int) -> Level:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        for warm in range(min(concurrency, 8)):  # open connections before the clock starts
            await _one(session, base, mode, -1 - warm, max_tokens)
        next_index = iter(range(requests))
        results: list[int] = []

        async def worker() -> None:
            for index in next_index:
                results.append(await _one(session, base, mode, index, max_tokens))

        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
        seconds = time.perf_counter() - started
    return Level(
        mode=mode,
        concurrency=concurrency,
        requests=len(results),
        seconds=seconds,
        tokens=sum(r for r in results if r > 0),
        errors=sum(1 for r in results if r < 0),
    )


async def measure(
    base: str, levels: list[int], requests: int, max_tokens: int, modes: list[str]
) -> list[Level]:
    out = []
    for concurrency in levels:
        for mode in ["health", *modes]:
            out.append(await run_level(base, mode, concurrency, requests, max_tokens))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--requests", type=int, default=2000, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--modes", nargs="+", default=["chat", "chat-stream", "generate"])
    args = parser.parse_args()

    with SimFleet(servers=1, profile="instant") as fleet:
        levels = asyncio.run(
            measure(fleet.urls[0], args.concurrency, args.requests, args.max_tokens, args.modes)
        )
    print(
        f"one simulated server, profile instant, max_tokens {args.max_tokens}, {args.requests} requests per level, "
        f"client and server on the same {os.cpu_count()}-core machine"
    )
    print(f"{'mode':<12} {'conc':>5} {'req/s':>9} {'tok/s':>10} {'vs /health':>11} {'errors':>7}")
    baseline = {}
    for level in levels:
        if level.mode == "health":
            baseline[level.concurrency] = level.rate
        ratio = level.rate / baseline[level.concurrency]
        print(
            f"{level.mode:<12} {level.concurrency:>5} {level.rate:>9.0f} {level.tokens / level.seconds:>10.0f} "
            f"{ratio:>10.2f}x {level.errors:>7}"
        )


if __name__ == "__main__":
    main()
