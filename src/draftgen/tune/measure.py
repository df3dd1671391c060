"""One job: start a candidate on a GPU group, measure one level with benchmark's code, stop it.

The level is benchmark's ``run_level``: ``concurrency`` streaming requests kept in flight until the job's prompts
are sent. Its steady throughput comes from the requests that finished while every slot was still busy (before
the job's window ended): in a closed loop of ``c`` requests, tokens/s = c × Σ tokens / Σ request seconds
(Little's law), which leaves out the drain at the end, when the batch empties and each step serves fewer requests.
Since nothing finishing after the window ends can count, the requests still in flight then are cancelled, not
drained. With a ``RoundClock`` a job also stops sending once it has measured as long as the round's first job to
send all its prompts (and has at least ``concurrency`` finished requests): every candidate of a round gets about
the same GPU time, instead of the slowest candidates getting the most, and a round's jobs end together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.run import BenchmarkError, SendLimit, read_server_facts, run_level, warm_up
from draftgen.bench.stats import level_acceptance, resolve_request_tokens
from draftgen.client.server import ServerClient
from draftgen.prompts.rows import PromptRow
from draftgen.tune.config import MIN_JOB_REQUESTS, Candidate, TuneConfig
from draftgen.tune.launch import FailedStart, launch_spec, start, stop


class RoundClock:
    """The measuring time a round allows its jobs: set by the first job of the round that sends all its prompts
    (or given, to replay a job as it ran)."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds

    def offer(self, seconds: float) -> None:
        if self.seconds is None:
            self.seconds = seconds

    def limit(self, min_finished: int) -> Callable[[float, int], bool]:
        def over(elapsed_s: float, finished_ok: int) -> bool:
            return self.seconds is not None and elapsed_s >= self.seconds and finished_ok >= min_finished

        return over


@dataclass(frozen=True)
class JobResult:
    candidate: Candidate
    round: int
    replica: int  # which of the round's jobs of this candidate (replica 0 shares the round's prompts)
    group: int
    started_at: float
    finished_at: float
    ok: bool  # started and measured
    failure: str | None = None  # why not: "failed to start: exited with code 1 ..." or a measurement error
    log_tail: tuple[str, ...] = ()
    startup_s: float | None = None
    requests: int = 0  # sent (finished + cancelled)
    failed_requests: int = 0
    cancelled_requests: int = 0  # in flight when the window ended: cancelled, as they could not count
    stopped_by_clock: bool = False  # stopped sending at the round's time, before its last prompt
    # The round's measuring time when this job ended (None: not set yet, or no clock).
    clock_s: float | None = None
    steady_tokens: tuple[float, ...] = ()  # per request finished while every slot was busy
    steady_seconds: tuple[
        float, ...
    ] = ()  # those requests' send → last byte (on the clock the simulator kept)
    steady_verify: tuple[int | None, ...] = ()  # their verify steps (sglext), None when not reported
    accept_length: float | None = None  # the level's acceptance, benchmark's first available source
    accept_source: str = ""
    clock_factor: float = 1.0  # hardware seconds per wall second (draftgen sim's --speed), from the server
    # draftgen sim: the share of its clock the server kept over the level (None elsewhere). The job's seconds are
    # put on that clock, as the benchmark's are: a loaded machine slows a simulator, not the hardware it simulates,
    # and would otherwise squeeze every candidate towards the same CPU-bound rate.
    clock_kept: float | None = None
    # every finished request's (prompt id, completion tokens, cut at max_tokens): the lengths the verdict prices
    completions: tuple[tuple[str, float, bool], ...] = ()
    # every finished request's (prompt category, completion tokens, verify steps, send → last byte in wall
    # seconds on the kept clock): the verdict's acceptance by category (draftgen.breakdown)
    per_request: tuple[tuple[str | None, float, int | None, float], ...] = ()

    @property
    def start_failed(self) -> bool:
        return not self.ok and (self.failure or "").startswith("failed to start")


def steady_requests(
    tokens: Sequence[float | None],
    started: Sequence[float],
    e2e: Sequence[float],
    ok: Sequence[bool],
    window_end: float | None = None,
) -> list[int]:
    """Indices of the successful requests that finished before the window ended (default: the last send)."""
    last_send = window_end if window_end is not None else (max(started) if started else 0.0)
    chosen = [
        i for i in range(len(ok)) if ok[i] and tokens[i] is not None and started[i] + e2e[i] <= last_send
    ]
    if not chosen:  # too few requests for a steady phase: every successful one (the report says so)
        chosen = [i for i in range(len(ok)) if ok[i] and tokens[i] is not None]
    return chosen


def _bench_config(
    config: TuneConfig, url: str, candidate: Candidate, rows: int, out_dir: Path
) -> BenchmarkConfig:
    return BenchmarkConfig(
        servers=[url],
        model=config.model,
        api_key_env=config.api_key_env,
        request_timeout_s=config.request_timeout_s,
        prompts=config.prompts,
        **config.sampling.model_dump(),
        concurrencies=[candidate.concurrency],
        num_prompts=rows,
        warmup_requests=config.warmup_requests,
        out_dir=str(out_dir),
    )


