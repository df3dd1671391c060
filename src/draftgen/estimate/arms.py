"""The sampling plan priced: each arm's completion lengths and acceptance, and what the fleet simulation draws.

A plan makes ``share × answers`` requests per prompt for each arm (``draftgen.sampling_plan``), each sampled its
own way: a thinking-off arm writes far shorter answers, a hotter arm accepts fewer drafts. Each arm's lengths are
the benchmark's own requests of that arm (a benchmark run with the same ``sampling_plan`` measures every arm),
else the benchmark's lengths times the arm's assumed ``length_factor``; its acceptance likewise, else assumed
(``accept_length``), else the benchmark's.

Acceptance changes the time a token costs, not the rate curve's shape: a decode step gives every running request
its acceptance-length draw of tokens, so at the same batch an arm that accepts ``A_arm`` tokens per step makes
tokens ``A_arm / A_ref`` times as fast as the benchmark's mix did (``A_ref``: its tokens over its verify steps,
what the fitted curve was measured at). The simulation therefore runs on **work**: a request's tokens ×
``A_ref / A_arm``, in the benchmark's tokens, which the fitted curve prices as measured; the tokens themselves
are counted apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from draftgen.estimate.config import ArmAssumption
from draftgen.estimate.model import LengthSample
from draftgen.sampling_plan import Arm

NO_PLAN = "(all)"  # the label of the one arm a run without a plan has


@dataclass(frozen=True)
class PricedArm:
    """One arm as the estimate prices it."""

    name: str | None  # None: no plan (one request per prompt, the benchmark's whole sample)
    requests_per_prompt: float  # share × answers (1 without a plan)
    own_max_tokens: int | None  # the arm's own max_tokens (None: the run's)
    run_max_tokens: int
    lengths: LengthSample  # the lengths it draws from (already × length_factor)
    accept_length: float | None  # tokens per verify step (None: unknown)
    speed: float  # accept_length ÷ the benchmark's (1.0 when either is unknown): its tokens cost 1/speed
    lengths_source: str
    accept_source: str

    @property
    def label(self) -> str:
        return self.name or NO_PLAN

    @property
    def max_tokens(self) -> int:
        return self.own_max_tokens or self.run_max_tokens

    def per_prompt(self, run_max_tokens: int | None = None) -> np.ndarray:
        """Mean completion tokens per prompt, each request clipped at the arm's max_tokens (its own, else the
        run's: ``run_max_tokens`` when given)."""
        return self.lengths.per_prompt(self._max_tokens(run_max_tokens))

    def answers_per_prompt(self, run_max_tokens: int | None = None) -> np.ndarray:
        """Mean answer tokens (after the reasoning) per prompt, at the same max_tokens as ``per_prompt``."""
        return self.lengths.answers_per_prompt(self._max_tokens(run_max_tokens))

    def _max_tokens(self, run_max_tokens: int | None) -> int:
        return self.own_max_tokens or run_max_tokens or self.run_max_tokens


@dataclass(frozen=True)
class PlanDraws:
    """What the simulation draws one request from: per-prompt mean lengths of every arm, pooled, each drawn with
    its arm's share of the requests (``weights`` None: uniformly, one arm priced as measured)."""

    work: np.ndarray  # tokens × A_ref / A_arm: what the fitted rate curve prices
    tokens: np.ndarray
    weights: np.ndarray | None
    answers: np.ndarray | None = None  # of ``tokens``, those after the reasoning (None: not measured)

    def mean(self, values: np.ndarray) -> float:
        return float(values.mean() if self.weights is None else np.dot(values, self.weights))

    @property
    def mean_tokens(self) -> float:
        return self.mean(self.tokens)


