"""The verdict's figures: tok/s per GPU and acceptance per candidate and concurrency (bootstrap intervals), the
winner at the production concurrency (or a tie), why the ranking at concurrency 1 differs when it does, and the
days and dollars each drafter saves or costs on the full prompt set against the baseline.

One figure decides and prices: a candidate's measured tok/s per GPU at the production concurrency, with its
bootstrap interval. The winner is the best of them only when its interval lies above every other candidate's;
when the intervals overlap the verdict is a tie (both intervals are reported) and nobody wins by noise. The money
is that same figure priced: ``estimate.model.estimate_wall`` plays ``dataset_size`` prompts with the verdict's
completion lengths (speculative decoding does not change what is generated, so all candidates share them) on
``fleet_gpus`` servers at the production concurrency, each running requests at the candidate's measured
per-request speed (``tpot`` flat at the production batch). Wall time is then exactly proportional to 1 / the
figure, so the cheapest candidate is the fastest and the days' interval is the figure's interval, priced.

Rates are on the hardware's clock: a simulated server's (``draftgen sim --speed X``) are divided by X, as the
estimate does, and their seconds are on the clock the simulator kept (``JobResult.clock_kept``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from draftgen.breakdown import GROUPS, breakdown, bucket_order
from draftgen.display.plots import new_figure
from draftgen.estimate.model import LengthSample, RateModel, estimate_wall
from draftgen.rundir import write_json, write_parquet
from draftgen.rundir.layout import TUNE_VERDICT_BY_CATEGORY as VERDICT_BY_CATEGORY
from draftgen.rundir.layout import TUNE_VERDICT_BY_LENGTH as VERDICT_BY_LENGTH
from draftgen.rundir.layout import TUNE_VERDICT_SUMMARY as VERDICT_SUMMARY
from draftgen.rundir.layout import TUNE_VERDICT_TABLE as VERDICT_TABLE
from draftgen.tune.config import Candidate
from draftgen.tune.estimate import estimate
from draftgen.tune.measure import JobResult
from draftgen.tune.verdict import VerdictRun

DAY_S = 86_400.0
MONEY_RESAMPLES = 40  # rate refits behind the days/dollars interval (each one a fleet simulation)


@dataclass(frozen=True)
class Point:
    """One candidate at one concurrency."""

    candidate: Candidate
    level: int
    tok_s_per_gpu: float | None  # hardware clock
    tok_s_low: float | None
    tok_s_high: float | None
    accept_length: float | None
    accept_low: float | None
    accept_high: float | None
    accept_source: str
    steady_requests: int
    failure: str | None


@dataclass(frozen=True)
class Money:
    """One candidate's wall time and cost for the full prompt set (the estimate's model)."""

    candidate: Candidate
    rate: RateModel
    tok_s_per_gpu: float  # the fitted rate at the production concurrency
    days: float
    days_low: float
    days_high: float
    cost_usd: float
    cost_low_usd: float
    cost_high_usd: float


@dataclass(frozen=True)
class Ranking:
    """The best candidate at one concurrency, or a tie: the candidates whose intervals overlap the best one's."""

    best: Point | None  # the highest tok/s per GPU measured (None: nothing measured)
    tied: tuple[Point, ...]  # the others whose interval overlaps the best's, best first

    @property
    def winner(self) -> Candidate | None:
        return self.best.candidate if self.best is not None and not self.tied else None


def overlaps(a: Point, b: Point) -> bool:
    """Two measured points whose tok/s intervals share any value: their order may be noise."""
    a_low, a_high = a.tok_s_low or a.tok_s_per_gpu or 0.0, a.tok_s_high or a.tok_s_per_gpu or 0.0
    b_low, b_high = b.tok_s_low or b.tok_s_per_gpu or 0.0, b.tok_s_high or b.tok_s_per_gpu or 0.0
    return a_low <= b_high and b_low <= a_high


def rank(points: list[Point]) -> Ranking:
    measured = sorted(
        (p for p in points if p.tok_s_per_gpu is not None), key=lambda p: p.tok_s_per_gpu or 0.0, reverse=True
    )
    if not measured:
        return Ranking(None, ())
    best = measured[0]
    return Ranking(best, tuple(p for p in measured[1:] if overlaps(best, p)))


