"""A candidate's tok/s per GPU and acceptance length from its jobs, with bootstrap intervals.

Throughput pools the steady requests of every job (same concurrency ``c``): ``c × Σ tokens / Σ seconds``, divided
by the GPUs of a group. Acceptance is Σ tokens / Σ verify steps over the requests that report them (sglext), else
the jobs' level values (benchmark's other sources) averaged, without an interval. Intervals resample requests
with replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftgen.tune.config import TuneConfig
from draftgen.tune.measure import JobResult


@dataclass(frozen=True)
class Estimate:
    tok_s_per_gpu: float
    tok_s_low: float
    tok_s_high: float
    accept_length: float | None
    accept_low: float | None
    accept_high: float | None
    accept_source: str
    steady_requests: int
    jobs: int


def estimate(jobs: Sequence[JobResult], config: TuneConfig) -> Estimate:
    concurrency = jobs[0].candidate.concurrency
    tokens = np.concatenate([np.asarray(j.steady_tokens, dtype=float) for j in jobs])
    seconds = np.concatenate([np.asarray(j.steady_seconds, dtype=float) for j in jobs])
    verify = [v for j in jobs for v in j.steady_verify]
    scale = concurrency / config.tp
    rate = float(scale * tokens.sum() / seconds.sum()) if seconds.sum() > 0 else 0.0
    rng = np.random.default_rng(config.seed)
    n = len(tokens)
    picks = rng.integers(0, n, size=(config.bootstrap, n)) if n else np.zeros((0, 0), dtype=int)
    tail = (1 - config.interval) / 2
    if n:
        rates = scale * tokens[picks].sum(axis=1) / np.maximum(seconds[picks].sum(axis=1), 1e-12)
        low, high = (float(q) for q in np.quantile(rates, [tail, 1 - tail]))
    else:
        low = high = rate
    if n and all(v for v in verify):
        steps = np.asarray(verify, dtype=float)
        accept = float(tokens.sum() / steps.sum())
        draws = tokens[picks].sum(axis=1) / steps[picks].sum(axis=1)
        a_low, a_high = (float(q) for q in np.quantile(draws, [tail, 1 - tail]))
        source = "sglext"
    else:
        levels = [j.accept_length for j in jobs if j.accept_length is not None]
        accept = float(np.mean(levels)) if levels else None
        a_low = a_high = None
        source = jobs[0].accept_source
    return Estimate(rate, low, high, accept, a_low, a_high, source, n, len(jobs))
