"""What each simulated request will generate, decided when it arrives.

Its completion (``draftgen.sim.textgen``: reasoning, answer and tool calls in the served tokenizer's tokens, the
empty-answer, non-canonical and loop faults) and the tokens each verify step gains: the profile's acceptance per
draft position, scaled by the prompt's category and the request's temperature, or drawn step by step at the step
counts adaptive speculation moves through.
"""

from __future__ import annotations

import random

from draftgen.sim import categories, temperature
from draftgen.sim.engine import SimRequest
from draftgen.sim.faults import Faults
from draftgen.sim.profiles import Profile
from draftgen.sim.speculative import mean_accept_length
from draftgen.sim.textgen import CompletionPlan, plan_acceptance_by_position, plan_completion
from draftgen.sim.tokenizer import SimTokenizer
from draftgen.sim.toolcalls import SimCall


class RequestPlanner:
    """Plans requests for one server: its profile (as launched), its tokenizer and its injected faults."""

    def __init__(self, profile: Profile, tokenizer: SimTokenizer, faults: Faults):
        self.profile = profile
        self.tokenizer = tokenizer
        self.faults = faults
        self.accept_probs = profile.position_probabilities()

    def new_request(
        self,
        rid: str,
        kind: str,
        *,
        prompt_tokens: int,
        seed: int,
        max_tokens: int,
        enable_thinking: bool,
        ignore_eos: bool,
        stream: bool,
        empty_answer: bool = False,
        noncanonical: bool = False,
        category: str | None = None,
        sampling_temperature: float | None = None,
        prompt_ids: tuple[int, ...] | None = None,
        prefill_only: bool = False,
        calls: tuple[SimCall, ...] = (),
    ) -> SimRequest:
        plan: CompletionPlan = plan_completion(
            seed,
            self.tokenizer,
            max_tokens=max_tokens,
            enable_thinking=enable_thinking,
            reasoning_median=self.profile.reasoning_median,
            answer_median=self.profile.answer_median,
            sigma=self.profile.length_sigma,
            empty_answer=empty_answer,
            ignore_eos=ignore_eos,
            noncanonical=noncanonical,
            loop_rate=self.faults.loop_rate if kind in ("chat", "generate") else 0.0,
            loop_max_period=self.faults.loop_max_period,
            calls=calls,
            answer_before_calls=bool(seed & 1),
        )
        total = plan.completion_tokens
        rng = None
        expected = None  # the request's expected acceptance length (ground truth), where the model fixes one
        if self.profile.instant:
            draws = [total]
        elif self.profile.adaptive_steps is not None:
            draws, rng = [], random.Random(seed)  # drawn step by step, at the steps in force then
        else:
            factor = categories.factor_of(self.profile.category_accept, category) * temperature.factor_at(
                self.profile.temperature_accept, sampling_temperature
            )
            probs = categories.scaled(self.accept_probs, factor)
            draws = plan_acceptance_by_position(seed, total, probs, self.profile.draft_tokens)
            if self.profile.speculative:
                expected = mean_accept_length(probs[: self.profile.draft_tokens - 1])
        return SimRequest(
            rid=rid,
            kind=kind,
            prompt_tokens=prompt_tokens,
            plan=plan,
            draws=draws,
            stream=stream,
            seed=seed,
            rng=rng,
            category=category,
            temperature=sampling_temperature,
            accept_expected=expected,
            max_tokens=max_tokens,
            prompt_ids=prompt_ids,
            prefill_only=prefill_only,
        )