@dataclass(frozen=True)
class Verdict:
    run: VerdictRun
    points: tuple[Point, ...]
    production: int
    lowest: int
    ranking: Ranking  # at the production concurrency: the winner, or the tie
    ranking_at_lowest: Ranking
    reasons: tuple[str, ...]  # plain sentences: why a ranking at the lowest concurrency turns at production
    money: tuple[Money, ...]
    lengths: LengthSample | None
    servers: int
    dataset_size: int
    gpu_hour_usd: float

    @property
    def winner(self) -> Candidate | None:
        """The fastest at the production concurrency, when its interval lies above every other's (else a tie)."""
        return self.ranking.winner

    @property
    def winner_at_lowest(self) -> Candidate | None:
        return self.ranking_at_lowest.winner

    @property
    def tie(self) -> tuple[Point, ...]:
        """The candidates that tie at the production concurrency, best first (empty: a winner, or nothing)."""
        r = self.ranking
        return (r.best, *r.tied) if r.best is not None and r.tied else ()

    @property
    def baseline(self) -> Candidate:
        return self.run.candidates[0]

    @property
    def baseline_name(self) -> str:
        return baseline_name(self.baseline)

    def point(self, candidate: Candidate, level: int) -> Point | None:
        return next(
            (p for p in self.points if p.candidate.index == candidate.index and p.level == level), None
        )

    def money_of(self, candidate: Candidate) -> Money | None:
        return next((m for m in self.money if m.candidate.index == candidate.index), None)


def _point(result: JobResult, run: VerdictRun) -> Point:
    candidate = next(c for c in run.candidates if c.index == result.candidate.index)
    level = result.candidate.concurrency
    if not result.ok or not result.steady_tokens:
        return Point(candidate, level, None, None, None, None, None, None, "", 0, result.failure)
    est = estimate([result], run.config)
    hw = 1.0 / result.clock_factor
    return Point(
        candidate,
        level,
        est.tok_s_per_gpu * hw,
        est.tok_s_low * hw,
        est.tok_s_high * hw,
        est.accept_length,
        est.accept_low,
        est.accept_high,
        est.accept_source,
        est.steady_requests,
        None,
    )


def lengths_of(run: VerdictRun) -> LengthSample | None:
    rows = [
        {"prompt_id": pid, "ok": True, "completion_tokens": tokens, "truncated": cut}
        for results in run.results.values()
        for r in results
        for pid, tokens, cut in r.completions
    ]
    if not rows:
        return None
    return LengthSample.from_requests(pl.DataFrame(rows), run.config.max_tokens)


def priced_rate(candidate: Candidate, tok_s_per_gpu: float, production: int, tp: int) -> RateModel:
    """The rate curve the money plays: every running request at the speed measured at the production batch."""
    cap = candidate.settings.max_running_requests
    running = production if cap is None else min(production, cap)
    return RateModel(running / (tok_s_per_gpu * tp), 0.0, cap, source=f"verdict: {candidate.label}")


def _money(
    point: Point, lengths: LengthSample, run: VerdictRun, servers: int, production: int
) -> Money | None:
    if point.tok_s_per_gpu is None or point.tok_s_per_gpu <= 0:
        return None
    config = run.config
    rate = priced_rate(point.candidate, point.tok_s_per_gpu, production, config.tp)
    per_prompt = lengths.per_prompt(config.max_tokens)
    wall = estimate_wall(
        per_prompt, config.dataset_size, servers, production, rate, np.random.default_rng(config.seed)
    ).wall_s
    # Flat tpot: every event time of the fleet simulation scales with tpot, so the wall time at the interval's
    # ends is this one scaled (the same draws), exactly.
    low = wall * point.tok_s_per_gpu / (point.tok_s_high or point.tok_s_per_gpu)
    high = wall * point.tok_s_per_gpu / max(point.tok_s_low or point.tok_s_per_gpu, 1e-12)
    usd = servers * config.tp * config.gpu_hour_usd / 3600.0
    return Money(
        candidate=point.candidate,
        rate=rate,
        tok_s_per_gpu=point.tok_s_per_gpu,
        days=wall / DAY_S,
        days_low=low / DAY_S,
        days_high=high / DAY_S,
        cost_usd=wall * usd,
        cost_low_usd=low * usd,
        cost_high_usd=high * usd,
    )


