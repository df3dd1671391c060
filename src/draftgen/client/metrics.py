"""Prometheus ``/metrics`` text → counter snapshots, and the differences between two snapshots.

A server's counters are cumulative since it started (warm-up and every earlier client included), so a window's
own numbers are the difference of two scrapes taken around it. Samples are summed over their label sets (one
per model name, DP rank or engine), because a window's totals are what we need.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# SGLang (docs/engines.md#the-sglang-surface-draftgen-relies-on): counters with a ``_total`` sample name.
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"
SGLANG_PROMPT_TOKENS = "sglang:prompt_tokens_total"
SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls_total"
SGLANG_REQUESTS = "sglang:num_requests_total"
# vLLM: acceptance length = 1 + accepted draft tokens / drafts (one draft round per request per step).
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
VLLM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"

GENERATION_COUNTERS = (SGLANG_GENERATION_TOKENS, VLLM_GENERATION_TOKENS)


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition format."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape: counters (``*_total`` samples) and gauges, each summed over label sets."""

    taken_at: float  # wall clock (time.time())
    counters: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CounterWindow:
    """Counter increases between two snapshots; counters that went down (a restart) are listed, not guessed."""

    seconds: float
    deltas: Mapping[str, float]
    reset: tuple[str, ...] = ()

    def get(self, name: str) -> float | None:
        return self.deltas.get(name)


def parse_metrics(text: str, taken_at: float | None = None) -> MetricsSnapshot:
    """Parse Prometheus text with prometheus_client's parser."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counters[sample.name] = counters.get(sample.name, 0.0) + float(sample.value)
                elif family.type == "gauge":
                    gauges[sample.name] = gauges.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise MetricsParseError(f"not Prometheus text: {exc}") from exc
    return MetricsSnapshot(
        taken_at=time.time() if taken_at is None else taken_at, counters=counters, gauges=gauges
    )


def counter_window(before: MetricsSnapshot, after: MetricsSnapshot) -> CounterWindow:
    """Increases of every counter present in both snapshots."""
    deltas: dict[str, float] = {}
    reset: list[str] = []
    for name, end in after.counters.items():
        start = before.counters.get(name)
        if start is None:
            continue
        if end < start:
            reset.append(name)
            continue
        deltas[name] = end - start
    return CounterWindow(seconds=after.taken_at - before.taken_at, deltas=deltas, reset=tuple(sorted(reset)))


def generated_tokens(window: CounterWindow) -> tuple[float, str] | None:
    """(tokens generated in the window, counter name), or None when no generation counter was scraped."""
    for name in GENERATION_COUNTERS:
        value = window.get(name)
        if value is not None:
            return value, name
    return None


def acceptance_length(window: CounterWindow) -> tuple[float, str] | None:
    """(mean acceptance length in the window, how it was computed), or None when the counters are absent.

    SGLang: generation tokens / verify calls (one verify call per decode step per request, bonus token included).
    vLLM: 1 + accepted draft tokens / draft rounds.
    """
    tokens, verifies = window.get(SGLANG_GENERATION_TOKENS), window.get(SGLANG_VERIFY_CALLS)
    if tokens is not None and verifies:
        return tokens / verifies, f"{SGLANG_GENERATION_TOKENS} / {SGLANG_VERIFY_CALLS}"
    accepted, drafts = window.get(VLLM_ACCEPTED_TOKENS), window.get(VLLM_DRAFTS)
    if accepted is not None and drafts:
        return 1.0 + accepted / drafts, f"1 + {VLLM_ACCEPTED_TOKENS} / {VLLM_DRAFTS}"
    return None


def merge_windows(windows: list[CounterWindow]) -> CounterWindow:
    """Several servers' windows over the same span as one (a router's workers together): deltas summed over the
    counters every window has, the longest span, every reset kept."""
    if not windows:
        return CounterWindow(seconds=0.0, deltas={})
    names = set(windows[0].deltas).intersection(*(w.deltas for w in windows[1:]))
    return CounterWindow(
        seconds=max(w.seconds for w in windows),
        deltas={name: sum(w.deltas[name] for w in windows) for name in names},
        reset=tuple(sorted({name for w in windows for name in w.reset})),
    )
