"""The verdict: MTP against each drafter candidate, at each concurrency of ``verdict_levels``, on the held-out
prompts given as ``prompts`` (validate's ``export/holdout/prompts.jsonl``).

Each candidate starts once on a GPU group (capped at the largest level) and measures every level in order with
tune's job code (benchmark's ``run_level``); every candidate gets the same prompts at a level (a paired
comparison), levels get different ones. The analysis is in ``draftgen.tune.verdict_report``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftgen.bench.sample import PromptSample, sample_prompts
from draftgen.prompts.rows import PromptRow
from draftgen.tune.config import Candidate, TuneConfig
from draftgen.tune.measure import JobResult, run_levels

VERDICT_ROUND = 99  # the server folders' round number (r99-...): apart from the race's rounds


@dataclass(frozen=True)
class VerdictRun:
    config: TuneConfig
    candidates: tuple[Candidate, ...]  # MTP first, then the drafter settings
    results: dict[int, tuple[JobResult, ...]]  # candidate index → one result per level, in level order
    levels: tuple[int, ...]
    prompts_path: str
    started_at: float
    finished_at: float


def level_rows(config: TuneConfig, sample: PromptSample, levels: Sequence[int]) -> dict[int, list[PromptRow]]:
    """Each level's prompts (one more row than it sends: the marker of the window's end), level after level."""
    out, offset = {}, 0
    for level in levels:
        count = config.job_requests(level) + 1
        out[level] = sample.slice(offset, count)
        offset += count
    return out


async def run_verdict(config: TuneConfig, log: Callable[[str], None] = print) -> VerdictRun:
    levels = tuple(sorted(set(config.verdict_levels)))
    candidates = config.verdict_candidates()
    needed = sum(config.job_requests(level) + 1 for level in levels)
    sample = await asyncio.to_thread(
        sample_prompts, config.prompt_path, max(config.sample_size, needed), config.seed
    )
    rows = level_rows(config, sample, levels)
    log(
        f"verdict: {len(candidates)} candidates (baseline {candidates[0].label} and {len(candidates) - 1} drafter "
        f"setting(s)) at concurrency {', '.join(map(str, levels))}, on {len(sample.rows)} prompts of {sample.path}"
    )
    started_at = time.time()
    queue: asyncio.Queue[Candidate] = asyncio.Queue()
    for candidate in candidates:
        queue.put_nowait(candidate)
    results: dict[int, tuple[JobResult, ...]] = {}

    async def worker(group: int) -> None:
        while not queue.empty():
            candidate = queue.get_nowait()
            measured = await run_levels(
                config,
                candidate,
                [(level, rows[level]) for level in levels],
                VERDICT_ROUND,
                group,
                name=f"verdict{candidate.index - 1000:02d}",
            )
            results[candidate.index] = tuple(measured)
            for result in measured:
                log(_line(result))

    async with asyncio.TaskGroup() as tasks:
        for group in range(min(len(config.groups), len(candidates))):
            tasks.create_task(worker(group))
    return VerdictRun(
        config=config,
        candidates=tuple(candidates),
        results=results,
        levels=levels,
        prompts_path=str(sample.path),
        started_at=started_at,
        finished_at=time.time(),
    )


def _line(result: JobResult) -> str:
    head = f"  verdict GPU group {result.group} {result.candidate.label} c={result.candidate.concurrency}"
    if not result.ok:
        return f"{head}: {result.failure}"
    finished = result.requests - result.cancelled_requests
    return (
        f"{head}: {finished - result.failed_requests}/{finished} ok, {len(result.steady_tokens)} steady, "
        f"acceptance {result.accept_length or float('nan'):.2f}"
    )
