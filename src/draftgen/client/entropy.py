"""How flat the target's next-token distribution was over a turn, from its top-k logprobs: a few floats per turn.

Tokens where the target spreads its probability (flat) teach a drafter more than those where it is sure (arXiv
2601.18902: training on the flattest half of the data keeps nearly all the speed-up). Selecting data by that
later needs the target's distribution, which only the generating run sees; storing its logprobs would cost
kilobytes per token, so each token's top-k entropy is folded into a per-turn summary as the answer arrives.

A token's **top-k entropy**, in nats: −Σ p ln p over its k alternatives (``top_logprobs``), the probability they
leave (1 − Σ p) counted as one more outcome. It is a lower bound of the whole distribution's entropy, exact when
the k hold all of it; 0 for a token the target was sure of.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

QUANTILES = (0.1, 0.5, 0.9)
FIELDS = ("tokens", "mean", "p10", "p50", "p90")  # the stored struct's fields (generate's turn_entropy)


def top_k_entropy(alternatives: Iterable[Mapping[str, Any]]) -> float | None:
    """The top-k entropy of one token's ``top_logprobs`` (None when it has none). Every streamed token passes
    here k times: kept to a plain loop (a logprob of -inf, as an engine may send for a masked token, adds 0)."""
    total = entropy = 0.0
    seen = False
    exp = math.exp
    for alternative in alternatives:
        logprob = alternative["logprob"]
        if logprob > -1e300:
            p = exp(logprob)
            total += p
            entropy -= p * logprob
        seen = True
    if not seen:
        return None
    rest = 1.0 - total
    if rest > 1e-12:
        entropy -= rest * math.log(rest)
    return entropy if entropy > 0.0 else 0.0


class EntropySummary:
    """Each token's top-k entropy as the answer's logprobs arrive (``add``), summarised once (``summary``)."""

    def __init__(self) -> None:
        self._values: list[float] = []

    def add(self, logprobs: Mapping[str, Any] | None) -> None:
        """One choice's ``logprobs`` (``{"content": [token entries]}``), whole or a stream chunk's."""
        if not isinstance(logprobs, Mapping):
            return
        for entry in logprobs.get("content") or ():
            if isinstance(entry, Mapping):
                value = top_k_entropy(entry.get("top_logprobs") or ())
                if value is not None:
                    self._values.append(value)

    def summary(self) -> dict[str, float | int] | None:
        """``{"tokens", "mean", "p10", "p50", "p90"}`` over the tokens that had alternatives; None without any."""
        values = sorted(self._values)
        if not values:
            return None
        last = len(values) - 1
        out: dict[str, float | int] = {"tokens": len(values), "mean": sum(values) / len(values)}
        for q, name in zip(QUANTILES, FIELDS[2:], strict=True):
            out[name] = values[round(q * last)]
        return out
