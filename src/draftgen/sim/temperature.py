"""Acceptance that depends on how a request is sampled: the temperature.

A drafter proposes the target's likeliest continuation; the sharper the target samples, the more often its token
is that one. So greedy decoding accepts more drafts than sampling at temperature 1 (the direction every
speculative-decoding paper reports; the size is model- and drafter-specific). The simulator models it with a
factor on every draft position's conditional acceptance (capped at 1), a piecewise-linear function of the
request's temperature through a profile's anchor points, which equals 1 at the temperature the profile's
acceptance is calibrated at. A request without a temperature is sampled at the model's default (SGLang reads it
from the model's generation config: 0.6 for Qwen3 thinking), so it keeps the profile's acceptance. The factor
multiplies the category's (``draftgen.sim.categories``); both land in the ground truth's ``accept_expected``
(docs/simulator.md, "Acceptance by temperature").
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise

DEFAULT_TEMPERATURE = 0.6  # Qwen3's generation config (thinking): what a request without one is sampled at


def temperature_of(body: Mapping[str, object], key: str = "temperature") -> float | None:
    """The request's temperature when it gives a number (else None: the model's default)."""
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def factor_at(anchors: tuple[tuple[float, float], ...], temperature: float | None) -> float:
    """The factor at ``temperature``: linear between the anchors (temperature, factor), flat beyond them; 1.0
    without anchors or without a temperature."""
    if not anchors or temperature is None:
        return 1.0
    points = sorted(anchors)
    if temperature <= points[0][0]:
        return points[0][1]
    for (t0, f0), (t1, f1) in pairwise(points):
        if temperature <= t1:
            return f0 + (f1 - f0) * (temperature - t0) / (t1 - t0)
    return points[-1][1]
