"""Hardware profiles for the simulated SGLang server, and the timing formulas they feed.

All times are in simulated seconds; ``--speed X`` divides every wait by X. The calibration of each profile
is documented in docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from draftgen.sglang_rules.speculation import AUTO_NUMBERS, SPEC_DEFAULT_MAX_RUNNING
from draftgen.sim import adaptive
from draftgen.sim.spec_costs import SpecCosts
from draftgen.sim.textgen import acceptance_probability


@dataclass(frozen=True)
class MemoryModel:
    """GPU memory as SGLang budgets it at start (GiB), for a hybrid linear-attention model (Qwen3.5/3.6)."""

    gpu_memory_gib: float
    weights_gib: float
    mem_fraction: float  # SGLang's --mem-fraction-static default on this GPU without speculation
    spec_reserve_gib: (
        float  # what SGLang reserves more for the draft model and its graphs (lowers the default)
    )
    state_per_req_gib: float  # recurrent (linear-attention) state of one request
    kv_bytes_per_token: int  # full-attention KV cache per token

    def default_mem_fraction(self, speculative: bool) -> float:
        if not speculative:
            return self.mem_fraction
        return round(self.mem_fraction - self.spec_reserve_gib / self.gpu_memory_gib, 3)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    step_base_s: float  # t0: fixed cost of one decode (verify) step
    step_per_req_s: float  # t1: added cost per running request in the batch
    prefill_base_s: float  # fixed cost of a prefill added to the step that admits requests
    prefill_per_token_s: float  # prefill cost per prompt token
    speculative: bool  # MTP / NEXTN on: each step yields an acceptance-length draw
    accept_mean: float  # mean tokens per verify step (bonus token included); 1.0 without speculation
    draft_tokens: int  # cap on one draw (--speculative-num-draft-tokens)
    max_running_requests: int  # batch cap; the rest queue
    kv_capacity_tokens: int  # for the token_usage gauge
    reasoning_median: int  # median reasoning length, tokens
    answer_median: int  # median answer length, tokens
    length_sigma: float  # log-normal spread of both lengths
    context_length: int  # reported as max_model_len
    instant: bool = False  # no waits at all and a whole completion per step (client-overhead measurements)
    # Speculative settings as launched (reported in /server_info) and what other settings would cost.
    spec_steps: int = 0  # --speculative-num-steps (0 without speculation)
    spec_topk: int = 1  # --speculative-eagle-topk
    accept_probs: tuple[
        float, ...
    ] = ()  # conditional acceptance per draft position; () = one p from accept_mean
    spec_costs: SpecCosts | None = None  # None: the profile takes no speculative flags
    memory: MemoryModel | None = None  # None: no memory limit at start
    mem_fraction_static: float | None = None  # as launched, when the memory model applies
    kv_admission: bool = False  # admit a request only while the KV cache can hold it to the end
    adaptive_steps: int | None = None  # --speculative-adaptive: the steps every slot starts from (None: off)
    # As reported in /server_info once speculative flags are given: the algorithm, the draft model path and
    # the drafter profile it named (draftgen.sim.drafters); None: as the profile was defined.
    spec_algorithm: str | None = None
    draft_model_path: str | None = None
    drafter: str | None = None
    # Per prompt category (draftgen.sim.categories): the factor on every draft position's acceptance; () = none.
    category_accept: tuple[tuple[str, float], ...] = ()
    # By temperature (draftgen.sim.temperature): (temperature, factor on every draft position's acceptance)
    # anchors, linear between them; () = acceptance does not depend on the temperature.
    temperature_accept: tuple[tuple[float, float], ...] = ()

    def position_probabilities(self) -> tuple[float, ...]:
        """Conditional acceptance of draft positions 1..draft_tokens-1 (each only if the previous was accepted)."""
        if not self.speculative or self.draft_tokens <= 1:
            return ()
        if self.accept_probs:
            return self.accept_probs
        return (acceptance_probability(self.accept_mean, self.draft_tokens),) * (self.draft_tokens - 1)

    def step_seconds(self, batch: int) -> float:
        """Duration of one decode step with ``batch`` running requests (adaptive: at the steps it settles on)."""
        if self.instant or batch <= 0:
            return 0.0
        if self.adaptive_steps is not None and self.spec_costs is not None:
            steps = adaptive.settled_steps(self.spec_costs, self.adaptive_steps, batch)
            return adaptive.step_seconds(self.spec_costs, batch, steps)
        return self.step_base_s + self.step_per_req_s * batch

    def accept_mean_at(self, batch: int) -> float:
        """Mean tokens per verify at a steady ``batch`` (adaptive: at the steps it settles on there)."""
        if self.adaptive_steps is not None and self.spec_costs is not None:
            steps = adaptive.settled_steps(self.spec_costs, self.adaptive_steps, batch)
            return 1.0 + adaptive.expected_accepted(self.spec_costs, steps)
        return self.accept_mean

    def prefill_seconds(self, prompt_tokens: int) -> float:
        if self.instant:
            return 0.0
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens

    def tokens_per_second(self, batch: int) -> float:
        """Aggregate decode throughput at a steady batch size (the capacity curve, prefill excluded)."""
        batch = min(batch, self.max_running_requests)
        step = self.step_seconds(batch)
        return float("inf") if step == 0 else batch * self.accept_mean_at(batch) / step

    def with_overrides(self, **changes: object) -> Profile:
        return replace(self, **changes)


# B200, Qwen3.6-27B bf16, MTP (NEXTN, 3 steps, top-k 1, 4 draft tokens).
# One request alone: 3.6 tokens per step / 14.4 ms per step = 250 tok/s (the user's concurrency-1 figure).
# Batch 48 (SGLang's cap with speculation on): 48 * 3.6 / (12.9 ms + 48 * 1.5 ms) = 2,035 tok/s per GPU.
# The same two numbers split into draft and verify parts (docs/simulator.md, "Speculative settings"):
#   t0 = 11.1 ms target + 3 steps x 0.6 ms draft = 12.9 ms;
#   t1 = 0.35 ms per request + 4 draft tokens x 0.25 ms + 3 steps x 1 branch x 0.05 ms = 1.5 ms.
B200_SPEC_COSTS = SpecCosts(
    target_base_s=0.0111,
    target_per_req_s=0.00035,
    verify_per_token_s=0.00025,
    draft_step_s=0.0006,
    draft_per_req_s=0.00005,
    accept_p=acceptance_probability(3.6, 4),
    anchor_steps=3,
    accept_decay=0.95,
    alternate_catch=0.3,
)
# 179 GiB visible; 51.2 GiB of bf16 weights; SGLang's default fraction (183,359 MiB - 26,240 MiB reserved for
# activations and graphs) / 183,359 MiB = 0.857, minus 2 GiB more with a draft model; a Qwen3.5-27B-like layout:
# 48 linear-attention layers x 48 heads x 128 x 128 fp32 states (+ conv) = 0.144 GiB per request, 16 full-
# attention layers x 4 KV heads x 256 x 2 (K, V) x 2 bytes = 64 KiB per token.
B200_MEMORY = MemoryModel(
    gpu_memory_gib=179.0,
    weights_gib=51.2,
    mem_fraction=0.857,
    spec_reserve_gib=2.0,
    state_per_req_gib=0.144,
    kv_bytes_per_token=65_536,
)
# Acceptance length by prompt category at the launched 3/1/4 (a chain of 3 drafts): code and arithmetic well
# above the mean, free prose and summaries of long notes below it; over the bundled prompts' mix the mean stays
# about 3.6. Stored as the factor on each draft's acceptance that gives that length at 3/1/4, so another setting
# or drafter moves every category the same way.
B200_CATEGORY_ACCEPT_LENGTH = {
    "code": 3.9,
    "math": 3.8,
    "agentic": 3.7,  # tool calls: a rigid format that repeats the prompt's names and values
    "system": 3.6,
    "multi_turn": 3.4,
    "chat": 3.3,
    "long": 3.1,
}
_B200_P = acceptance_probability(3.6, AUTO_NUMBERS.draft_tokens)
# Acceptance length by sampling temperature at the launched 3/1/4: the profile's 3.6 at Qwen3's default 0.6, more
# when sampling is sharper, less when it is flatter. The direction is what speculative-decoding results show; the
# size is the simulator's assumption (about 5% per 0.4 of temperature), not a measurement of Qwen3.6's MTP head.
B200_TEMPERATURE_ACCEPT_LENGTH = {0.0: 3.85, 0.6: 3.6, 1.0: 3.4, 1.5: 3.1}
B200_MTP = Profile(
    name="b200-mtp",
    description="B200 + Qwen3.6-27B with MTP: ~250 tok/s alone, acceptance ~3.6, ~2,000 tok/s at the 48 cap",
    step_base_s=0.0129,
    step_per_req_s=0.0015,
    prefill_base_s=0.004,
    prefill_per_token_s=1.0 / 40_000,
    speculative=True,
    accept_mean=3.6,
    draft_tokens=AUTO_NUMBERS.draft_tokens,
    max_running_requests=SPEC_DEFAULT_MAX_RUNNING,
    kv_capacity_tokens=600_000,
    reasoning_median=1_100,
    answer_median=350,
    length_sigma=0.75,
    context_length=262_144,
    spec_steps=AUTO_NUMBERS.steps,  # launched without numbers: SGLang's own 3/1/4, where the costs are calibrated
    spec_topk=AUTO_NUMBERS.topk,
    spec_costs=B200_SPEC_COSTS,
    memory=B200_MEMORY,
    category_accept=tuple(
        (category, acceptance_probability(length, AUTO_NUMBERS.draft_tokens) / _B200_P)
        for category, length in B200_CATEGORY_ACCEPT_LENGTH.items()
    ),
    temperature_accept=tuple(
        (temperature, acceptance_probability(length, AUTO_NUMBERS.draft_tokens) / _B200_P)
        for temperature, length in B200_TEMPERATURE_ACCEPT_LENGTH.items()
    ),
)

# RTX PRO 6000 (96 GB), same model, no speculation. Alone: 1 / (29 ms + 2.05 ms) = 32 tok/s;
# batch 64: 64 / (29 ms + 64 * 2.05 ms) = 395 tok/s per GPU aggregate.
RTX_PRO_6000 = Profile(
    name="rtx-pro-6000",
    description="RTX PRO 6000 + Qwen3.6-27B, no MTP: ~32 tok/s alone, ~400 tok/s per GPU at batch 64",
    step_base_s=0.029,
    step_per_req_s=0.00205,
    prefill_base_s=0.01,
    prefill_per_token_s=1.0 / 8_000,
    speculative=False,
    accept_mean=1.0,
    draft_tokens=1,
    max_running_requests=64,
    kv_capacity_tokens=200_000,
    reasoning_median=1_100,
    answer_median=350,
    length_sigma=0.75,
    context_length=262_144,
)

# No waits: the server answers as fast as its event loop can. For measuring client overhead.
INSTANT = Profile(
    name="instant",
    description="no delays, whole completion in one step: measures client overhead, not a GPU",
    step_base_s=0.0,
    step_per_req_s=0.0,
    prefill_base_s=0.0,
    prefill_per_token_s=0.0,
    speculative=False,
    accept_mean=1.0,
    draft_tokens=1,
    max_running_requests=1_024,
    kv_capacity_tokens=10_000_000,
    reasoning_median=60,
    answer_median=20,
    length_sigma=0.5,
    context_length=32_768,
    instant=True,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (B200_MTP, RTX_PRO_6000, INSTANT)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