@dataclass(frozen=True)
class PricedPlan:
    arms: tuple[PricedArm, ...]
    reference_accept: float | None  # A_ref: the benchmark's tokens over its verify steps
    notes: tuple[str, ...]

    @property
    def requests_per_prompt(self) -> float:
        return sum(a.requests_per_prompt for a in self.arms)

    def draws(self, max_tokens: int | None = None) -> PlanDraws:
        """The pooled draws, before any room under the trainer's max_length clips them (the simulation's
        conversations do, turn by turn); ``max_tokens`` replaces the run's (arms with their own keep theirs: the
        sweep)."""
        measured = all(arm.lengths.answers is not None for arm in self.arms)
        if len(self.arms) == 1 and self.arms[0].speed == 1.0:
            tokens = self.arms[0].per_prompt(max_tokens)
            answers = self.arms[0].answers_per_prompt(max_tokens) if measured else None
            return PlanDraws(work=tokens, tokens=tokens, weights=None, answers=answers)
        total = self.requests_per_prompt
        tokens, work, weights, answers = [], [], [], []
        for arm in self.arms:
            values = arm.per_prompt(max_tokens)
            tokens.append(values)
            work.append(values / arm.speed)
            weights.append(np.full(values.size, arm.requests_per_prompt / total / values.size))
            answers.append(arm.answers_per_prompt(max_tokens))
        return PlanDraws(
            work=np.concatenate(work),
            tokens=np.concatenate(tokens),
            weights=np.concatenate(weights),
            answers=np.concatenate(answers) if measured else None,
        )

    def truncated_rate(self) -> float:
        total = self.requests_per_prompt
        return sum(a.requests_per_prompt / total * a.lengths.truncated_rate(a.max_tokens) for a in self.arms)

    def lengths_are_lower_bound(self) -> bool:
        return any(a.lengths.extrapolated(a.max_tokens) for a in self.arms)

    def table(self, num_prompts: float) -> pl.DataFrame:
        """One row per arm: its requests, lengths, acceptance, speed and where each came from."""
        total = self.requests_per_prompt
        rows = []
        for arm in self.arms:
            mean = float(arm.per_prompt().mean())
            rows.append(
                {
                    "arm": arm.label,
                    "requests_per_prompt": round(arm.requests_per_prompt, 4),
                    "requests": round(num_prompts * arm.requests_per_prompt / total),
                    "max_tokens": arm.max_tokens,
                    "mean_completion_tokens": round(mean, 1),
                    "truncated_rate": round(arm.lengths.truncated_rate(arm.max_tokens), 4),
                    "accept_length": None if arm.accept_length is None else round(arm.accept_length, 3),
                    "relative_speed": round(arm.speed, 4),
                    "share_of_tokens": round(arm.requests_per_prompt * mean, 4),
                    "lengths_from": arm.lengths_source,
                    "acceptance_from": arm.accept_source,
                }
            )
        frame = pl.DataFrame(rows)
        return frame.with_columns((pl.col("share_of_tokens") / pl.col("share_of_tokens").sum()).round(4))


def _accept(requests: pl.DataFrame) -> float | None:
    """Tokens over verify steps of the answered requests that report acceptance (SGLang's own figure)."""
    if "spec_verify_ct" not in requests.columns:
        return None
    frame = requests.filter(pl.col("ok") & (pl.col("completion_tokens") > 0)).with_columns(
        pl.coalesce(
            pl.col("spec_verify_ct").cast(pl.Float64),
            pl.col("completion_tokens") / pl.col("spec_accept_length"),
        ).alias("verify")
    )
    frame = frame.filter(pl.col("verify").is_not_null() & (pl.col("verify") > 0))
    if frame.is_empty():
        return None
    return float(frame["completion_tokens"].sum() / frame["verify"].sum())


def _scaled(lengths: LengthSample, factor: float) -> LengthSample:
    """The same requests ``factor`` times as long (a cut request stays a cut one, at the scaled limit)."""
    return dataclasses.replace(
        lengths,
        tokens=lengths.tokens * factor,
        answers=None if lengths.answers is None else lengths.answers * factor,
        max_tokens=max(1, round(lengths.max_tokens * factor)),
    )


