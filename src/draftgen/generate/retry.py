"""When to retry a failed request, how long to wait, and which failures count against a server."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from draftgen.client.errors import RequestError

SERVER_FAULT_STATUS = frozenset({500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_s: float = 1.0
    max_s: float = 60.0

    def should_retry(self, error: RequestError, attempts: int) -> bool:
        """Retry retryable errors (timeouts, connection, 408/429/5xx, protocol) until ``max_attempts``."""
        return error.retryable and attempts < self.max_attempts

    def delay(self, attempts: int, error: RequestError | None, rng: random.Random) -> float:
        """Exponential backoff with full jitter; a server's Retry-After is a floor, never shortened."""
        ceiling = min(self.max_s, self.base_s * 2 ** max(0, attempts - 1))
        wait = rng.uniform(0.0, ceiling)
        if error is not None and error.retry_after is not None:
            wait = max(wait, min(float(error.retry_after), self.max_s * 10))
        return wait


def counts_against_server(error: RequestError) -> bool:
    """Failures that say the server itself is unwell (not the prompt, not back-pressure like 429)."""
    if error.kind in ("connection", "timeout"):
        return True
    return error.kind == "http" and error.status in SERVER_FAULT_STATUS


T = TypeVar("T")


class RetryTimers(Generic[T]):
    """Retries waiting out their backoff: each calls ``due(item)`` when its time comes; cancelled at the end."""

    def __init__(self, due: Callable[[T], None]) -> None:
        self._due = due
        self._handles: dict[int, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def schedule(self, item: T, delay_s: float) -> None:
        self._handles[id(item)] = asyncio.get_running_loop().call_later(delay_s, self._fire, item)

    def _fire(self, item: T) -> None:
        self._handles.pop(id(item), None)
        self._due(item)

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
