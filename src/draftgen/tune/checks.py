"""A tune run's starts and measurements as grouped checks: "started: 12/13 candidates", and a row for each candidate
that did not start or could not be measured, named, with why.

Each job starts a candidate on a GPU group with serve's launcher and measures it; the per-job lines say what each
did as it happened, the candidate table says how fast each was. This is the one place that says, in a few rows,
whether every candidate came up: a candidate's check passes only if every one of its jobs did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from draftgen.display.checks import CheckRow
from draftgen.display.humanize import seconds_range
from draftgen.tune.measure import JobResult
from draftgen.tune.run import TuneRun

NOUN = "candidates"
FAILED_TO_START = "failed to start: "


def job_checks(
    jobs: Sequence[JobResult], target: Callable[[JobResult], str], prefix: str = ""
) -> list[CheckRow]:
    """Per target (``target`` names a job's candidate): ``started`` (every job's server answered
    /health_generate 200) and, for those that started, ``measured`` (every job measured at least one request)."""
    by_target: dict[str, list[JobResult]] = {}
    for job in jobs:
        by_target.setdefault(target(job), []).append(job)
    times = [j.startup_s for j in jobs if j.startup_s is not None]
    started_detail = "/health_generate answered 200" + (
        f", {seconds_range(times)} after start" if times else ""
    )
    started, measured = [], []
    for name, own in by_target.items():
        failed_start = next((j for j in own if j.start_failed), None)
        if failed_start is not None:
            why = (failed_start.failure or "").removeprefix(FAILED_TO_START)
            started.append(CheckRow(f"{prefix}started", name, "fail", why))
            continue
        started.append(CheckRow(f"{prefix}started", name, "ok", started_detail))
        failed = next((j for j in own if not j.ok), None)
        if failed is None:
            measured.append(CheckRow(f"{prefix}measured", name, "ok", "every job measured"))
        else:
            at = f"at {failed.candidate.concurrency} in flight: " if prefix else ""
            measured.append(CheckRow(f"{prefix}measured", name, "fail", at + (failed.failure or "failed")))
    return started + measured


def baseline_check(seeds_jobs: Sequence[JobResult]) -> list[CheckRow]:
    """The seeds' 3/1/4, measured beside the final round at each finalist concurrency: one row, not a candidate
    (it is what the chosen one's gain is measured against)."""
    if not seeds_jobs:
        return []
    target = f"seeds' {seeds_jobs[0].candidate.label}"
    failed_start = next((j for j in seeds_jobs if j.start_failed), None)
    failed = next((j for j in seeds_jobs if not j.ok), None)
    if failed_start is not None:
        why = (failed_start.failure or "").removeprefix(FAILED_TO_START)
        return [CheckRow("baseline", target, "fail", f"did not start: {why}")]
    if failed is not None:
        at = f"at {failed.candidate.concurrency} in flight"
        return [CheckRow("baseline", target, "fail", f"not measured {at}: {failed.failure or 'failed'}")]
    levels = ", ".join(str(c) for c in sorted({j.candidate.concurrency for j in seeds_jobs}))
    return [CheckRow("baseline", target, "ok", f"started and measured at {levels} in flight")]


def run_checks(run: TuneRun) -> list[CheckRow]:
    """The race's candidates, the seeds' baseline beside them, then the verdict's candidates (each started once)."""
    rows = job_checks(run.jobs, lambda job: job.candidate.label) + baseline_check(run.seeds_jobs)
    if run.verdict is not None:
        verdict_jobs = [job for results in run.verdict.results.values() for job in results]
        rows += job_checks(verdict_jobs, lambda job: job.candidate.label, prefix="verdict ")
    return rows