def _short(candidate: Candidate) -> str:
    return candidate.label.split(",")[0]


def baseline_name(candidate: Candidate) -> str:
    """What the drafters are judged against: the target's MTP heads, or no speculation at all
    (``verdict_baseline: []``, a target without MTP heads)."""
    return "MTP" if candidate.settings.speculative else "no speculation"


def _verify_tokens(candidate: Candidate) -> int:
    return candidate.settings.speculative_num_draft_tokens or 1


def reason(baseline_low: Point, baseline_prod: Point, low: Point, prod: Point) -> str | None:
    """Why a drafter's ranking against the baseline (MTP) at the lowest concurrency turns at production (None:
    it does not)."""
    values = (baseline_low, baseline_prod, low, prod)
    if any(p.tok_s_per_gpu is None or p.accept_length is None for p in values):
        return None
    if overlaps(low, baseline_low) or overlaps(prod, baseline_prod):
        return None  # a ranking within the noise at either end does not turn
    better_low = (low.tok_s_per_gpu or 0) > (baseline_low.tok_s_per_gpu or 0)
    better_prod = (prod.tok_s_per_gpu or 0) > (baseline_prod.tok_s_per_gpu or 0)
    if better_low == better_prod:
        return None
    who, mtp = _short(low.candidate), _short(baseline_low.candidate)
    # one step of a request: tokens per step / tokens per second per request (both measured)
    step_ratio = (prod.accept_length / prod.tok_s_per_gpu) / (  # type: ignore[operator]
        baseline_prod.accept_length / baseline_prod.tok_s_per_gpu  # type: ignore[operator]
    )
    verify = (
        f"its verify of {_verify_tokens(prod.candidate)} tokens per request against "
        f"{baseline_name(baseline_prod.candidate)}'s {_verify_tokens(baseline_prod.candidate)}"
    )
    at_low = (
        f"{who} accepts {low.accept_length:.1f} tokens per step against {mtp}'s {baseline_low.accept_length:.1f} "
        f"at {low.level} in flight ({low.tok_s_per_gpu:,.0f} vs {baseline_low.tok_s_per_gpu:,.0f} tok/s per GPU)"
    )
    at_prod = f"{prod.tok_s_per_gpu:,.0f} vs {baseline_prod.tok_s_per_gpu:,.0f} tok/s per GPU"
    if better_low:
        return (
            f"{at_low}, but at {prod.level} in flight its step takes {step_ratio:.1f}x {mtp}'s ({verify}): "
            f"{at_prod}."
        )
    return (
        f"{at_low}, yet at {prod.level} in flight its step costs only {step_ratio:.1f}x {mtp}'s ({verify}) for "
        f"{prod.accept_length:.1f} tokens against {baseline_prod.accept_length:.1f}: {at_prod}."
    )


