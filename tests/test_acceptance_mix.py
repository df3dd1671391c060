"""The rate at the set's mix of prompts: each category's measured acceptance, weighted by the tokens the set will
generate in it (docs/estimate.md, "How it works")."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from draftgen.estimate.acceptance_mix import MIN_CATEGORY_REQUESTS, acceptance_mix

INF = math.inf


def _requests(*groups: tuple[str | None, int, int, int]) -> pl.DataFrame:
    """(category, requests, completion tokens each, verify steps each) per group."""
    rows = [(c, t, s) for c, n, t, s in groups for _ in range(n)]
    return pl.DataFrame(
        {
            "ok": [True] * len(rows),
            "category": [c for c, _, _ in rows],
            "completion_tokens": [t for _, t, _ in rows],
            "spec_verify_ct": [s for _, _, s in rows],
        }
    )


def test_a_set_heavier_in_the_low_acceptance_category_is_priced_slower():
    # code yields 4 tokens a verify step, chat 2.5; the benchmark asked each as often, the set asks chat 3x as often
    requests = _requests(("code", 20, 1000, 250), ("chat", 20, 1000, 400))
    mix = acceptance_mix(requests, {"chat": [INF] * 60, "code": [INF] * 20})
    assert mix is not None
    assert mix.benchmark == pytest.approx(40_000 / 13_000)
    assert mix.set == pytest.approx(80_000 / (60_000 / 2.5 + 20_000 / 4.0))
    assert mix.factor == pytest.approx(mix.set / mix.benchmark) and mix.factor < 0.9
    assert mix.apart == ("chat", "code")
    same = acceptance_mix(requests, {"chat": [INF] * 30, "code": [INF] * 30})
    assert same is not None and same.factor == pytest.approx(1.0)  # the benchmark's own mix: unchanged


def test_a_turns_room_weighs_its_category_by_the_tokens_it_can_make():
    # every chat turn capped at 250 tokens makes a quarter of a code turn: the mix leans back toward code
    requests = _requests(("code", 20, 1000, 250), ("chat", 20, 1000, 400))
    capped = acceptance_mix(requests, {"chat": [250.0] * 60, "code": [INF] * 20})
    assert capped is not None
    assert capped.set == pytest.approx((15_000 + 20_000) / (15_000 / 2.5 + 20_000 / 4.0))


def test_a_rarely_measured_or_unmeasured_category_takes_the_pooled_acceptance():
    rare = MIN_CATEGORY_REQUESTS - 1
    requests = _requests(("code", 20, 1000, 250), ("chat", 20, 1000, 400), ("odd", rare, 1000, 100))
    mix = acceptance_mix(requests, {"odd": [INF] * 10, "never benchmarked": [INF] * 10})
    assert mix is not None and "odd" not in mix.apart
    assert mix.set == pytest.approx(mix.benchmark)  # both priced at the pooled acceptance, not odd's 10
    rows_without = _requests((None, 20, 1000, 250), ("chat", 20, 1000, 400))
    named = acceptance_mix(rows_without, {"(none)": [INF] * 10})  # the audit's name for rows without one
    assert named is not None and named.set == pytest.approx(4.0)


def test_no_verify_counts_no_correction():
    plain = _requests(("code", 20, 1000, 0), ("chat", 20, 1000, 0))
    assert acceptance_mix(plain, {"chat": [INF]}) is None  # a server without speculative decoding
    assert acceptance_mix(plain.drop("spec_verify_ct"), {"chat": [INF]}) is None  # or one that does not report it
    spec = _requests(("code", 20, 1000, 250))
    assert acceptance_mix(spec, {"code": []}) is None  # the set sends nothing
    assert np.isfinite(acceptance_mix(spec, {"code": [INF]}).factor)  # type: ignore[union-attr]
