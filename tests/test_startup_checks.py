"""serve's end-of-start summary and tune's per-candidate starts as grouped checks, on fakes: seven servers or
candidates, one failing, are one grouped row and one row naming the failure."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from draftgen.display.checks import Checks, group_checks
from draftgen.serve.summary import ServerStart, startup_checks, startup_text
from draftgen.server_settings import ServerSettings
from draftgen.tune.checks import baseline_check, job_checks
from draftgen.tune.config import Candidate
from draftgen.tune.measure import JobResult

URLS = [f"http://127.0.0.1:{30000 + i}" for i in range(7)]
LOGS = Path("outputs/serve/run")


# ----- serve ------------------------------------------------------------------------------------------------
def start(index: int, *, ready: bool = True, failure: str = "", restarts: int = 0) -> ServerStart:
    return ServerStart(
        url=URLS[index],
        ready=ready,
        ready_s=12.0 + index * 0.3 if ready else None,
        restarts=restarts,
        failure=failure,
        log_path=LOGS / f"server-{30000 + index}.log",
    )


def test_seven_ready_servers_are_one_row():
    rows = group_checks(startup_checks([start(i) for i in range(7)]), "servers")
    assert [(r.check, r.status, r.where) for r in rows] == [("ready", "ok", "7/7 servers")]
    assert rows[0].detail == "/health_generate answered 200, 12–14 s after start"


def test_one_failed_server_of_seven_is_one_grouped_row_and_its_own():
    why = "exited with code 1 after 3.1s (stages seen: starting → refused)"
    starts = [start(i, ready=i != 3, failure=why if i == 3 else "") for i in range(7)]
    rows = group_checks(startup_checks(starts), "servers")
    assert [(r.check, r.status, r.where) for r in rows] == [
        ("ready", "ok", "6/7 servers"),
        ("ready", "fail", ":30003"),
    ]
    assert rows[1].detail == f"{why}; log {LOGS / 'server-30003.log'}"
    lines = startup_text(starts).splitlines()
    assert len(lines) == 2
    assert re.match(r"^  ok +ready +6/7 servers +/health_generate answered 200", lines[0])
    assert re.match(r"^  FAIL +ready +:30003 +exited with code 1 after 3\.1s", lines[1])


def test_a_restarted_server_is_named_under_restarts_only_when_one_was_restarted():
    crash = "exited with code 70 after 40.0s (was ready)"
    starts = [start(i, failure=crash if i == 5 else "", restarts=2 if i == 5 else 0) for i in range(7)]
    rows = group_checks(startup_checks(starts), "servers")
    assert [(r.check, r.status, r.where) for r in rows] == [
        ("ready", "ok", "7/7 servers"),
        ("restarts", "ok", "6/7 servers"),
        ("restarts", "warn", ":30005"),
    ]
    assert rows[2].detail == f"2 restarts; the last failure: {crash}"


# ----- tune -------------------------------------------------------------------------------------------------
def candidate(index: int) -> Candidate:
    return Candidate(index, ServerSettings(speculative_num_steps=index + 1, max_running_requests=48), 48)


def job(
    index: int, *, ok: bool = True, failure: str | None = None, startup_s: float | None = 9.0
) -> JobResult:
    return JobResult(
        candidate=candidate(index),
        round=0,
        replica=0,
        group=index,
        started_at=0.0,
        finished_at=60.0,
        ok=ok,
        failure=failure,
        startup_s=startup_s if ok else None,
    )


def label(result: JobResult) -> str:
    return result.candidate.label


def test_one_candidate_of_seven_failing_to_start_is_one_grouped_row_and_its_own():
    oom = "failed to start: exited with code 1 during start-up (log outputs/tune/servers/r0/server-30003.log)"
    jobs = [job(i, ok=i != 3, failure=oom if i == 3 else None) for i in range(7)]
    checks = job_checks(jobs, label)
    rows = group_checks(checks, "candidates")
    assert [(r.check, r.status, r.where) for r in rows] == [
        ("started", "ok", "6/7 candidates"),
        ("started", "fail", candidate(3).label),
        ("measured", "ok", "6/6 candidates"),  # a candidate that never started was not measured
    ]
    assert rows[0].detail == "/health_generate answered 200, 9.0 s after start"
    assert (
        rows[1].detail == "exited with code 1 during start-up (log outputs/tune/servers/r0/server-30003.log)"
    )
    view = Checks(checks, title="Start-up, per candidate", noun="candidates")
    assert len(str(view).splitlines()) == 4 and "6/7 candidates" in view._repr_html_()


def test_a_candidate_is_checked_over_every_one_of_its_jobs():
    jobs = [job(i) for i in range(7)] + [
        job(2, ok=False, failure="measurement failed: every one of 8 finished requests failed")
    ]
    rows = group_checks(job_checks(jobs, label), "candidates")
    assert [(r.check, r.status, r.where) for r in rows] == [
        ("started", "ok", "7/7 candidates"),
        ("measured", "ok", "6/7 candidates"),
        ("measured", "fail", candidate(2).label),
    ]


def seeds(concurrency: int, **values: object) -> JobResult:
    return dataclasses.replace(job(0, **values), candidate=Candidate(-1, ServerSettings(), concurrency))  # type: ignore[arg-type]


def test_the_seeds_baseline_is_one_row_beside_the_candidates_not_one_of_them():
    (row,) = baseline_check([seeds(8), seeds(64)])
    assert (row.check, row.status, row.detail) == (
        "baseline",
        "ok",
        "started and measured at 8, 64 in flight",
    )
    assert row.target == f"seeds' {ServerSettings().label}"
    oom = "failed to start: exited with code 1 during start-up (log x.log)"
    (row,) = baseline_check([seeds(8), seeds(64, ok=False, failure=oom)])
    assert (row.status, row.detail) == (
        "fail",
        "did not start: exited with code 1 during start-up (log x.log)",
    )
    assert baseline_check([]) == []


def test_no_checks_say_so():
    assert str(Checks((), title="Start-up", empty="the race was off")) == "Start-up\n  the race was off"


def test_a_row_naming_several_candidates_may_break_between_them_in_html():
    oom = "failed to start: exited with code 1 during start-up"
    jobs = [job(i, ok=i not in (2, 4), failure=oom if i in (2, 4) else None) for i in range(7)]
    page = Checks(job_checks(jobs, label), noun="candidates")._repr_html_()
    keep = "<span style='white-space:nowrap'>{}</span>"
    names = ", ".join(keep.format(candidate(i).label) for i in (2, 4))
    assert f"{keep.format('2/7 candidates')}: {names}</td>" in page
    assert "<td style='text-align:left;white-space:nowrap'>" not in page  # the cell itself may wrap


def test_the_verdicts_candidates_are_checked_once_each_over_their_levels():
    levels = [
        dataclasses.replace(job(i), candidate=Candidate(1000 + i, candidate(i).settings, level))
        for i in range(3)
        for level in (1, 8, 64)
    ]
    timeout = "measurement failed: the server stopped answering"
    levels[5] = dataclasses.replace(levels[5], ok=False, failure=timeout)  # candidate 1 at 64 in flight
    rows = group_checks(job_checks(levels, label, prefix="verdict "), "candidates")
    assert [(r.check, r.status, r.where) for r in rows] == [
        ("verdict started", "ok", "3/3 candidates"),
        ("verdict measured", "ok", "2/3 candidates"),
        ("verdict measured", "fail", candidate(1).label),
    ]
    assert rows[-1].detail == f"at 64 in flight: {timeout}"
