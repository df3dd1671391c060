"""Durations and sizes in the unit a person would use (a dry run lasts seconds, the real job days), and servers by
the shortest name that tells them apart."""

from __future__ import annotations

from collections.abc import Sequence

UNITS = (("days", 86_400.0), ("h", 3_600.0), ("min", 60.0), ("s", 1.0))


def duration_unit(seconds: float) -> tuple[str, float]:
    """(unit, seconds per unit) for the largest unit in which ``seconds`` is at least 2."""
    for name, size in UNITS:
        if seconds >= 2 * size:
            return name, size
    return "s", 1.0


def duration(seconds: float, *, digits: int = 1) -> str:
    """``duration(1_425_600) == "16.5 days"``, ``duration(150) == "2.5 min"``, ``duration(95) == "95.0 s"``."""
    name, size = duration_unit(abs(seconds))
    return f"{seconds / size:,.{digits}f} {name}"


def seconds_range(values: Sequence[float]) -> str:
    """The spread of a few durations in one figure: ``12–14 s``, ``0.1–0.8 s``, or ``13 s`` when they round alike
    (how long servers took to start)."""
    low, high = min(values), max(values)
    digits = 1 if high < 10 else 0
    first, last = f"{low:.{digits}f}", f"{high:.{digits}f}"
    return f"{last} s" if first == last else f"{first}–{last} s"


def human_bytes(count: float) -> str:
    """``human_bytes(1_500_000) == "1.5 MB"`` (powers of 1000, as ``df -H``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def short_label(url: str) -> str:
    """``http://127.0.0.1:30003`` → ``:30003``; other hosts keep host:port."""
    rest = url.split("://", 1)[-1]
    host, _, port = rest.partition(":")
    if host in ("127.0.0.1", "localhost") and port:
        return ":" + port.split("/")[0]
    return rest
