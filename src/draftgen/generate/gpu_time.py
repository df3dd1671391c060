"""GPU time a generate run held, from its manifest's session records, on the hardware's clock.

A session records its wall-clock start and end, the servers' clock factor (``draftgen sim --speed X``: X) and, on the
simulator, the share of that clock its servers kept (``clock_kept``: below 1 when a busy machine made them run
late). Its hardware time is wall × factor × kept, and its GPU time that × the servers it ran on. The generate report,
``draftgen status`` and the dataset card divide it by the trained tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Session = Mapping[str, Any]


def kept_share_of(sessions: Sequence[Session]) -> float:
    """The share of its clock a simulated fleet kept over these sessions, weighted by their length (1.0: real
    servers, or sessions recorded before it was measured)."""
    weights = [(s["ended_at"] - s["started_at"], s.get("clock_kept") or 1.0) for s in sessions]
    total = sum(w for w, _ in weights)
    return sum(w * k for w, k in weights) / total if total > 0 else 1.0


def gpu_seconds(sessions: Sequence[Session]) -> float:
    """GPU-seconds the sessions held their servers, on the hardware's clock: each session's length × clock factor
    × the share of its clock the simulator kept × the servers it ran on."""
    return sum(
        (s["ended_at"] - s["started_at"])
        * float(s.get("clock_factor") or 1.0)
        * float(s.get("clock_kept") or 1.0)
        * max(1, len(s.get("servers") or ()))
        for s in sessions
    )


def per_million(
    gpu_s: float, trained_tokens: int, gpu_hour_usd: float | None = None
) -> dict[str, float | None]:
    """GPU-seconds (and dollars, given a price) per million trained tokens; None without trained tokens."""
    if not trained_tokens:
        return {"gpu_s_per_m_trained": None, "usd_per_m_trained": None}
    seconds = gpu_s / trained_tokens * 1e6
    return {
        "gpu_s_per_m_trained": seconds,
        "usd_per_m_trained": seconds / 3600.0 * gpu_hour_usd if gpu_hour_usd is not None else None,
    }
