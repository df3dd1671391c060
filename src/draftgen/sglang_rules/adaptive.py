"""SGLang 0.5.23's adaptive speculative decoding (``--speculative-adaptive``): its default table and its rules.

SGLang keeps, per batch-size slot, a number of draft steps and an exponential moving average of the drafts each
request had accepted in a verify; every few batches it moves the steps one candidate up when the average exceeds
``steps - 0.5``, or down while it is at most ``lower - 0.5`` (plus a hysteresis). Zero steps is no drafting.
Facts from ``speculative/adaptive_spec_params.py`` (the table, the slot's update, ``adaptive_unsupported_reason``)
and ``arg_groups/speculative_hook.py`` (``_maybe_disable_adaptive``, ``_init_adaptive_speculative_params``).
``server_settings`` refuses what SGLang would refuse or switch off; ``draftgen.sim.adaptive`` runs the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from draftgen.sglang_rules.speculation import EAGLE, EAGLE3, NEXTN

# adaptive_unsupported_reason: "only EAGLE/EAGLE3 are supported" (NEXTN is resolved to EAGLE before it is asked).
ADAPTIVE_ALGORITHMS = (NEXTN, EAGLE, EAGLE3)


@dataclass(frozen=True)
class Slot:
    """One row of the adaptive table: the batch sizes from ``min_batch`` up to the next row's."""

    min_batch: int
    candidate_steps: tuple[int, ...]
    down_hysteresis: float
    up_hysteresis: float = 0.0


# DEFAULT_ADAPTIVE_CONFIG (no --speculative-adaptive-config): small batches draft many steps, large ones none,
# because a full batch pays for every draft token of every request. Its ceiling coefficient is 0 (off) everywhere.
DEFAULT_TABLE = (
    Slot(1, (1, 3, 5, 7), down_hysteresis=-0.25),
    Slot(8, (0, 1, 3), down_hysteresis=0.0),
    Slot(32, (0, 1), down_hysteresis=0.0),
    Slot(64, (0,), down_hysteresis=0.0),
)
# AdaptiveStepSlot's defaults.
EMA_ALPHA = 0.2
UPDATE_INTERVAL = 5  # batches between decisions
WARMUP_BATCHES = 10  # batches before the first decision
# resolve_candidate_steps_from_config: the union of every slot's candidates, which --speculative-num-steps must be
# one of.
CANDIDATE_STEPS = tuple(sorted({steps for slot in DEFAULT_TABLE for steps in slot.candidate_steps}))

# adaptive_unsupported_reason's other reasons: SGLang switches adaptive off with a warning when one of these flags
# is given (and runs static speculation: another candidate than asked).
DISABLED_BY = MappingProxyType(
    {
        "--enable-dp-attention": "attention DP is not supported (adaptive tier decisions are not synchronized "
        "across DP ranks)",
        "--enable-multi-layer-eagle": "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does "
        "not implement adaptive)",
        "--enable-two-batch-overlap": "enable_two_batch_overlap=True is not supported (adaptive state swap would "
        "discard the TboAttnBackend wrapper)",
        "--enable-pdmux": "enable_pdmux=True is not supported (adaptive state swap does not update "
        "decode_attn_backend_group)",
    }
)
# ... and SGLang refuses to start with these (arg_groups/hisparse_hook.py, lora_hook.py).
REFUSED_BY = MappingProxyType(
    {
        "--enable-hisparse": "HiSparse speculative decoding uses statically sized swap state; "
        "--speculative-adaptive is not supported.",
        "--enable-lora": "LoRA does not support --speculative-adaptive: the draft is built from a static ServerArgs "
        "snapshot, and the runtime-state swap does not rebuild LoRA cuda-graph metadata",
    }
)


def algorithm_reason(algorithm: str | None) -> str | None:
    """Why SGLang switches adaptive off for this algorithm, in its words (None: it supports it)."""
    if algorithm in ADAPTIVE_ALGORITHMS:
        return None
    return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"


def topk_reason(topk: int | None) -> str | None:
    """Why SGLang switches adaptive off for this top-k, in its words (None: top-k 1, or not given)."""
    if topk is None or topk == 1:
        return None
    return f"speculative_eagle_topk={topk} (only topk=1 is supported)"


def unsupported_reason(algorithm: str | None, topk: int | None) -> str | None:
    """The first reason SGLang gives for switching adaptive off, as it checks them (None: it runs adaptive)."""
    return algorithm_reason(algorithm) or topk_reason(topk)


def disabled_warning(reason: str) -> str:
    """What SGLang logs when it switches adaptive off (_maybe_disable_adaptive)."""
    return f"speculative_adaptive disabled: {reason}. Falling back to static speculative params."


def start_steps(given: int | None) -> int:
    """The steps adaptive starts from: as given, else the middle candidate (_init_adaptive_speculative_params)."""
    return CANDIDATE_STEPS[len(CANDIDATE_STEPS) // 2] if given is None else given


def steps_problem(steps: int) -> str | None:
    """SGLang's refusal to start when the start steps are not a candidate (None: they are)."""
    if steps in CANDIDATE_STEPS:
        return None
    return (
        f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps {list(CANDIDATE_STEPS)}. "
        "Pass one of those values."
    )


def slot_for(batch: int) -> Slot:
    """The slot serving ``batch`` running requests: the row with the largest ``min_batch`` not above it."""
    fitting = [slot for slot in DEFAULT_TABLE if slot.min_batch <= max(batch, 1)]
    return fitting[-1] if fitting else DEFAULT_TABLE[0]


def slot_start(initial: int, slot: Slot) -> int:
    """A slot's first steps: ``initial`` when it is one of its candidates, else its middle one."""
    candidates = slot.candidate_steps
    return initial if initial in candidates else candidates[len(candidates) // 2]


def decide(current: int, ema: float, slot: Slot) -> int:
    """The slot's steps after one decision, from the average drafts accepted ``ema`` (ceiling off, as in the
    default table)."""
    candidates = slot.candidate_steps
    index = candidates.index(current)
    if current == 0:
        return candidates[min(index + 1, len(candidates) - 1)]  # a no-draft interval probes the next count
    start = index
    while index > 0:
        lower = candidates[index - 1]
        threshold = (0.5 if lower == 0 else lower - 0.5) + slot.down_hysteresis
        if ema > threshold:
            break
        index -= 1
    if index == start:
        while index < len(candidates) - 1 and ema > candidates[index] - 0.5 + slot.up_hysteresis:
            index += 1
    return candidates[index]
