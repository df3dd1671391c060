"""The one retry policy: whether a failed request is tried again and how long to wait first.

Generate's dispatch schedules its retries on ``RetryTimers`` (a prompt waiting out its backoff holds no worker);
one-off requests such as preflight's probe and canary go through ``retrying``. Both ask ``RetryPolicy``, which reads
only the classified ``RequestError``, so a failure means the same thing to every caller.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from draftgen.client.errors import RequestError


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


# A one-off request (a probe, a canary) tried again after a transient failure — one 500, 429 or slow first answer
# should not stop a run or a benchmark: waits of up to 1 s, then 2 s (Retry-After honoured).
PROBE_RETRY = RetryPolicy(max_attempts=3, base_s=1.0, max_s=2.0)

T = TypeVar("T")


async def retrying(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """``await call()``, tried again after each failure the policy retries; the last failure is raised."""
    rng = rng or random.Random()
    attempts = 0
    while True:
        attempts += 1
        try:
            return await call()
        except RequestError as exc:
            if not policy.should_retry(exc, attempts):
                raise
            await sleep(policy.delay(attempts, exc, rng))


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
