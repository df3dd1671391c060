"""SGLang 0.5.23's adaptive speculative decoding (``--speculative-adaptive``) as a simulated server runs it.

SGLang's table and decision rule are ``draftgen.sglang_rules.adaptive`` (read by ``server_settings`` too); this
module adds what each step count costs on a profile: the step time of the speculative cost model at that count,
the acceptance of its draft positions, where a steady batch settles, and one server's state as it runs
(docs/simulator.md, "Adaptive speculation").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from draftgen.sglang_rules.adaptive import (
    DEFAULT_TABLE,
    EMA_ALPHA,
    UPDATE_INTERVAL,
    WARMUP_BATCHES,
    Slot,
    decide,
    slot_for,
    slot_start,
)
from draftgen.sim.spec_costs import SpecCosts


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


def settled_steps(costs: SpecCosts, initial: int, batch: int) -> int:
    """Where a slot's steps settle on a steady batch, when every verify accepts its expected drafts."""
    slot = slot_for(batch)
    current = slot_start(initial, slot)
    seen = set()
    while current not in seen:
        seen.add(current)
        ema = expected_accepted(costs, current) if current else -1.0
        following = decide(current, ema, slot)
        if following == current:
            return current
        if current == 0 and expected_accepted(costs, following) <= (0.5 + slot.down_hysteresis):
            return 0  # the probe would fall straight back
        current = following
    return current


@dataclass
class _SlotState:
    """One slot's steps and average as a server runs."""

    slot: Slot
    steps: int
    ema: float
    batches: int = 0


@dataclass
class AdaptiveRuntime:
    """One server's adaptive state: each slot's steps and average, fed after every verify."""

    costs: SpecCosts
    initial_steps: int
    slots: dict[int, _SlotState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for slot in DEFAULT_TABLE:
            steps = slot_start(self.initial_steps, slot)
            self.slots[slot.min_batch] = _SlotState(slot, steps, float(steps - 1))

    def steps_for(self, batch: int) -> int:
        return self.slots[slot_for(batch).min_batch].steps

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
        state = self.slots[slot_for(batch).min_batch]
        if not accepted:
            return
        if state.steps > 0:
            state.ema = (1 - EMA_ALPHA) * state.ema + EMA_ALPHA * sum(accepted) / len(accepted)
        state.batches += 1
        if state.batches <= WARMUP_BATCHES or (state.batches - WARMUP_BATCHES) % UPDATE_INTERVAL:
            return
        following = decide(state.steps, state.ema, state.slot)
        if state.steps == 0 and following > 0 and state.ema < 0:
            state.ema = float(following - 1)
        state.steps = following
