"""One row of generate's preflight table: what was checked, on what, how it went ("ok", "info", "warn", "fail"),
and what was found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    check: str
    target: str
    status: str  # "ok", "info", "warn", "fail"
    detail: str
