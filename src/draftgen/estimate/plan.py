"""Benchmark + prompt count → wall time, days, GPU-hours and dollars per scenario, with an interval and sweeps.

Every time, rate and dollar is on the benchmarked hardware's clock (``BenchmarkData.clock``): a benchmark of
``draftgen sim --speed 5`` is priced in simulated-B200 hours, not in the sped-up wall clock's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from draftgen.estimate.acceptance_mix import AcceptanceMix, acceptance_mix, set_rooms
from draftgen.estimate.arms import PlanDraws, PricedPlan, price_plan
from draftgen.estimate.config import EstimateConfig, ScenarioSpec
from draftgen.estimate.conversations import Conversations
from draftgen.estimate.inputs import (
    BenchmarkData,
    audit_prompt_set,
    dataset_size,
    find_latest_benchmark,
    load_benchmark,
    measured_answers,
    planned_requests,
    sent_conversations,
)
from draftgen.estimate.model import (
    LengthSample,
    RateFit,
    RateModel,
    bootstrap_walls,
    estimate_wall,
    fit_rate_model,
    resampled_rates,
)
from draftgen.prompts.audit import PromptAudit

DAY_S = 86_400.0
SWEEP_CONCURRENCY = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SWEEP_MAX_TOKENS = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


@dataclass(frozen=True)
class Measured:
    """One benchmark, digested: its rate curve (and resampled curves for the interval) and its lengths; with
    ``mix``, the curves the set is priced at (``rate``, ``rates``): scaled to the acceptance of its mix of prompts."""

    data: BenchmarkData
    fit: RateFit
    boot_rates: tuple[RateModel, ...]
    lengths: LengthSample
    mix: AcceptanceMix | None = None

    @property
    def rate(self) -> RateModel:
        return self.rates_at_mix((self.fit.model,))[0]

    @property
    def rates(self) -> list[RateModel]:
        return self.rates_at_mix(self.boot_rates)

    def rates_at_mix(self, rates: tuple[RateModel, ...]) -> list[RateModel]:
        if self.mix is None:
            return list(rates)
        return [rate.scaled(self.mix.factor, f"{rate.source}, at the set's acceptance") for rate in rates]

    def at_mix(self, audit: PromptAudit) -> Measured:
        """Priced at the acceptance of the set ``audit`` describes (unchanged when the benchmark has no verify
        counts)."""
        return dataclasses.replace(self, mix=acceptance_mix(self.data.requests, set_rooms(audit)))


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    gpus: int
    concurrency_per_server: int
    max_tokens: int
    num_prompts: int
    gpu_hour_usd: float
    source: str  # "measured: <benchmark folder>" or "assumed: N tok/s per GPU"
    tok_s_per_gpu: float  # full-batch output tok/s of one server at this concurrency
    steady_output_tok_s: float  # the fleet's full-batch rate
    aggregate_output_tok_s: float  # all tokens / wall time (ramp and drain included): what a run will show
    mean_completion_tokens: float
    total_output_tokens: float
    truncated_rate: float
    wall_time_s: float
    wall_time_low_s: float
    wall_time_high_s: float
    tail_s: float
    lengths_are_lower_bound: bool  # max_tokens above the benchmark's: truncated completions may run longer
    interval_note: str

    @property
    def days(self) -> float:
        return self.wall_time_s / DAY_S

    @property
    def gpu_hours(self) -> float:
        return self.wall_time_s / 3600.0 * self.gpus

    @property
    def cost_usd(self) -> float:
        return self.gpu_hours * self.gpu_hour_usd

    @property
    def trained_tokens(self) -> float:
        """Tokens a trainer learns from: every generated one, the run being capped at the trainer's max_length
        (validate's held-out prompts aside)."""
        return self.total_output_tokens

    @property
    def gpu_s_per_m_trained(self) -> float:
        """GPU-seconds per million trained tokens."""
        return self.wall_time_s * self.gpus / self.trained_tokens * 1e6 if self.trained_tokens else math.inf

    @property
    def usd_per_m_trained(self) -> float:
        return self.gpu_s_per_m_trained / 3600.0 * self.gpu_hour_usd

    def row(self) -> dict:
        hours = 3600.0 / self.gpus  # seconds per GPU-hour at this fleet size
        return {
            "scenario": self.name,
            "requests": self.num_prompts,
            "gpus": self.gpus,
            "concurrency_per_server": self.concurrency_per_server,
            "max_tokens": self.max_tokens,
            "tok_s_per_gpu": round(self.tok_s_per_gpu, 1),
            "fleet_tok_s": round(self.aggregate_output_tok_s, 1),
            "days": round(self.days, 3),
            "days_low": round(self.wall_time_low_s / DAY_S, 3),
            "days_high": round(self.wall_time_high_s / DAY_S, 3),
            "gpu_hours": round(self.gpu_hours, 1),
            "cost_usd": round(self.cost_usd, 0),
            "cost_low_usd": round(self.wall_time_low_s / hours * self.gpu_hour_usd, 0),
            "cost_high_usd": round(self.wall_time_high_s / hours * self.gpu_hour_usd, 0),
            "trained_tokens": round(self.trained_tokens),
            "gpu_s_per_m_trained": round(self.gpu_s_per_m_trained, 1),
            "usd_per_m_trained": round(self.usd_per_m_trained, 3),
            "source": self.source,
        }


@dataclass(frozen=True)
class Estimate:
    config: EstimateConfig
    benchmark: Measured
    num_prompts: int
    num_prompts_source: str
    production: ScenarioResult
    concurrency_1: ScenarioResult
    scenarios: tuple[ScenarioResult, ...]
    sweeps: dict[str, pl.DataFrame]
    notes: tuple[str, ...]
    prefill_s_per_request: float | None
    # the conversations ``num_prompts`` counts the requests of (None: a size given, or a sampling plan's samples)
    set_conversations: int | None = None
    max_length_cost: MaxLengthCost | None = None
    plan: PricedPlan | None = None  # the sampling plan priced from the production benchmark
    audit: PromptAudit | None = None  # the prompt file as generate will take it (what is priced)
    created_at: float = field(default_factory=time.time)

    def table(self) -> pl.DataFrame:
        rows = [self.production.row(), self.concurrency_1.row(), *(s.row() for s in self.scenarios)]
        return pl.DataFrame(rows)

    def arms_table(self) -> pl.DataFrame:
        """Per arm of the sampling plan: requests, lengths, acceptance, speed, and where each came from."""
        if self.plan is None:
            return pl.DataFrame()
        return self.plan.table(self.num_prompts)


@dataclass(frozen=True)
class MaxLengthCost:
    """What the trainer's max_length will cut, from the benchmark's own requests (prompt + completion tokens)."""

    max_length: int
    share_of_tokens: float  # generated tokens past max_length ÷ generated tokens
    share_of_requests: float  # requests whose prompt + completion is longer than max_length
    median_prompt_tokens: float
    requests: int

    def note(self, max_tokens: int) -> str:
        return (
            f"max_tokens {max_tokens} + prompts (median {self.median_prompt_tokens:,.0f} tokens) against the "
            f"trainer's max_length {self.max_length}: uncapped, {self.share_of_tokens:.1%} of the generated tokens "
            f"({self.share_of_requests:.1%} of the {self.requests} benchmark requests) would fall past it and be "
            "cut in training. Priced capped, as generate runs with a tokenizer: each request's max_tokens is "
            "min(max_tokens, max_length − its prompt), so those tokens are never generated"
        )


def max_length_cost(requests: pl.DataFrame, max_length: int) -> MaxLengthCost | None:
    """The share of generated tokens a trainer cutting rows at ``max_length`` loses; None without the counts."""
    if (
        not max_length
        or "prompt_tokens" not in requests.columns
        or "completion_tokens" not in requests.columns
    ):
        return None
    known = requests.filter(pl.col("prompt_tokens").is_not_null() & pl.col("completion_tokens").is_not_null())
    if not known.height:
        return None
    prompt = known["prompt_tokens"].to_numpy().astype(float)
    made = known["completion_tokens"].to_numpy().astype(float)
    past = np.clip(prompt + made - max_length, 0, made)
    return MaxLengthCost(
        max_length=max_length,
        share_of_tokens=float(past.sum() / made.sum()) if made.sum() else 0.0,
        share_of_requests=float((past > 0).mean()),
        median_prompt_tokens=float(np.median(prompt)),
        requests=known.height,
    )


def digest(data: BenchmarkData, bootstrap: int, rng: np.random.Generator, max_length: int = 0) -> Measured:
    fit = fit_rate_model(data.occupancy, data.max_running, source=f"measured: {data.path}")
    rates = resampled_rates(data.occupancy, data.max_running, bootstrap, rng)
    return Measured(
        data=data,
        fit=fit,
        boot_rates=tuple(rates),
        lengths=LengthSample.from_requests(data.requests, data.max_tokens, max_length),
    )


def priced(measured: Measured, config: EstimateConfig) -> PricedPlan:
    """The estimate's sampling plan priced from one benchmark's requests (or the config's assumptions)."""
    plan = (measured.data.summary.get("config") or {}).get("sampling_plan") or []
    return price_plan(
        measured.data.requests,
        measured.data.max_tokens,
        plan,
        config.sampling_plan,
        config.arm_assumptions,
        config.max_tokens,
    )


def evaluate(
    name: str,
    measured: Measured,
    rate: RateModel,
    boot_rates: list[RateModel],
    *,
    gpus: int,
    concurrency: int,
    max_tokens: int,
    num_prompts: int,
    gpu_hour_usd: float,
    interval: float,
    source: str,
    interval_note: str,
    rng: np.random.Generator,
    plan: PricedPlan,
    conversations: Conversations | None = None,
) -> ScenarioResult:
    """One scenario's wall time: requests drawn from the plan's arms (``draftgen.estimate.arms``: no plan, the
    benchmark's lengths), simulated on ``rate`` in work units as ``conversations`` (each turn clipped at its room
    under the trainer's max_length), tokens counted apart."""
    draws = plan.draws(max_tokens)
    shape = {
        "conversations": conversations,
        "weights": draws.weights,
        "tokens": draws.tokens,
        "answers": draws.answers,
    }
    point = estimate_wall(draws.work, num_prompts, gpus, concurrency, rate, rng, **shape)
    walls = bootstrap_walls(draws.work, boot_rates, num_prompts, gpus, concurrency, rng, **shape)
    low, high = np.quantile(walls, [(1 - interval) / 2, (1 + interval) / 2])
    mean_tokens = (
        draws.mean_tokens
        if conversations is None
        else conversations.mean_work(draws.tokens, draws.tokens, draws.weights, draws.answers)
    )
    total_tokens = num_prompts * mean_tokens
    return ScenarioResult(
        name=name,
        gpus=gpus,
        concurrency_per_server=concurrency,
        max_tokens=max_tokens,
        num_prompts=num_prompts,
        gpu_hour_usd=gpu_hour_usd,
        source=source,
        tok_s_per_gpu=rate.tok_s(concurrency),
        steady_output_tok_s=gpus * rate.tok_s(concurrency),
        aggregate_output_tok_s=total_tokens / point.wall_s,
        mean_completion_tokens=mean_tokens,
        total_output_tokens=total_tokens,
        truncated_rate=plan.truncated_rate(),
        wall_time_s=point.wall_s,
        wall_time_low_s=float(min(low, point.wall_s)),
        wall_time_high_s=float(max(high, point.wall_s)),
        tail_s=point.tail_s,
        lengths_are_lower_bound=plan.lengths_are_lower_bound(),
        interval_note=interval_note,
    )


def _scenario(
    spec: ScenarioSpec,
    config: EstimateConfig,
    main: Measured,
    num_prompts: int,
    rng: np.random.Generator,
    conversations: Conversations | None = None,
    audit: PromptAudit | None = None,
) -> ScenarioResult:
    concurrency = spec.concurrency_per_server or config.concurrency_per_server
    usd = config.gpu_hour_usd if spec.gpu_hour_usd is None else spec.gpu_hour_usd
    common = {
        "gpus": spec.gpus,
        "concurrency": concurrency,
        "max_tokens": config.max_tokens,
        "num_prompts": spec.num_prompts or num_prompts,
        "gpu_hour_usd": usd,
        "interval": config.interval,
        "rng": rng,
        "conversations": conversations,
    }
    if spec.tok_s_per_gpu:
        cap = spec.max_running_requests or main.fit.model.max_running
        base = RateModel(main.fit.model.alpha_s, main.fit.model.beta_s, cap, "")
        factor = spec.tok_s_per_gpu / base.tok_s(concurrency)
        source = f"assumed: {spec.tok_s_per_gpu:,.0f} tok/s per GPU at {concurrency} in flight"
        rate = base.scaled(factor, source)
        note = "throughput assumed, not measured: the interval covers completion lengths only"
        return evaluate(
            spec.name,
            main,
            rate,
            [rate] * len(main.boot_rates),
            source=source,
            interval_note=note,
            plan=priced(main, config),
            **common,
        )
    measured = main
    if spec.benchmark_dir:
        measured = digest(
            load_benchmark(spec.benchmark_dir), len(main.boot_rates), rng, main.lengths.max_length
        )
        measured = measured if audit is None else measured.at_mix(audit)
    rate = measured.rate
    if spec.max_running_requests:
        rate = RateModel(rate.alpha_s, rate.beta_s, spec.max_running_requests, rate.source)
    source = f"measured: {measured.data.path}"
    return evaluate(
        spec.name,
        measured,
        rate,
        measured.rates,
        source=source,
        interval_note=_boot_note(measured),
        plan=priced(measured, config),
        **common,
    )


def _boot_note(measured: Measured) -> str:
    servers = measured.data.servers
    spread = (
        "the spread between its servers" if servers > 1 else "nothing else (one server: no spread measured)"
    )
    return f"bootstrap over the benchmark's {measured.lengths.prompts} prompts and {spread}"


def sweeps(
    main: Measured,
    plan: PricedPlan,
    num_prompts: int,
    gpus: int,
    concurrency: int,
    max_tokens: int,
    seed: int,
    conversations: Conversations | None = None,
) -> dict[str, pl.DataFrame]:
    """Point estimates (days) when one parameter moves and the others stay at production values.

    Every point draws the same random lengths (common random numbers), so neighbouring points differ by the
    parameter, not by the draw.
    """
    rate = main.rate
    per_prompt = plan.draws(max_tokens)
    measured_to = main.data.max_in_flight

    def days(pp: PlanDraws, g: int, c: int) -> float:
        draw = np.random.default_rng(seed)
        wall = estimate_wall(
            pp.work,
            num_prompts,
            g,
            c,
            rate,
            draw,
            repeats=3,
            conversations=conversations,
            weights=pp.weights,
            tokens=pp.tokens,
            answers=pp.answers,
        )
        return wall.wall_s / DAY_S

    levels = sorted({*SWEEP_CONCURRENCY, concurrency, *main.data.levels})
    by_concurrency = pl.DataFrame(
        {
            "concurrency_per_server": levels,
            "days": [days(per_prompt, gpus, c) for c in levels],
            "extrapolated": [
                c > measured_to and (rate.max_running is None or measured_to < rate.max_running)
                for c in levels
            ],
        }
    )
    tokens = sorted({*(t for t in SWEEP_MAX_TOKENS if t <= 2 * main.lengths.max_tokens), max_tokens})
    by_max_tokens = pl.DataFrame(
        {
            "max_tokens": tokens,
            "days": [days(plan.draws(t), gpus, concurrency) for t in tokens],
            "lower_bound": [main.lengths.extrapolated(t) for t in tokens],
        }
    )
    counts = sorted({*range(1, max(16, 2 * gpus) + 1)})
    by_gpus = pl.DataFrame({"gpus": counts, "days": [days(per_prompt, g, concurrency) for g in counts]})
    return {"concurrency": by_concurrency, "max_tokens": by_max_tokens, "gpus": by_gpus}


def _prefill_per_request(data: BenchmarkData) -> float | None:
    """Median TTFT at the lowest measured concurrency: an upper bound on one request's prefill (plus one step)."""
    lowest = data.results.filter(pl.col("concurrency") == min(data.levels)).drop_nulls("ttft_s_p50")
    return float(lowest["ttft_s_p50"].median()) if lowest.height else None


def run_estimate(config: EstimateConfig) -> Estimate:
    rng = np.random.default_rng(config.seed)
    folder = Path(config.benchmark_dir) if config.benchmark_dir else find_latest_benchmark()
    main = digest(load_benchmark(folder), config.bootstrap, rng, config.train_max_length)
    # later turns' prompts hold earlier answers as long as the benchmark measured the target's
    audit = audit_prompt_set(config, measured_answers(main.data))
    main = main.at_mix(audit)
    num_prompts, size_source = dataset_size(
        config.dataset_size, config.prompt_path, config.limit, config.turns, audit
    )
    num_prompts = max(1, num_prompts)
    # a run of exactly this set is compared by its own span (generate.report.compare_estimate)
    set_conversations = None if config.dataset_size or config.sampling_plan else audit.sent
    # each turn capped at its room (generate's length cap), a conversation's turns one after another in one slot
    conversations = sent_conversations(audit)
    plan = priced(main, config)
    if config.sampling_plan and not config.dataset_size:
        num_prompts, counted = planned_requests(
            config.prompt_path, config.limit, config.turns, config.sampling_plan, config.keep_duplicates
        )
        size_source = f"the planned samples of {counted:,} prompts of {config.prompt_path} (sampling_plan)"
        if config.turns == "all":
            size_source += ", one request per assistant turn (turns: all)"
        budgets = audit.budgets
        if config.turns == "all" and budgets is not None and budgets.turns:
            kept = budgets.sent / budgets.turns
            num_prompts = max(1, round(num_prompts * kept))
            size_source += (
                f", {kept:.1%} of them sent (the rest set aside under max_length or after a conversation ended, "
                "by the audit)"
            )
    elif config.sampling_plan:
        answers = plan.requests_per_prompt
        num_prompts = max(1, round(num_prompts * answers))
        size_source = f"{size_source} x {answers:g} expected samples per prompt (sampling_plan)"
    gpus = config.gpus or main.data.servers
    notes = list(plan.notes)
    if main.data.clock.simulated:
        notes.append(f"{main.data.clock.note}; the benchmark's parquet files keep the raw wall-clock figures")
    if main.fit.note:
        notes.append(f"rate fit: {main.fit.note}")
    if main.mix is not None and abs(main.mix.factor - 1.0) >= 0.001:
        notes.append(main.mix.note)
    if main.fit.max_abs_rel_error > 0.05:
        notes.append(
            f"the linear tpot model misses a measured point by {main.fit.max_abs_rel_error:.0%}: "
            "compare the fit table with the benchmark before trusting the tail"
        )
    if main.lengths.extrapolated(config.max_tokens):
        notes.append(
            f"max_tokens {config.max_tokens} is above the benchmark's {main.lengths.max_tokens}: completions it cut "
            "are counted at the benchmark's limit, so tokens, days and dollars are lower bounds. Benchmark at "
            f"max_tokens {config.max_tokens} for a real figure."
        )
    if config.concurrency_per_server > max(main.data.max_in_flight, 1) and (
        main.fit.model.max_running is None or main.data.max_in_flight < main.fit.model.max_running
    ):
        notes.append(
            f"concurrency_per_server {config.concurrency_per_server} is above the most the benchmark kept in flight "
            f"({main.data.max_in_flight}) and below the batch cap: the rate there is extrapolated"
        )
    if main.data.summary.get("failed"):
        notes.append(
            f"{main.data.summary['failed']} benchmark requests failed: their lengths are not in the model"
        )
    common = {
        "max_tokens": config.max_tokens,
        "num_prompts": num_prompts,
        "interval": config.interval,
        "rng": rng,
        "conversations": conversations,
        "plan": plan,
    }
    production = evaluate(
        "production (this benchmark)",
        main,
        main.rate,
        main.rates,
        gpus=gpus,
        concurrency=config.concurrency_per_server,
        gpu_hour_usd=config.gpu_hour_usd,
        source=f"measured: {main.data.path}",
        interval_note=_boot_note(main),
        **common,
    )
    concurrency_1 = evaluate(
        "same fleet at concurrency 1 (the old method)",
        main,
        main.rate,
        main.rates,
        gpus=gpus,
        concurrency=1,
        gpu_hour_usd=config.gpu_hour_usd,
        source=f"measured: {main.data.path}",
        interval_note=_boot_note(main),
        **common,
    )
    scenarios = tuple(
        _scenario(spec, config, main, num_prompts, rng, conversations, audit) for spec in config.scenarios
    )
    cost = max_length_cost(main.data.requests, config.train_max_length)
    if cost is not None and cost.share_of_tokens > 0:
        notes.append(cost.note(config.max_tokens))
    if main.lengths.set_aside:
        notes.append(
            f"{main.lengths.set_aside} benchmark requests had prompts of {config.train_max_length} tokens or more: "
            "generate sets such prompts aside (nothing they generate could train), so they are not priced"
        )
    return Estimate(
        config=config,
        benchmark=main,
        num_prompts=num_prompts,
        num_prompts_source=size_source,
        set_conversations=set_conversations,
        production=production,
        concurrency_1=concurrency_1,
        scenarios=scenarios,
        sweeps=sweeps(
            main,
            plan,
            num_prompts,
            gpus,
            config.concurrency_per_server,
            config.max_tokens,
            config.seed,
            conversations,
        ),
        notes=tuple(notes),
        prefill_s_per_request=_prefill_per_request(main.data),
        max_length_cost=cost,
        plan=plan,
        audit=audit,
    )
