"""How fast a server produces tokens with b requests in flight, read from the benchmark's own streams.

Every level sweeps its in-flight count: steady at the level's concurrency while prompts remain, then down to 1
as the last requests drain. Each streamed chunk is a moment of token production; a request's tokens are shared
evenly over its chunks. Summing seconds spent and tokens produced at each in-flight count gives the server's
rate curve, which the estimate extrapolates from (``draftgen.estimate.model``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import polars as pl

OCCUPANCY_SCHEMA = {
    "server": pl.String,
    "gpu": pl.Int64,
    "concurrency": pl.Int64,
    "in_flight": pl.Int64,
    "seconds": pl.Float64,
    "tokens": pl.Float64,
}
SPREAD_POINTS = 16  # token-production moments for a request that streamed no text chunks


def _token_moments(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    tokens = row.get("completion_tokens")
    if not row.get("ok") or not tokens:
        return np.empty(0), np.empty(0)
    start = row["started_at"]
    offsets = np.asarray(row.get("chunk_offsets") or [], dtype=float)
    if offsets.size == 0:
        first = row.get("ttft_s") or 0.0
        offsets = np.linspace(first, row["e2e_s"], SPREAD_POINTS)
    return start + offsets, np.full(offsets.size, float(tokens) / offsets.size)


def level_occupancy(rows: Iterable[Mapping[str, Any]]) -> dict[int, tuple[float, float]]:
    """{in-flight count: (seconds, tokens)} for the requests of ONE server at ONE level."""
    rows = list(rows)
    if not rows:
        return {}
    starts = np.sort(np.asarray([r["started_at"] for r in rows], dtype=float))
    ends = np.sort(np.asarray([r["started_at"] + r["e2e_s"] for r in rows], dtype=float))
    edges = np.unique(np.concatenate([starts, ends]))
    # In flight on [edges[i], edges[i+1]): sent at or before its start, not finished by then.
    in_flight = np.searchsorted(starts, edges[:-1], side="right") - np.searchsorted(
        ends, edges[:-1], side="right"
    )
    durations = np.diff(edges)
    out: dict[int, list[float]] = {}
    for b, seconds in zip(in_flight.tolist(), durations.tolist(), strict=True):
        if b > 0:
            out.setdefault(b, [0.0, 0.0])[0] += seconds
    moments = [_token_moments(r) for r in rows]
    times = np.concatenate([m[0] for m in moments]) if moments else np.empty(0)
    weights = np.concatenate([m[1] for m in moments]) if moments else np.empty(0)
    if times.size:
        # A chunk reports the step that ended when it arrived: count what was in flight just before it.
        b_at = np.searchsorted(starts, times, side="left") - np.searchsorted(ends, times, side="left")
        for b, tokens in zip(b_at.tolist(), weights.tolist(), strict=True):
            if b > 0:
                out.setdefault(b, [0.0, 0.0])[1] += tokens
    return {b: (v[0], v[1]) for b, v in sorted(out.items())}


def occupancy_frame(requests: pl.DataFrame) -> pl.DataFrame:
    """Seconds and tokens at each in-flight count, per server and level (the table occupancy.parquet holds)."""
    records = []
    for (server, gpu, concurrency), group in requests.group_by(
        ["server", "gpu", "concurrency"], maintain_order=True
    ):
        for b, (seconds, tokens) in level_occupancy(group.iter_rows(named=True)).items():
            records.append(
                {
                    "server": server,
                    "gpu": gpu,
                    "concurrency": concurrency,
                    "in_flight": b,
                    "seconds": seconds,
                    "tokens": tokens,
                }
            )
    return pl.DataFrame(records, schema=OCCUPANCY_SCHEMA)
