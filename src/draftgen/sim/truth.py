"""A simulated server's ground truth: one record per request, of what it really did (``/sim/truth``, ``--truth``).

Tests and benchmarks compare what a client measured with it: when each request arrived, was admitted, gave its first
token and finished, what it generated and why it ended, and what it would have generated left alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from draftgen.sim.engine import SimRequest


class GroundTruth:
    """The records in order, kept in memory and, with a ``path``, appended to it line by line as they come."""

    def __init__(self, server: str, path: Path | None = None):
        self.server = server
        self.records: list[dict[str, Any]] = []
        self._file = open(path, "a", buffering=1) if path else None

    def _add(self, record: dict[str, Any]) -> None:
        record["server"] = self.server
        self.records.append(record)
        if self._file:
            self._file.write(json.dumps(record) + "\n")

    def finished(self, request: SimRequest) -> None:
        self._add(
            {
                "rid": request.rid,
                "kind": request.kind,
                "outcome": request.outcome,
                "finish_type": request.finish_type,
                "stream": request.stream,
                "arrival": request.arrival,
                "admitted": request.admitted,
                "first_token": request.first_token,
                "finished": request.finished,
                "prompt_tokens": request.prompt_tokens,
                "cached_tokens": request.cached_tokens,
                "max_tokens": request.max_tokens,
                "completion_tokens": request.emitted,
                "verify_steps": request.verify_steps,
                "seed": request.seed,
                "noncanonical": request.plan.noncanonical,
                # what it would have generated, left alone (a request ended early generated completion_tokens)
                "planned_tokens": request.plan.completion_tokens,
                "loop_start": request.plan.loop_start,
                "loop_period": request.plan.loop_period,
                "category": request.category,
                "temperature": request.temperature,
                "accept_expected": request.accept_expected,
                "emit_times": request.emit_times if request.stream else None,
                "emit_counts": request.emit_counts if request.stream else None,
            }
        )

    def rejected(self, rid: str, kind: str, outcome: str, status: int) -> None:
        """A request refused or lost before the engine took it (overloaded, an injected error, hung)."""
        now = time.time()
        self._add(
            {
                "rid": rid,
                "kind": kind,
                "outcome": outcome,
                "http_status": status,
                "arrival": now,
                "finished": now,
                "completion_tokens": 0,
                "verify_steps": 0,
            }
        )

    def flush(self) -> None:
        if self._file:
            self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
