"""Hardware profiles for the simulated SGLang server, and the timing formulas they feed.

All times are in simulated seconds; ``--speed X`` divides every wait by X. The calibration of each profile
is documented in docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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

    def step_seconds(self, batch: int) -> float:
        """Duration of one decode step with ``batch`` running requests."""
        if self.instant or batch <= 0:
            return 0.0
        return self.step_base_s + self.step_per_req_s * batch

    def prefill_seconds(self, prompt_tokens: int) -> float:
        if self.instant:
            return 0.0
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens

    def tokens_per_second(self, batch: int) -> float:
        """Aggregate decode throughput at a steady batch size (the capacity curve, prefill excluded)."""
        batch = min(batch, self.max_running_requests)
        step = self.step_seconds(batch)
        return float("inf") if step == 0 else batch * self.accept_mean / step

    def with_overrides(self, **changes: object) -> Profile:
        return replace(self, **changes)


# B200, Qwen3.6-27B bf16, MTP (NEXTN, 3 steps, top-k 1, 4 draft tokens).
# One request alone: 3.6 tokens per step / 14.4 ms per step = 250 tok/s (the user's concurrency-1 figure).
# Batch 48 (SGLang's cap with speculation on): 48 * 3.6 / (12.9 ms + 48 * 1.5 ms) = 2,035 tok/s per GPU.
B200_MTP = Profile(
    name="b200-mtp",
    description="B200 + Qwen3.6-27B with MTP: ~250 tok/s alone, acceptance ~3.6, ~2,000 tok/s at the 48 cap",
    step_base_s=0.0129,
    step_per_req_s=0.0015,
    prefill_base_s=0.004,
    prefill_per_token_s=1.0 / 40_000,
    speculative=True,
    accept_mean=3.6,
    draft_tokens=4,
    max_running_requests=48,
    kv_capacity_tokens=600_000,
    reasoning_median=1_100,
    answer_median=350,
    length_sigma=0.75,
    context_length=262_144,
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
