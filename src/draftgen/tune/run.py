"""Successive halving over the candidates, one job per GPU group at a time.

Round 0 measures every candidate once. Each later round keeps the best 1/eta (by tok/s per GPU so far) and
fills every GPU group of the round's waves: each survivor gets the same number of jobs, and the groups left over
go to the leaders, so the contenders get more requests while no GPU idles; a candidate's estimate pools every job
it had. With ``equal_time`` a round's jobs measure for about the same time (see ``measure.RoundClock``), so a wave
does not wait on its slowest candidate. In the last round the seeds' 3/1/4 runs beside the finalists at
their concurrencies, on the same prompts at the same time, for a like-for-like gain over the seeds. A candidate that fails to start is marked with its log tail and
leaves the race; the others go on. The run ends after ``max_rounds`` rounds or with one candidate left.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from draftgen.bench.sample import PromptSample, sample_prompts
from draftgen.prompts.rows import PromptRow
from draftgen.tune.config import Candidate, TuneConfig
from draftgen.tune.estimate import Estimate, estimate
from draftgen.tune.launch import preflight
from draftgen.tune.measure import JobResult, RoundClock, run_job
from draftgen.tune.verdict import VerdictRun, run_verdict


@dataclass(frozen=True)
class Job:
    candidate: Candidate
    round: int
    replica: int
    # A replay of a job as it ran: at most this many requests, and the round's measuring time it saw.
    limit: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class TuneRun:
    config: TuneConfig
    candidates: tuple[Candidate, ...]
    jobs: tuple[JobResult, ...]
    estimates: dict[int, Estimate]  # candidate index → pooled estimate (measured candidates only)
    eliminated_in: dict[int, int]  # candidate index → round after which it was dropped
    chosen: Candidate | None
    baseline: JobResult | None  # the seeds' 3/1/4 at the chosen's concurrency
    confirm: JobResult | None  # the chosen candidate measured beside it
    seeds_jobs: tuple[JobResult, ...]  # every job of the seeds' 3/1/4 (one per finalist concurrency)
    started_at: float
    finished_at: float
    verdict: VerdictRun | None = None  # MTP against each drafter at verdict_levels (None: not asked)


def _rows(sample: PromptSample, config: TuneConfig, job: Job, groups: int) -> list[PromptRow]:
    """The same prompts for every candidate of a round (a paired comparison); new ones for each round/replica.

    One row more than the job sends: the last only marks where its measurement ends (``SendLimit``)."""
    n = config.job_requests(job.candidate.concurrency)
    count = n if job.limit is None else min(job.limit, n)
    return sample.slice((job.round * groups + job.replica) * n, count + 1)


async def run_jobs(
    config: TuneConfig,
    jobs: Sequence[Job],
    groups: Sequence[int],
    sample: PromptSample,
    report: Callable[[JobResult], None],
    equal_time: bool = False,
) -> list[JobResult]:
    """Run ``jobs`` (one round) on the given GPU groups, one job per group at a time, in order of the list."""
    queue: asyncio.Queue[Job] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    results: list[JobResult] = []
    clock = RoundClock() if equal_time else None

    async def worker(group: int) -> None:
        while not queue.empty():
            job = queue.get_nowait()
            rows = _rows(sample, config, job, len(config.groups))
            own = RoundClock(job.seconds) if job.seconds is not None else clock
            result = await run_job(
                config, job.candidate, job.round, group, rows, replica=job.replica, clock=own
            )
            results.append(result)
            report(result)

    async with asyncio.TaskGroup() as tasks:
        for group in groups:
            tasks.create_task(worker(group))
    return results


def longest_first(candidates: Sequence[Candidate], done: Sequence[JobResult]) -> list[Candidate]:
    """Longest jobs first, so a round does not end waiting on one slow job started last (GPUs stay busy).

    Measured candidates by their jobs' mean duration so far; unmeasured ones by a guess: fewer tokens per step
    (MTP off, fewer draft tokens) and more requests in flight take longer.
    """

    def seconds(c: Candidate) -> float | None:
        own = [j.finished_at - j.started_at for j in done if j.candidate.index == c.index and j.ok]
        return sum(own) / len(own) if own else None

    def guess(c: Candidate) -> tuple[float, int]:
        return (c.settings.speculative_num_draft_tokens or 1, -c.concurrency)

    if all(seconds(c) is not None for c in candidates):
        return sorted(candidates, key=lambda c: -(seconds(c) or 0.0))
    return sorted(candidates, key=guess)


def _line(result: JobResult, estimates: dict[int, Estimate]) -> str:
    head = f"  round {result.round} GPU group {result.group} {result.candidate.label} c={result.candidate.concurrency}"
    if not result.ok:
        tail = "\n      | ".join(result.log_tail[-8:])
        return f"{head}: {result.failure}" + (f"\n      | {tail}" if tail else "")
    est = estimates.get(result.candidate.index)
    pooled = f", pooled {est.tok_s_per_gpu:,.0f} tok/s per GPU" if est else ""
    seconds = result.finished_at - result.started_at
    finished = result.requests - result.cancelled_requests
    clock = ", stopped at the round's time" if result.stopped_by_clock else ""
    return (
        f"{head}: {finished - result.failed_requests}/{finished} ok in {seconds:.1f}s{clock}, "
        f"{len(result.steady_tokens)} steady, acceptance {result.accept_length or float('nan'):.2f}{pooled}"
    )


def jobs_per_candidate(ranked: Sequence[Candidate], groups: int, extra: int) -> dict[int, int]:
    """Jobs per candidate for a round after the first: whole waves of ``groups`` jobs, ``extra`` of them taken
    by the seeds' jobs; every candidate gets the same number and the groups left over go to the best-ranked."""
    if not ranked:
        return {}
    waves = max(1, math.ceil((len(ranked) + extra) / groups))
    slots = max(len(ranked), waves * groups - extra)
    each, spare = divmod(slots, len(ranked))
    return {c.index: each + (rank < spare) for rank, c in enumerate(ranked)}


