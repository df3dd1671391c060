"""SGLang 0.5.23's adaptive speculative decoding (``--speculative-adaptive``), as the simulator models it.

SGLang keeps, per batch-size slot, a number of draft steps and an exponential moving average of the drafts each
request had accepted in a verify; every few batches it moves the steps one candidate up when the average exceeds
``steps - 0.5``, or down while it is at most ``lower - 0.5`` (plus a hysteresis). Zero steps is no drafting. Its
default table (no ``--speculative-adaptive-config``) gives small batches many steps and large ones none, because a
full batch pays for every draft token of every request. This module restates that rule (our code, from SGLang's
documented behaviour; the facts are listed in docs/simulator.md) and what each step count costs on the profile:
the step time of the speculative cost model at that count, and the acceptance of its draft positions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftgen.sim.profiles import SpecCosts

# SGLang 0.5.23's default adaptive table: the smallest batch size each slot serves → its candidate steps and
# its down hysteresis (the up hysteresis is 0 everywhere).
DEFAULT_SLOTS: dict[int, tuple[tuple[int, ...], float]] = {
    1: ((1, 3, 5, 7), -0.25),
    8: ((0, 1, 3), 0.0),
    32: ((0, 1), 0.0),
    64: ((0,), 0.0),
}
EMA_ALPHA = 0.2
UPDATE_INTERVAL = 5  # batches between decisions
WARMUP_BATCHES = 10  # batches before the first decision


def candidate_steps() -> list[int]:
    """Every step count a slot may use: what ``--speculative-num-steps`` must be one of."""
    return sorted({s for steps, _ in DEFAULT_SLOTS.values() for s in steps})


def chain_probabilities(costs: SpecCosts, steps: int) -> tuple[float, ...]:
    """Conditional acceptance of draft positions 1..steps of a top-k 1 chain (docs/simulator.md's model)."""
    return tuple(
        costs.accept_p * costs.accept_decay ** max(0, position - costs.anchor_steps)
        for position in range(1, steps + 1)
    )


def expected_accepted(costs: SpecCosts, steps: int) -> float:
    """Mean drafts accepted per request and verify at ``steps``."""
    total, chain = 0.0, 1.0
    for p in chain_probabilities(costs, steps):
        chain *= p
        total += chain
    return total


def step_seconds(costs: SpecCosts, batch: int, steps: int) -> float:
    """One decode step of ``batch`` requests drafting ``steps`` (top-k 1, steps + 1 tokens verified)."""
    per_req = costs.target_per_req_s + costs.verify_per_token_s * (steps + 1) + steps * costs.draft_per_req_s
    return costs.target_base_s + steps * costs.draft_step_s + batch * per_req


def slot_for(batch: int) -> int:
    """The slot serving ``batch`` running requests: the largest slot size not above it."""
    return max([size for size in DEFAULT_SLOTS if size <= max(batch, 1)] or [min(DEFAULT_SLOTS)])


def _start(initial: int, candidates: tuple[int, ...]) -> int:
    return initial if initial in candidates else candidates[len(candidates) // 2]


def _decide(current: int, ema: float, candidates: tuple[int, ...], down_hysteresis: float) -> int:
    """The step count after one decision (SGLang's rule, ceiling off as in its default table)."""
    index = candidates.index(current)
    if current == 0:
        return candidates[min(index + 1, len(candidates) - 1)]  # a no-draft interval probes the next count
    start = index
    while index > 0:
        lower = candidates[index - 1]
        threshold = (0.5 if lower == 0 else lower - 0.5) + down_hysteresis
        if ema > threshold:
            break
        index -= 1
    if index == start:
        while index < len(candidates) - 1 and ema > candidates[index] - 0.5:
            index += 1
    return candidates[index]


def settled_steps(costs: SpecCosts, initial: int, batch: int) -> int:
    """Where a slot's steps settle on a steady batch, when every verify accepts its expected drafts."""
    candidates, down = DEFAULT_SLOTS[slot_for(batch)]
    current = _start(initial, candidates)
    seen = set()
    while current not in seen:
        seen.add(current)
        ema = expected_accepted(costs, current) if current else -1.0
        following = _decide(current, ema, candidates, down)
        if following == current:
            return current
        if current == 0 and expected_accepted(costs, following) <= (0.5 + down):
            return 0  # the probe would fall straight back
        current = following
    return current


@dataclass
class _Slot:
    candidates: tuple[int, ...]
    down_hysteresis: float
    steps: int
    ema: float
    batches: int = 0


@dataclass
class AdaptiveRuntime:
    """One server's adaptive state: each slot's steps and average, fed after every verify."""

    costs: SpecCosts
    initial_steps: int
    slots: dict[int, _Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for size, (candidates, down) in DEFAULT_SLOTS.items():
            steps = _start(self.initial_steps, candidates)
            self.slots[size] = _Slot(candidates, down, steps, float(steps - 1))

    def steps_for(self, batch: int) -> int:
        return self.slots[slot_for(batch)].steps

    def draw(self, rng: random.Random, steps: int, left: int) -> int:
        """Tokens one request gains in a verify at ``steps``: the bonus token and its accepted drafts."""
        gained = 1
        for p in chain_probabilities(self.costs, steps):
            if gained >= left or rng.random() >= p:
                break
            gained += 1
        return min(gained, left)

    def observe(self, batch: int, accepted: list[int]) -> None:
        """Feed one verify's accepted drafts per request to the slot that ran it."""
        slot = self.slots[slot_for(batch)]
        if not accepted:
            return
        if slot.steps > 0:
            slot.ema = (1 - EMA_ALPHA) * slot.ema + EMA_ALPHA * sum(accepted) / len(accepted)
        slot.batches += 1
        if slot.batches <= WARMUP_BATCHES or (slot.batches - WARMUP_BATCHES) % UPDATE_INTERVAL:
            return
        following = _decide(slot.steps, slot.ema, slot.candidates, slot.down_hysteresis)
        if slot.steps == 0 and following > 0 and slot.ema < 0:
            slot.ema = float(following - 1)
        slot.steps = following
