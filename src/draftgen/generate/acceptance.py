"""MTP acceptance per worker over time, from each worker's ``/metrics`` counter differences.

Per-request acceptance (``sglext``) is absent from older SGLang and from vLLM, and from any gateway that drops
``return_spec_tokens_details`` (the retired sglang-router did; SMG passes it, and then its answers carry it and
nothing is scraped). The workers' own counters still say it: every
``acceptance_interval_s`` the sampler scrapes each worker and records, for the window since its last scrape,
the tokens generated, the verify calls and their ratio (SGLang: ``sglang:generation_tokens_total /
sglang:spec_verify_calls_total``; vLLM: ``1 + accepted / drafts``). The workers are the servers themselves, or,
for a gateway without per-request acceptance, the URLs of its ``GET /workers`` list. Rows go to ``out_dir/acceptance.parquet`` (sessions
appended), read back by ``report.acceptance``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from draftgen.client.introspect import GATEWAY
from draftgen.client.metrics import (
    MetricsParseError,
    MetricsSnapshot,
    acceptance_length,
    counter_window,
    generated_tokens,
    parse_metrics,
)
from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.rundir import write_parquet
from draftgen.rundir.layout import ACCEPTANCE as ACCEPTANCE_FILE

SCRAPE_TIMEOUT_S = 10.0
ACCEPTANCE_SCHEMA = {
    "worker": pl.String,
    "via": pl.String,
    "started_at": pl.Float64,
    "ended_at": pl.Float64,
    "generated_tokens": pl.Float64,
    "accept_length": pl.Float64,
    "source": pl.String,
}


@dataclass(frozen=True)
class MetricsTarget:
    worker: str  # the URL scraped
    via: str  # the server URL requests were sent to (the gateway, or the worker itself)


@dataclass(frozen=True)
class AcceptanceSample:
    worker: str
    via: str
    started_at: float  # wall clock of the window's first scrape
    ended_at: float
    generated_tokens: float | None
    accept_length: float | None  # None: no verify calls in the window (idle, or no speculative decoding)
    source: str  # how it was computed, or why it is missing


def metrics_targets(servers: Sequence[tuple[str, Capabilities]]) -> list[MetricsTarget]:
    """Whom to scrape: the workers of each gateway whose answers lack ``sglext``, and each server that serves
    /metrics itself. A gateway that passes per-request acceptance needs no scrape."""
    targets: list[MetricsTarget] = []
    for url, caps in servers:
        if caps.engine == GATEWAY:
            if not caps.spec_details:
                targets += [MetricsTarget(worker, url) for worker in caps.workers]
        elif caps.metrics:
            targets.append(MetricsTarget(url, url))
    return targets


def describe_source(caps: Capabilities) -> str:
    """Where this server's acceptance figures come from, for preflight's engine row."""
    if caps.engine == GATEWAY:
        if caps.spec_details:
            return f"{GATEWAY}: acceptance per request (sglext) through the gateway"
        if not caps.workers:
            return "acceptance unknown: the gateway lists no workers (GET /workers)"
        return (
            f"acceptance per worker over time from the /metrics of its {len(caps.workers)} worker(s) "
            "(the gateway's answers carry no sglext)"
        )
    if caps.spec_details:
        return "acceptance per request (sglext)"
    if caps.metrics:
        return "acceptance over time from this server's /metrics counters (no per-request sglext)"
    return "no acceptance data: neither sglext nor /metrics"


class AcceptanceSampler:
    """Scrapes every target each ``interval_s`` while ``run`` is awaited; ``samples`` holds the windows."""

    def __init__(self, targets: Sequence[MetricsTarget], interval_s: float, *, api_key: str = "EMPTY"):
        self.targets = list(targets)
        self.interval_s = interval_s
        self.samples: list[AcceptanceSample] = []
        self._clients = {t.worker: ServerClient(t.worker, api_key=api_key) for t in self.targets}
        self._last: dict[str, MetricsSnapshot] = {}

    async def _scrape(self, target: MetricsTarget) -> None:
        client = self._clients[target.worker]
        text = await client.metrics_text(SCRAPE_TIMEOUT_S)
        if text is None:
            return  # a worker down right now: its next window spans the gap
        try:
            snapshot = parse_metrics(text)
        except MetricsParseError:
            return
        before = self._last.get(target.worker)
        self._last[target.worker] = snapshot
        if before is None:
            return
        window = counter_window(before, snapshot)
        if window.reset:  # the worker restarted: this window's differences mean nothing
            return
        tokens = generated_tokens(window)
        found = acceptance_length(window)
        source = found[1] if found else "no verify calls in the window"
        self.samples.append(
            AcceptanceSample(
                worker=target.worker,
                via=target.via,
                started_at=before.taken_at,
                ended_at=snapshot.taken_at,
                generated_tokens=tokens[0] if tokens else None,
                accept_length=found[0] if found else None,
                source=source,
            )
        )

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape(t) for t in self.targets))

    async def run(self) -> None:
        """Scrape now and every ``interval_s`` until cancelled (then once more, so the tail is counted)."""
        try:
            while True:
                await self.scrape_all()
                await asyncio.sleep(self.interval_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._final())

    async def _final(self) -> None:
        await self.scrape_all()
        await self.close()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()


def write_samples(out_dir: str | Path, samples: Sequence[AcceptanceSample]) -> Path | None:
    """Append this session's windows to ``out_dir/acceptance.parquet`` (atomically replaced)."""
    if not samples:
        return None
    path = Path(out_dir) / ACCEPTANCE_FILE
    frame = pl.DataFrame([asdict(s) for s in samples], schema=ACCEPTANCE_SCHEMA)
    if path.exists():
        frame = pl.concat([pl.read_parquet(path), frame])
    return write_parquet(path, frame)


def read_samples(out_dir: str | Path) -> pl.DataFrame:
    path = Path(out_dir) / ACCEPTANCE_FILE
    if not path.exists():
        return pl.DataFrame(schema=ACCEPTANCE_SCHEMA)
    return pl.read_parquet(path)


def per_worker(frame: pl.DataFrame) -> pl.DataFrame:
    """Token-weighted mean acceptance per worker over the whole run, with its windows and spread."""
    if frame.is_empty():
        return pl.DataFrame(schema={"worker": pl.String, "via": pl.String, "windows": pl.UInt32})
    measured = frame.filter(pl.col("accept_length").is_not_null() & (pl.col("generated_tokens") > 0))
    return (
        measured.with_columns((pl.col("generated_tokens") / pl.col("accept_length")).alias("verify_calls"))
        .group_by("worker", "via")
        .agg(
            pl.len().alias("windows"),
            pl.col("generated_tokens").sum().alias("generated_tokens"),
            (pl.col("generated_tokens").sum() / pl.col("verify_calls").sum()).round(3).alias("accept_length"),
            pl.col("accept_length").min().round(3).alias("min_window"),
            pl.col("accept_length").max().round(3).alias("max_window"),
            (pl.col("ended_at").max() - pl.col("started_at").min()).round(1).alias("span_s"),
        )
        .sort("worker")
    )