def verdict(run: VerdictRun) -> Verdict:
    config = run.config
    points = tuple(_point(r, run) for results in run.results.values() for r in results)
    production = config.production_concurrency
    lowest = min(run.levels)
    at = {level: [p for p in points if p.level == level] for level in run.levels}
    ranking, ranking_low = rank(at[production]), rank(at[lowest])
    winner, winner_low = ranking.winner, ranking_low.winner
    base = run.candidates[0]
    reasons = []
    by = {(p.candidate.index, p.level): p for p in points}
    if lowest != production:
        for candidate in run.candidates[1:]:
            line = reason(
                by[(base.index, lowest)],
                by[(base.index, production)],
                by[(candidate.index, lowest)],
                by[(candidate.index, production)],
            )
            if line:
                reasons.append(line)
        if winner is not None and winner_low is not None and winner.index != winner_low.index:
            reasons.insert(
                0,
                f"The ranking turns: at {lowest} in flight {_short(winner_low)} is fastest, at the production "
                f"{production} in flight {_short(winner)} is.",
            )
    lengths = lengths_of(run)
    servers = max(1, (config.fleet_gpus or len(config.groups) * config.tp) // config.tp)
    money = []
    if lengths is not None:
        for point in at[production]:
            m = _money(point, lengths, run, servers, production)
            if m is not None:
                money.append(m)
    money.sort(key=lambda m: m.candidate.index)
    return Verdict(
        run=run,
        points=points,
        production=production,
        lowest=lowest,
        ranking=ranking,
        ranking_at_lowest=ranking_low,
        reasons=tuple(reasons),
        money=tuple(money),
        lengths=lengths,
        servers=servers,
        dataset_size=config.dataset_size,
        gpu_hour_usd=config.gpu_hour_usd,
    )


def table(v: Verdict) -> pl.DataFrame:
    """One row per candidate and concurrency."""
    return pl.DataFrame(
        [
            {
                "candidate": p.candidate.label,
                "role": "baseline" if p.candidate.index == v.baseline.index else "drafter",
                "concurrency": p.level,
                "production": p.level == v.production,
                "tok_s_per_gpu": p.tok_s_per_gpu,
                "tok_s_per_gpu_low": p.tok_s_low,
                "tok_s_per_gpu_high": p.tok_s_high,
                "accept_length": p.accept_length,
                "accept_length_low": p.accept_low,
                "accept_length_high": p.accept_high,
                "accept_length_source": p.accept_source or None,
                "steady_requests": p.steady_requests,
                "failure": p.failure,
            }
            for p in sorted(v.points, key=lambda p: (p.level, p.candidate.index))
        ],
        infer_schema_length=None,
    )


def money_table(v: Verdict) -> pl.DataFrame:
    """Days and dollars of the full prompt set per candidate, and what each saves against the baseline."""
    base = v.money_of(v.baseline)
    return pl.DataFrame(
        [
            {
                "candidate": m.candidate.label,
                "tok_s_per_gpu": round(m.tok_s_per_gpu, 1),
                "days": round(m.days, 3),
                "days_low": round(m.days_low, 3),
                "days_high": round(m.days_high, 3),
                "cost_usd": round(m.cost_usd, 0),
                "cost_low_usd": round(m.cost_low_usd, 0),
                "cost_high_usd": round(m.cost_high_usd, 0),
                "days_saved_vs_baseline": round(base.days - m.days, 3) if base else None,
                "usd_saved_vs_baseline": round(base.cost_usd - m.cost_usd, 0) if base else None,
            }
            for m in v.money
        ],
        infer_schema_length=None,
    )


def _rate(p: Point) -> str:
    """tok/s per GPU with its interval."""
    return f"{p.tok_s_per_gpu:,.0f} [{p.tok_s_low:,.0f}-{p.tok_s_high:,.0f}]"


def headline(v: Verdict) -> str:
    """The verdict in one paragraph: the winner at production (or the tie) and what each drafter saves or costs
    against the baseline."""
    best = v.ranking.best
    if best is None:
        return "verdict: no candidate could be measured at the production concurrency"
    interval = f"{v.run.config.interval:.0%}"
    if v.tie:
        stays = (
            f"{v.baseline_name} (the baseline) stays"
            if any(p.candidate.index == v.baseline.index for p in v.tie)
            else "pick among them on other grounds"
        )
        first = (
            f"verdict at the production concurrency {v.production}: a tie, "
            + " and ".join(f"{_short(p.candidate)} {_rate(p)}" for p in v.tie)
            + f" tok/s per GPU ({interval} intervals overlap): none is faster beyond the noise, {stays}; "
            f"more requests per level (rounds_per_job) narrow the intervals"
        )
    else:
        base = v.point(v.baseline, v.production)
        against = (
            base is not None and base.tok_s_per_gpu is not None and best.candidate.index != v.baseline.index
        )
        first = (
            f"verdict at the production concurrency {v.production}: {_short(best.candidate)} wins with "
            f"{_rate(best)} tok/s per GPU"
            + (
                f" against {_short(v.baseline)}'s {_rate(base)}"  # type: ignore[arg-type]
                if against
                else f" ({v.baseline_name}, the baseline, stays)"
            )
            + f" ({interval} intervals)"
        )
    lines = [first]
    base_money = v.money_of(v.baseline)
    for m in v.money:
        if base_money is None or m.candidate.index == v.baseline.index:
            continue
        saved = base_money.days - m.days
        usd = base_money.cost_usd - m.cost_usd
        within_noise = any(p.candidate.index == m.candidate.index for p in v.tie)
        verb = "saves" if saved > 0 else "costs"
        lines.append(
            f"  {_short(m.candidate)} {verb} {abs(saved):,.3g} days and ${abs(usd):,.0f} against {v.baseline_name} on "
            f"{v.dataset_size:,} prompts with {v.servers * v.run.config.tp} GPUs ({m.days:,.3g} vs "
            f"{base_money.days:,.3g} days)"
            + (" at the point figures, within the noise" if within_noise else "")
        )
    lines += [f"  {r}" for r in v.reasons]
    return "\n".join(lines)


def _tie_row(p: Point) -> dict:
    return {
        "candidate": p.candidate.label,
        "tok_s_per_gpu": p.tok_s_per_gpu,
        "tok_s_per_gpu_low": p.tok_s_low,
        "tok_s_per_gpu_high": p.tok_s_high,
    }


def summary(v: Verdict) -> dict:
    return {
        "production_concurrency": v.production,
        "levels": list(v.run.levels),
        "prompts": v.run.prompts_path,
        "winner": v.winner.label if v.winner else None,
        "tie": [_tie_row(p) for p in v.tie],  # the candidates whose intervals overlap the best's (no winner)
        "winner_settings": v.winner.settings.model_dump(mode="json") if v.winner else None,
        "winner_at_lowest_concurrency": v.winner_at_lowest.label if v.winner_at_lowest else None,
        "baseline": v.baseline.label,
        "reasons": list(v.reasons),
        "headline": headline(v),
        "money": money_table(v).to_dicts(),
        "dataset_size": v.dataset_size,
        "fleet_gpus": v.servers * v.run.config.tp,
        "gpu_hour_usd": v.gpu_hour_usd,
        "wall_time_s": v.run.finished_at - v.run.started_at,
    }


def by_category(v: Verdict) -> pl.DataFrame:
    """Each candidate's acceptance length and per-request tok/s by prompt category at every level, with the
    request counts and 95% intervals (``draftgen.breakdown``) and ``accept_vs_baseline``, the candidate's
    acceptance over the baseline's in the same category and level: where a drafter's gain is made or lost.
    Empty when the prompts carry no category (held-out prompts keep the category of their rows)."""
    return _broken_down(v, "category")


def by_length(v: Verdict) -> pl.DataFrame:
    """The same by output length (completion-token buckets, ``output_tokens``): whether a drafter's gain holds
    on long answers, where acceptance falls for some drafters."""
    return _broken_down(v, "length")


def _broken_down(v: Verdict, by: str) -> pl.DataFrame:
    column = GROUPS[by]
    tables = []
    for results in v.run.results.values():
        for result in results:
            if not result.ok or not result.per_request:
                continue
            requests = pl.DataFrame(
                result.per_request,
                schema={
                    "category": pl.String,
                    "completion_tokens": pl.Float64,
                    "verify_ct": pl.Int64,
                    "latency_s": pl.Float64,
                },
                orient="row",
            ).with_columns(pl.col("latency_s") * result.clock_factor)
            if by == "category" and requests["category"].drop_nulls().is_empty():
                continue
            tables.append(
                breakdown(requests, by).select(
                    pl.lit(result.candidate.label).alias("candidate"),
                    pl.lit(result.candidate.index).alias("index"),
                    pl.lit(result.candidate.concurrency).alias("concurrency"),
                    pl.all(),
                )
            )
    if not tables:
        return pl.DataFrame()
    frame = pl.concat(tables, how="vertical_relaxed")
    base = frame.filter(pl.col("index") == v.baseline.index).select(
        "concurrency", column, pl.col("accept_length").alias("baseline_accept_length")
    )
    order = [pl.col(column).map_elements(bucket_order, return_dtype=pl.Int64)] if by == "length" else [column]
    return (
        frame.join(base, on=["concurrency", column], how="left")
        .with_columns(
            (pl.col("accept_length") / pl.col("baseline_accept_length")).round(3).alias("accept_vs_baseline")
        )
        .drop("index", "baseline_accept_length")
        .sort([pl.col("concurrency"), *order, pl.col("candidate")])
    )


def save_verdict(v: Verdict, out_dir: str | Path) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / VERDICT_TABLE, table(v))
    for name, frame in ((VERDICT_BY_CATEGORY, by_category(v)), (VERDICT_BY_LENGTH, by_length(v))):
        if not frame.is_empty():
            write_parquet(out / name, frame)
    info = summary(v)
    write_json(out / VERDICT_SUMMARY, info, indent=2, default=str)
    return info