async def run_tune(
    config: TuneConfig,
    log: Callable[[str], None] = print,
    on_race: Callable[[TuneRun], object] | None = None,
) -> TuneRun:
    """The race (unless ``race`` is off), then the verdict (when ``verdict_levels`` are given).

    ``on_race`` gets the race's result before a verdict starts (the notebook saves its report and settings
    file there): a verdict that fails or is interrupted loses none of the race's GPU hours, and ``serve
    --settings`` can start the winner while the verdict is still measuring."""
    started_at = time.time()
    if config.race:
        run = await run_race(config, log)
        if on_race is not None and config.verdict_levels:
            on_race(run)
    else:
        preflight(config, config.verdict_candidates()[0])
        run = TuneRun(config, (), (), {}, {}, None, None, None, (), started_at, started_at)
    if not config.verdict_levels:
        return run
    verdict = await run_verdict(config, log)
    return replace(run, verdict=verdict, finished_at=time.time())


async def run_race(config: TuneConfig, log: Callable[[str], None] = print) -> TuneRun:
    candidates = config.candidates()
    groups = list(range(len(config.groups)))
    preflight(config, candidates[0])
    started_at = time.time()
    most = max(config.job_requests(c.concurrency) for c in candidates)
    sample = await asyncio.to_thread(
        sample_prompts, config.prompt_path, max(config.sample_size, most), config.seed
    )
    log(
        f"tune: {len(candidates)} candidates on {len(groups)} GPU group(s), engine {config.engine}; "
        f"{len(sample.rows)} prompts sampled from {sample.path}"
    )
    jobs: list[JobResult] = []
    estimates: dict[int, Estimate] = {}
    eliminated: dict[int, int] = {}

    def refresh(result: JobResult) -> None:
        jobs.append(result)
        index = result.candidate.index
        pooled = [j for j in jobs if j.candidate.index == index and j.ok]
        if pooled and not any(j.start_failed for j in jobs if j.candidate.index == index):
            estimates[index] = estimate(pooled, config)
        log(_line(result, estimates))

    baselines: list[JobResult] = []

    def route(result: JobResult) -> None:
        if result.candidate.index < 0:  # the seeds' 3/1/4, measured beside the final round
            baselines.append(result)
            log(_line(result, {}))
        else:
            refresh(result)

    alive = list(candidates)
    final_round = 0
    for round_index in range(config.max_rounds):
        final_round = round_index
        last = round_index == config.max_rounds - 1 or len(alive) == 1
        # In the last round the seeds' 3/1/4 runs beside the finalists, at each of their concurrencies, on the same
        # prompts at the same time: the chosen one's job of that round and it make a like-for-like pair.
        extra = []
        if last and config.baseline:
            levels = sorted({c.concurrency for c in alive}, reverse=True)
            extra = [Job(config.baseline_candidate(c), round_index, 0) for c in levels]
        if round_index == 0:
            counts = {c.index: 1 for c in alive}
        else:  # ``alive`` is ranked best first
            counts = jobs_per_candidate(alive, len(groups), len(extra))
        replicas = max(counts.values())
        round_jobs = [
            Job(c, round_index, r)
            for r in range(replicas)
            for c in longest_first(alive, jobs)
            if r < counts[c.index]
        ]
        log(
            f"tune: round {round_index}: {len(alive)} candidate(s), {len(round_jobs)} job(s)"
            + (
                f", the seeds' 3/1/4 beside them at concurrency {', '.join(str(j.candidate.concurrency) for j in extra)}"
                if extra
                else ""
            )
        )
        await run_jobs(config, [*round_jobs, *extra], groups, sample, route, config.equal_time)
        failed = {j.candidate.index for j in jobs if not j.ok}
        for index in failed:
            estimates.pop(index, None)
        alive = sorted(
            (c for c in alive if c.index in estimates),
            key=lambda c: estimates[c.index].tok_s_per_gpu,
            reverse=True,
        )
        if len(alive) <= 1 or round_index == config.max_rounds - 1:
            break
        keep = math.ceil(len(alive) / config.eta)
        for dropped in alive[keep:]:
            eliminated[dropped.index] = round_index
        alive = alive[:keep]
    chosen = alive[0] if alive else None
    baseline = confirm = None
    if config.baseline and chosen is not None:
        baseline = next((b for b in baselines if b.candidate.concurrency == chosen.concurrency), None)
        confirm = next(
            (
                j
                for j in jobs
                if j.candidate.index == chosen.index and j.round == final_round and j.replica == 0
            ),
            None,
        )
        if (
            baseline is None or confirm is None
        ):  # the race ended early (the others failed): measure the pair now
            seeds = config.baseline_candidate(chosen.concurrency)
            log(f"tune: {chosen.label} beside the seeds' {seeds.label}, concurrency {chosen.concurrency}")
            pair = [Job(chosen, config.max_rounds, 0), Job(seeds, config.max_rounds, 0)]
            side = await run_jobs(
                config, pair, groups[:2], sample, lambda r: log(_line(r, {})), config.equal_time
            )
            confirm = next(r for r in side if r.candidate.index == chosen.index)
            baseline = next(r for r in side if r.candidate.index != chosen.index)
            baselines.append(baseline)
    return TuneRun(
        config=config,
        candidates=tuple(candidates),
        jobs=tuple(jobs),
        estimates=estimates,
        eliminated_in=eliminated,
        chosen=chosen,
        baseline=baseline,
        confirm=confirm,
        seeds_jobs=tuple(baselines),
        started_at=started_at,
        finished_at=time.time(),
    )