def price_plan(
    requests: pl.DataFrame,
    benchmark_max_tokens: int,
    benchmark_plan: Sequence[dict],
    arms: Sequence[Arm],
    assumptions: Sequence[ArmAssumption],
    max_tokens: int,
) -> PricedPlan:
    """Each arm of ``arms`` priced from the benchmark's requests (``requests.parquet``, with the ``arm`` each was
    sampled by) or from ``assumptions``; no plan: one arm, the benchmark's whole sample."""
    notes: list[str] = []
    tagged = (
        requests if "arm" in requests.columns else requests.with_columns(pl.lit(None, pl.String).alias("arm"))
    )
    reference = _accept(tagged)
    # as the benchmark's benchmark.json recorded it (unset fields as null), in the plan's own terms
    measured_plan = {a["name"]: Arm.model_validate(a).model_dump(exclude_none=True) for a in benchmark_plan}
    everything = LengthSample.from_requests(tagged, benchmark_max_tokens)
    if not arms:
        if measured_plan:
            notes.append(
                f"the benchmark measured a sampling plan (arms {', '.join(measured_plan)}) and the estimate prices "
                "none: one request per prompt, with the lengths and acceptance of the benchmark's whole mix"
            )
        only = PricedArm(
            None, 1.0, None, max_tokens, everything, reference, 1.0, "the benchmark", "the benchmark"
        )
        return PricedPlan((only,), reference, tuple(notes))
    assumed = {a.arm: a for a in assumptions}
    priced = []
    for arm in arms:
        own = tagged.filter(pl.col("arm") == arm.name)
        guess = assumed.get(arm.name)
        sampled = {
            k: v for k, v in arm.model_dump(exclude_none=True).items() if k not in ("share", "answers")
        }
        if not own.filter(pl.col("ok")).is_empty():
            bench_arm = measured_plan.get(arm.name, {})
            bench_sampled = {k: v for k, v in bench_arm.items() if k not in ("share", "answers")}
            bench_max = int(bench_arm.get("max_tokens") or benchmark_max_tokens)
            lengths = LengthSample.from_requests(own, bench_max)
            source = f"measured: {lengths.prompts} prompts, {own.filter(pl.col('ok')).height} requests"
            if {k: v for k, v in sampled.items() if k != "max_tokens"} != {
                k: v for k, v in bench_sampled.items() if k != "max_tokens"
            }:
                notes.append(
                    f"arm {arm.name} is sampled as {sampled} here and was benchmarked as {bench_sampled}: "
                    "its lengths and acceptance are the benchmark's"
                )
        elif guess is not None and guess.length_factor is not None:
            lengths = _scaled(everything, guess.length_factor)
            source = f"assumed: the benchmark's lengths × {guess.length_factor:g}"
        else:
            lengths = everything
            source = "the benchmark's (arm not measured)"
            notes.append(
                f"arm {arm.name}: the benchmark measured no request of it and no length_factor is assumed, so it is "
                "priced with the benchmark's lengths (a thinking-off arm writes several times fewer tokens): "
                "benchmark with this sampling_plan, or give arm_assumptions"
            )
        accept = _accept(own)
        accept_source = "measured" if accept is not None else "the benchmark's"
        if accept is None and guess is not None and guess.accept_length is not None:
            accept, accept_source = guess.accept_length, "assumed"
        if accept is None:
            accept = reference
        speed = accept / reference if accept is not None and reference else 1.0
        if accept_source == "assumed" and not reference:
            notes.append(
                f"arm {arm.name}: its assumed acceptance is unused (the benchmark measured none to compare)"
            )
        priced.append(
            PricedArm(
                arm.name,
                arm.share * arm.answers,
                arm.max_tokens,
                max_tokens,
                lengths,
                accept,
                speed,
                source,
                accept_source,
            )
        )
    return PricedPlan(tuple(priced), reference, tuple(notes))
