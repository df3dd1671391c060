"""Which clock a run's times and rates are stated on: the hardware's.

Against real servers that is the wall clock. Against ``draftgen sim --speed X`` the simulated GPUs run X times
faster than the wall clock, so a wall-clock tok/s is X times the simulated GPU's and a wall-clock duration X times
too short. Reports state figures on the hardware's clock (tok/s ÷ X, seconds × X) and say so; the raw
wall-clock measurements stay in the data files, which record the factor beside them. Convert exactly once, where
a raw measurement becomes a reported figure (``HardwareClock.seconds`` / ``rate``), never a figure twice.

The factor comes from the simulator's ``GET /sim/info`` (its ``speed``); a server without it (SGLang, vLLM, ...)
runs on the wall clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the clock's records are read by reports that send nothing: no HTTP stack imported
    from draftgen.client.server import ServerClient

HARDWARE = {"b200-mtp": "B200", "rtx-pro-6000": "RTX PRO 6000"}  # simulator profile → the GPU it stands for
# Columns of raw wall-clock figures: durations (window_s, ttft_s_p50, median_latency_s, ...) and rates.
_SECONDS = re.compile(r"(^|_)(window|ttft|itl|tpot|e2e|latency|span|wall)_s($|_)")
_RATE = re.compile(r"(^|_)(tok_s|requests_per_s)($|_)")


@dataclass(frozen=True)
class HardwareClock:
    """Hardware seconds per wall-clock second (``factor``) and what the hardware is."""

    factor: float = 1.0  # 1.0: real servers (or nothing known); X: draftgen sim --speed X
    hardware: str | None = None  # "B200" for the b200-mtp profile; None on real servers
    source: str = "wall clock"  # where the factor came from

    @property
    def simulated(self) -> bool:
        return self.hardware is not None

    def seconds(self, wall_s: float) -> float:
        """A wall-clock duration as the hardware's."""
        return wall_s * self.factor

    def rate(self, per_wall_s: float) -> float:
        """A per-wall-clock-second rate as the hardware's."""
        return per_wall_s / self.factor

    @property
    def per_gpu(self) -> str:
        """``"per simulated B200"`` or ``"per GPU"``: for axis labels and table captions."""
        return f"per simulated {self.hardware}" if self.simulated else "per GPU"

    @property
    def note(self) -> str:
        """One line saying which clock the figures are on; "" on the wall clock."""
        if not self.simulated:
            return ""
        if self.factor == 1.0:
            return f"times and rates of the simulated {self.hardware} (sim clock ×1: the wall clock)"
        x = f"{self.factor:g}"
        return (
            f"times and rates on the simulated {self.hardware}'s clock (sim clock ×{x} — wall-clock tok/s ÷{x}, "
            f"wall-clock seconds ×{x})"
        )

    @property
    def short(self) -> str:
        """``"simulated B200 clock, sim ×5"`` or ``"wall clock"``."""
        return f"simulated {self.hardware} clock, sim ×{self.factor:g}" if self.simulated else "wall clock"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "note": self.note}

    @classmethod
    def from_dict(cls, data: Any) -> HardwareClock:
        """The clock a data file recorded; files written before clocks were recorded are on the wall clock."""
        if not isinstance(data, dict):
            return cls()
        factor = data.get("factor", 1.0)
        if not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"clock factor must be a positive number, got {factor!r}")
        return cls(float(factor), data.get("hardware"), str(data.get("source", "")))


WALL = HardwareClock()


def clock_from_sim_info(info: Any) -> HardwareClock:
    """The clock a ``/sim/info`` reply describes; the wall clock when the reply is not the simulator's."""
    if not isinstance(info, dict) or not isinstance(info.get("profile"), dict):
        return WALL
    if info["profile"].get("instant"):
        return WALL  # no simulated hardware: no waits at all, nothing to state on another clock
    speed = info.get("speed")
    if not isinstance(speed, (int, float)) or not math.isfinite(speed) or speed <= 0:
        return WALL
    profile = str(info["profile"].get("name") or "simulated")
    return HardwareClock(
        float(speed),
        HARDWARE.get(profile, profile),
        f"draftgen sim /sim/info: profile {profile}, speed {speed:g}",
    )