def plot_verdict(v: Verdict, value: str = "tok_s_per_gpu") -> Figure:
    """tok/s per GPU (or acceptance) against concurrency per candidate, production concurrency marked; the axis
    starts at 0 tok/s (or an acceptance length of 1), so a small gap is drawn small."""
    frame = table(v).filter(pl.col(value).is_not_null())
    fig, ax = new_figure((8, 4.5))
    for label in dict.fromkeys(frame["candidate"].to_list()):
        rows = frame.filter(pl.col("candidate") == label).sort("concurrency")
        x = rows["concurrency"].to_list()
        y = rows[value].to_list()
        lows, highs = rows[f"{value}_low"].to_list(), rows[f"{value}_high"].to_list()
        err = [
            [v_ - (lo if lo is not None else v_) for v_, lo in zip(y, lows, strict=True)],
            [(hi if hi is not None else v_) - v_ for v_, hi in zip(y, highs, strict=True)],
        ]
        style = "--" if rows["role"][0] == "baseline" else "-"
        ax.errorbar(x, y, yerr=err, fmt=style + "o", capsize=3, label=label.split(",")[0])
    ax.axvline(v.production, color="grey", linestyle=":", label=f"production: {v.production} in flight")
    ax.set_xscale("log", base=2)
    levels = sorted(set(frame["concurrency"].to_list()) | {v.production})
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()
    ax.set_xlabel("requests in flight per server")
    interval = f"({v.run.config.interval:.0%} intervals)"
    if value == "tok_s_per_gpu":
        ax.set_ylabel("output tok/s per GPU")
        ax.set_ylim(bottom=0)  # from zero: a gap between candidates reads at its true size
        ax.set_title(f"Which candidate makes the most output tok/s per GPU at each concurrency? {interval}")
    else:
        ax.set_ylabel("acceptance length\n(tokens per verify step; 1 = none accepted)")
        ax.set_ylim(bottom=1.0)  # from one, no draft token accepted, as every acceptance plot
        ax.set_title(f"What acceptance length does each candidate reach at each concurrency? {interval}")
    ax.legend(fontsize="small")
    return fig


def format_table(v: Verdict) -> str:
    lines = [f"{'candidate':<30} {'c':>4} {'tok/s per GPU':>24} {'acceptance':>20}"]
    for row in table(v).iter_rows(named=True):
        if row["tok_s_per_gpu"] is None:
            lines.append(f"{row['candidate'].split(',')[0]:<30} {row['concurrency']:>4}   {row['failure']}")
            continue
        rate = (
            f"{row['tok_s_per_gpu']:,.0f} [{row['tok_s_per_gpu_low']:,.0f}-{row['tok_s_per_gpu_high']:,.0f}]"
        )
        accept = f"{row['accept_length']:.2f}" if row["accept_length"] is not None else "-"
        if row["accept_length_low"] is not None:
            accept += f" [{row['accept_length_low']:.2f}-{row['accept_length_high']:.2f}]"
        lines.append(f"{row['candidate'].split(',')[0]:<30} {row['concurrency']:>4} {rate:>24} {accept:>20}")
    return "\n".join(lines)
