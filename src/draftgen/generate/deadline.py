"""When to presume a request hung: learned from how fast the server really answers, not a fixed half hour.

A fixed ``request_timeout_s`` must allow for the slowest legitimate request, so it is generous (1800 s) and a
request that hangs while ``/health`` says 200 holds its slot that long; a wedged server holds all of its slots.
Once a server has answered enough requests, a request there is presumed hung after ``hang_factor`` times the
time ``max_tokens`` would take at a slow (5th-percentile) per-request rate seen on that server, but never sooner
than ``hang_min_s`` and never later than ``request_timeout_s``. Rates include queueing and prefill, so they err
slow: the deadline errs long. A prompt presumed hung once gets twice the deadline on its next try, and so on, so
a false alarm costs one retry, not the prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from draftgen.client.errors import RequestError

MIN_SAMPLES = 50  # completions a server must have answered before its deadline is learned
WINDOW = 1000  # recent completions per server the rate is read from
SLOW_PERCENTILE = 5.0
REFRESH_EVERY = 25  # completions between recomputations


@dataclass(frozen=True)
class HangPolicy:
    request_timeout_s: float  # the hard limit, always
    max_tokens: int
    factor: float  # 0: no learned deadline, only request_timeout_s
    min_s: float


class ServerDeadline:
    """One server's learned deadline; ``observe`` every completion, ``timeout_s`` before every send."""

    def __init__(self, policy: HangPolicy) -> None:
        self.policy = policy
        self._rates: deque[float] = deque(maxlen=WINDOW)
        self._since_refresh = 0
        self.slow_rate: float | None = None  # tokens/s per request at the slow percentile, once learned
        self.learned_s: float | None = None  # the deadline before any doubling, once learned

    def observe(self, completion_tokens: int | None, latency_s: float) -> bool:
        """Record one completed request; True the first time this makes the deadline known (for the log)."""
        if self.policy.factor <= 0 or not completion_tokens or latency_s <= 0:
            return False
        self._rates.append(completion_tokens / latency_s)
        self._since_refresh += 1
        first = self.learned_s is None and len(self._rates) >= MIN_SAMPLES
        if first or (self.learned_s is not None and self._since_refresh >= REFRESH_EVERY):
            self._since_refresh = 0
            self.slow_rate = float(np.percentile(np.fromiter(self._rates, float), SLOW_PERCENTILE))
            policy = self.policy
            self.learned_s = max(policy.min_s, policy.factor * policy.max_tokens / self.slow_rate)
        return first

    def timeout_s(self, presumed_hung_before: int = 0) -> float:
        """Seconds the next request may take; doubles for each earlier time this prompt was presumed hung."""
        hard = self.policy.request_timeout_s
        if self.learned_s is None:
            return hard
        return min(hard, self.learned_s * 2.0**presumed_hung_before)

    def learned_note(self) -> str:
        """The event log's line when the deadline is first learned."""
        return (
            f"hang deadline learned: {self.timeout_s():.0f} s (slow rate {self.slow_rate:.1f} tok/s per request; "
            f"request_timeout_s {self.policy.request_timeout_s:g} s stays the hard limit)"
        )

    def timeout_error(self, timeout_s: float) -> RequestError:
        """What a request that ran out of ``timeout_s`` failed with: the hard limit, or a presumed hang."""
        policy = self.policy
        if timeout_s >= policy.request_timeout_s:
            return RequestError("timeout", f"no answer within request_timeout_s={policy.request_timeout_s:g}")
        return RequestError(
            "timeout",
            f"presumed hung: no answer within {timeout_s:.0f} s (hang_factor {policy.factor:g} x max_tokens at "
            f"this server's slow rate of {self.slow_rate:.1f} tok/s per request); the next try gets twice as long",
        )
