"""The start-up wave: GPU capacity left idle while the first requests were sent and admitted, from the servers' gauges.

At the start of a session every slot is empty: the client builds and sends the first wave (hundreds of requests at
once) and each server admits them. The estimate models the run from a full batch on (and its drain), so this wave
is the one part of a run it does not price: seconds on a GPU node, small beside days, but on a sped-up simulator a
busy client's seconds count five times over. While the wave goes out, each server's ``sglang:num_running_reqs``
gauge (``/metrics``) is read every ``interval_s`` until the server is full (a queue forms, or it runs as many as the
client keeps in flight there); the capacity it left idle until then, ∫ (1 − running ÷ full) dt, is the wave's cost.
The report states it and compares the estimate with the generation's span less it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from draftgen.client.metrics import MetricsParseError, parse_metrics
from draftgen.client.server import ServerClient

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
GIVE_UP_S = 120.0  # a wave not full by then (few prompts, or a slow start) is measured as far as it went


@dataclass
class _Server:
    url: str
    client: ServerClient
    samples: list[tuple[float, float]]  # (time, running)
    full: float | None = None  # running when it became full


def _idle_seconds(samples: list[tuple[float, float]], full: float, start: float) -> float:
    """∫ (1 − running ÷ full) dt from ``start`` to the last sample, running held from each sample to the next."""
    idle, previous_t, previous_running = 0.0, start, 0.0
    for t, running in samples:
        idle += (t - previous_t) * max(0.0, 1.0 - previous_running / full)
        previous_t, previous_running = t, running
    return idle


async def measure_ramp(
    urls: Sequence[str], in_flight: int, *, api_key: str = "EMPTY", interval_s: float = 0.1
) -> float | None:
    """Wall seconds of the fleet's capacity idle during the start-up wave (mean over its servers), measured from
    now; None when no server answers /metrics with the running gauge or none filled up (cancelled before)."""
    start = time.time()
    servers = [_Server(url, ServerClient(url, api_key=api_key), []) for url in urls]
    try:
        while time.time() - start < GIVE_UP_S and any(s.full is None for s in servers):
            for server in servers:
                if server.full is None:
                    await _sample(server, in_flight)
            await asyncio.sleep(interval_s)
    except asyncio.CancelledError:
        pass
    finally:
        for server in servers:
            await server.client.close()
    # A server that never filled (a run shorter than one wave, no /metrics) says nothing about the wave.
    measured = [s for s in servers if s.samples and s.full]
    if not measured:
        return None
    idle = [_idle_seconds(s.samples, s.full or 1.0, start) for s in measured]
    return sum(idle) / len(idle)


async def _sample(server: _Server, in_flight: int) -> None:
    text = await server.client.metrics_text()
    if text is None:
        server.full = 0.0  # no /metrics: nothing to measure here
        return
    try:
        gauges = parse_metrics(text).gauges
    except MetricsParseError:
        server.full = 0.0
        return
    running = gauges.get(RUNNING)
    if running is None:
        server.full = 0.0
        return
    server.samples.append((time.time(), running))
    if running > 0 and (gauges.get(QUEUED, 0.0) > 0 or running >= in_flight):
        server.full = running