async def run_job(
    config: TuneConfig,
    candidate: Candidate,
    round_index: int,
    group: int,
    rows: Sequence[PromptRow],
    replica: int = 0,
    clock: RoundClock | None = None,
) -> JobResult:
    """Start ``candidate`` on GPU group ``group``, measure one level of ``rows``, stop it."""
    results = await run_levels(
        config, candidate, [(candidate.concurrency, rows)], round_index, group, replica, clock
    )
    return results[0]


async def run_levels(
    config: TuneConfig,
    candidate: Candidate,
    levels: Sequence[tuple[int, Sequence[PromptRow]]],
    round_index: int,
    group: int,
    replica: int = 0,
    clock: RoundClock | None = None,
    name: str | None = None,
) -> list[JobResult]:
    """Start ``candidate`` once and measure each ``(concurrency, rows)`` level in order on it (the verdict's
    levels share one start-up); one result per level, the candidate's concurrency replaced by the level's."""
    began = time.time()
    who = name or (candidate.slug if candidate.index >= 0 else f"seeds-c{candidate.concurrency}")
    run_name = f"r{round_index}-{who}-g{group}"
    spec = launch_spec(config, candidate, group, run_name)
    run_dir = Path(config.out_dir) / "servers" / run_name
    started = await start(spec, run_dir / f"{spec.name}.log", config.startup_timeout_s)

    def base(level: int) -> dict:
        return {
            "candidate": replace(candidate, concurrency=level),
            "round": round_index,
            "replica": replica,
            "group": group,
            "started_at": began,
        }

    if isinstance(started, FailedStart):
        return [
            JobResult(
                **base(level),
                finished_at=time.time(),
                ok=False,
                failure=f"failed to start: {started.reason} (log {started.log_path})",
                log_tail=started.log_tail,
            )
            for level, _ in levels
        ]
    results: list[JobResult] = []
    client = None
    try:
        for level, rows in levels:
            at_level = replace(candidate, concurrency=level)
            bench = _bench_config(config, spec.url, at_level, len(rows), run_dir)
            if client is None:
                client = ServerClient(spec.url, api_key=bench.api_key(), timeout_s=config.request_timeout_s)
            level_began = time.time()
            try:
                facts = await read_server_facts(group, client, bench)
                if config.warmup_requests and not results:
                    await warm_up(client, bench)
                result = await _measure(config, client, facts, bench, at_level, rows, clock, started.seconds)
            except BenchmarkError as exc:
                result = JobResult(
                    **base(level), finished_at=time.time(), ok=False, failure=f"measurement failed: {exc}"
                )
            first = not results  # the first level's job time includes the start-up, as a one-level job's does
            results.append(
                replace(
                    result,
                    started_at=began if first else level_began,
                    round=round_index,
                    replica=replica,
                    group=group,
                )
            )
    finally:
        if client is not None:
            await client.close()
        await stop(started)
    return results


async def _measure(
    config: TuneConfig,
    client: ServerClient,
    facts,  # type: ignore[no-untyped-def]
    bench: BenchmarkConfig,
    candidate: Candidate,
    rows: Sequence[PromptRow],
    clock: RoundClock | None,
    startup_s: float,
) -> JobResult:
    began = time.time()
    limit = SendLimit(
        stop_sending=clock.limit(max(MIN_JOB_REQUESTS, candidate.concurrency)) if clock else None,
        cancel_in_flight=True,
        on_end=clock.offer if clock else None,
    )
    level = await run_level(client, facts, bench, candidate.concurrency, rows, limit)
    tokens = resolve_request_tokens(level)
    records = level.requests
    chosen = steady_requests(
        [t.tokens for t in tokens],
        [r.started_at for r in records],
        [r.e2e_s for r in records],
        [r.ok for r in records],
        level.sending_ended_at,
    )
    accept, source = level_acceptance(level, tokens, facts)
    failed = sum(not r.ok for r in records)
    sent = len(records) + level.cancelled
    kept = level.clock_kept or 1.0
    return JobResult(
        candidate=candidate,
        round=0,
        replica=0,
        group=0,
        started_at=began,
        finished_at=time.time(),
        ok=failed < len(records),
        failure=None if failed < len(records) else f"every one of {len(records)} finished requests failed",
        startup_s=startup_s,
        requests=sent,
        failed_requests=failed,
        cancelled_requests=level.cancelled,
        stopped_by_clock=sent < len(rows) - 1,  # the last row only marks the end of a full job
        clock_s=clock.seconds if clock else None,
        steady_tokens=tuple(float(tokens[i].tokens or 0.0) for i in chosen),
        steady_seconds=tuple(records[i].e2e_s * kept for i in chosen),
        steady_verify=tuple(records[i].spec_verify_ct for i in chosen),
        accept_length=accept,
        accept_source=source,
        clock_factor=facts.clock_factor,
        clock_kept=level.clock_kept,
        completions=tuple(
            (r.prompt_id, float(t.tokens), r.finish_reason == "length")
            for r, t in zip(records, tokens, strict=True)
            if r.ok and t.tokens is not None
        ),
        per_request=tuple(
            (r.category, float(t.tokens), r.spec_verify_ct, r.e2e_s * kept)
            for r, t in zip(records, tokens, strict=True)
            if r.ok and t.tokens is not None
        ),
    )