async def read_clock_kept(client: ServerClient) -> tuple[float, float] | None:
    """The simulator's ``clock_kept`` counters now: wall seconds its steps should have taken, and took (None: not
    the simulator). On a starved machine a simulator falls behind its clock (the second grows faster)."""
    info = await client.sim_info()
    kept = info.get("clock_kept") if info is not None else None
    if not isinstance(kept, dict):
        return None
    planned, actual = kept.get("planned_s"), kept.get("actual_s")
    if not isinstance(planned, (int, float)) or not isinstance(actual, (int, float)):
        return None
    return float(planned), float(actual)


def kept_share(
    before: Sequence[tuple[float, float] | None], after: Sequence[tuple[float, float] | None]
) -> float | None:
    """The share of its clock a simulated fleet kept between two readings (1.0: on time; 0.8: its steps took 25%
    longer than simulated), its servers together; None when no server is a simulator or nothing ran.

    A window of wall time W then holds W × factor × share seconds of the simulated hardware: reports state the
    simulated GPU's time as the simulator really kept it, so a loaded machine does not make it look slower."""
    planned = actual = 0.0
    for start, end in zip(before, after, strict=True):
        if start is None or end is None:
            continue
        planned += end[0] - start[0]
        actual += end[1] - start[1]
    if planned <= 0 or actual <= 0:
        return None
    return min(1.0, planned / actual)


async def read_clock(client: ServerClient) -> HardwareClock:
    """One server's clock: ``GET /sim/info`` answers only on ``draftgen sim`` (404 elsewhere: the wall clock)."""
    return clock_from_sim_info(await client.sim_info())


def fleet_clock(clocks: Sequence[HardwareClock]) -> tuple[HardwareClock, str]:
    """One clock for a fleet, and a warning ("" if none) when its servers disagree (then: the wall clock)."""
    kinds = {(c.factor, c.hardware) for c in clocks}
    if len(kinds) <= 1:
        return (clocks[0] if clocks else WALL), ""
    described = ", ".join(sorted({c.short for c in clocks}))
    return WALL, (
        f"the servers run on different clocks ({described}): figures stay on the wall clock; "
        "benchmark or generate servers of one kind and speed together to state them on the hardware's clock"
    )


def _scaled(name: str) -> str | None:
    if _RATE.search(name):
        return "rate"
    if _SECONDS.search(name):
        return "seconds"
    return None


def on_kept_clock(frame: Any, column: str = "clock_kept") -> Any:
    """A frame already on the hardware's clock, its durations and rates put on the clock the simulator kept, row by
    row (``column``: each row's kept share; null or absent: 1). Seconds × share, rates ÷ share."""
    import polars as pl

    if column not in frame.columns:
        return frame
    share = pl.col(column).fill_null(1.0)
    changes = []
    for name in frame.columns:
        kind = _scaled(name)
        if kind == "seconds":
            changes.append(pl.col(name) * share)
        elif kind == "rate":
            changes.append(pl.col(name) / share)
    return frame.with_columns(changes) if changes else frame


def on_clock(frame: Any, clock: HardwareClock) -> Any:
    """A polars frame of raw wall-clock figures with its durations (``*_s``, ``*_s_p50``...) and rates
    (``*tok_s``, ``requests_per_s``) on ``clock``; other columns as they are. Unchanged on the wall clock."""
    import polars as pl

    if clock.factor == 1.0:
        return frame
    changes = []
    for name in frame.columns:
        kind = _scaled(name)
        if kind == "seconds":
            changes.append(pl.col(name) * clock.factor)
        elif kind == "rate":
            changes.append(pl.col(name) / clock.factor)
    return frame.with_columns(changes) if changes else frame
