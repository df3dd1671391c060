"""How tune spends GPU time: whole waves of jobs, equal measuring time per round, no drain (issue 13)."""

from __future__ import annotations

import asyncio

import pytest
from sim_helpers import wait_for
from test_tune import CONCURRENCY, sim_config, truth_tok_s

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.run import SendLimit, read_server_facts, run_level
from draftgen.bench.sample import sample_prompts
from draftgen.client.server import ServerClient
from draftgen.prompts.rows import SYNTHETIC, prompt_source_path
from draftgen.server_settings import ServerSettings
from draftgen.sim.fleet import find_free_base_port
from draftgen.tune.config import Candidate
from draftgen.tune.measure import RoundClock
from draftgen.tune.run import Job, jobs_per_candidate, run_jobs, run_tune


def ranked(n: int) -> list[Candidate]:
    return [Candidate(i, ServerSettings(), 8) for i in range(n)]


@pytest.mark.parametrize(
    ("alive", "groups", "extra", "expected"),
    [
        (4, 7, 1, [2, 2, 1, 1]),  # the last round: 6 groups for 4 finalists beside the seeds' job
        (4, 7, 0, [2, 2, 2, 1]),  # a middle round: one wave of 7, not 8 jobs spilling into a second wave
        (3, 7, 0, [3, 2, 2]),
        (12, 7, 0, [2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]),  # two waves: 14 slots
        (7, 7, 1, [2, 2, 2, 2, 2, 2, 1]),  # 8 jobs need a second wave anyway: the leaders fill it
        (2, 3, 2, [2, 2]),  # two finalists and two seeds' jobs on 3 groups: two waves, filled
    ],
)
def test_jobs_per_candidate_fills_whole_waves_and_gives_the_spare_groups_to_the_leaders(
    alive, groups, extra, expected
):
    counts = jobs_per_candidate(ranked(alive), groups, extra)
    assert [counts[i] for i in range(alive)] == expected
    total = sum(expected) + extra
    assert total % groups == 0 or sum(expected) == alive  # whole waves, unless every candidate has one job


def test_round_clock_stops_sending_only_after_the_round_time_and_enough_finished():
    clock = RoundClock()
    over = clock.limit(min_finished=8)
    assert not over(1_000.0, 1_000)  # no job has sent all its requests yet: nobody stops
    clock.offer(10.0)
    clock.offer(3.0)  # only the first job to finish sending sets the time
    assert clock.seconds == 10.0
    assert not over(9.9, 100)
    assert not over(50.0, 7)  # too few finished requests to measure anything
    assert over(10.0, 8)


def bench_config(url: str) -> BenchmarkConfig:
    return BenchmarkConfig(
        servers=[url], model="Qwen/Qwen3.6-27B", max_tokens=256, concurrencies=[4], warmup_requests=0
    )


def level_on(url: str, rows: int, limit: SendLimit):  # type: ignore[no-untyped-def]
    sample = sample_prompts(prompt_source_path(SYNTHETIC), rows, seed=3)

    async def scenario():  # type: ignore[no-untyped-def]
        config = bench_config(url)
        client = ServerClient(url, timeout_s=120)
        try:
            facts = await read_server_facts(0, client, config)
            return await run_level(client, facts, config, 4, sample.rows, limit)
        finally:
            await client.close()

    return asyncio.run(scenario())


def test_a_level_cancels_what_is_in_flight_at_the_last_send_and_the_server_aborts_it(sim_fleet):
    """A 256-token answer takes about 2 s on this server (speed 1, decode twice as slow), while the last row comes
    up right after the row before it was sent: the server is still generating what the client cancels, however
    slowly a loaded machine lets the client read."""
    fleet = sim_fleet(profile="b200-mtp", speed=1, faults=["slow=2"])
    level = level_on(fleet.urls[0], 12, SendLimit(cancel_in_flight=True))
    assert level.cancelled >= 1
    # Every row but the last sent once (finished or cancelled); the last only marks the end: a request sent when
    # it came up could never finish before the window closed.
    assert len(level.requests) + level.cancelled == 11
    assert all(r.ok for r in level.requests)
    assert level.sending_ended_at is not None
    assert max(r.started_at for r in level.requests) <= level.sending_ended_at
    # The server saw every request end: each cancelled one by the client's disconnect, before its last token —
    # or, when its last token was already on the wire as the client let go, finished (the client never read it).
    measured = _measured_once_ended(fleet, 1 + 11)  # + the facts probe
    aborted = [r for r in measured if r["outcome"] == "client_disconnected"]
    ok = [r for r in measured if r["outcome"] == "ok"]
    assert 1 <= len(aborted) <= level.cancelled
    assert all(r["completion_tokens"] < 256 for r in aborted)
    assert len(ok) == 1 + len(level.requests) + (level.cancelled - len(aborted))


def _measured_once_ended(fleet, count: int) -> list[dict]:  # type: ignore[no-untyped-def]
    """The server's records of every non-warm-up request, once ``count`` of them have ended (a disconnect is
    recorded when the server next writes to the stream)."""

    def measured() -> list[dict] | None:
        records = [r for r in fleet.truth(0) if r["kind"] != "warmup"]
        return records if len(records) >= count else None

    return wait_for(measured, timeout=60.0, what=f"{count} requests to end on the server")  # type: ignore[return-value]


def test_a_level_stops_sending_when_told_and_reports_the_last_send(sim_fleet):
    fleet = sim_fleet(profile="b200-mtp", speed=20)
    told: list[float] = []
    level = level_on(
        fleet.urls[0],
        40,
        SendLimit(
            stop_sending=lambda elapsed, finished: finished >= 6, cancel_in_flight=True, on_end=told.append
        ),
    )
    sent = len(level.requests) + level.cancelled
    assert sent == 4 + 5  # 4 at once, then each of the first 5 finished refilled; the 6th's slot stays empty
    assert sum(r.ok for r in level.requests) >= 6
    assert len(told) == 1 and told[0] > 0  # told once, with the seconds since the level began


def test_a_time_limit_ends_the_level_between_finishes(sim_fleet):
    """At speed 1, decode five times as slow, a 256-token answer takes about 5 s: a 0.3 s limit must end the level
    before any finishes, even when a loaded machine checks the limit late."""
    fleet = sim_fleet(profile="b200-mtp", speed=1, faults=["slow=5"])
    level = level_on(
        fleet.urls[0],
        12,
        SendLimit(stop_sending=lambda elapsed, finished: elapsed >= 0.3, cancel_in_flight=True),
    )
    assert level.requests == () and level.cancelled == 4
    measured = _measured_once_ended(fleet, 4 + 1)  # + the facts probe: nothing else was sent
    aborted = [r for r in measured if r["outcome"] == "client_disconnected"]
    assert len(aborted) == 4 and all(r["completion_tokens"] < 256 for r in aborted)
    assert len(measured) == 4 + 1


@pytest.mark.timing
def test_equal_time_stops_the_slow_candidate_at_the_fast_ones_time_and_a_replay_sends_the_same(tmp_path):
    """MTP off beside 3/1/4 on two simulated GPUs: 3/1/4 sends its requests first, so MTP off stops sending then,
    with enough finished requests, and its estimate stays near the one it gets when it sends them all."""
    space = {
        "spec_candidates": [[3, 1, 4]],
        "max_running_requests": [CONCURRENCY],
        "concurrency": CONCURRENCY,
        "gpus": "0-1",
        "max_rounds": 1,
        "baseline": False,
        "rounds_per_job": 4.0,
    }
    timed = sim_config(tmp_path / "timed", **space, base_port=find_free_base_port(2))
    run = asyncio.run(run_tune(timed, log=lambda line: None))
    by_label = {j.candidate.label: j for j in run.jobs}
    off, mtp = by_label[f"MTP off, {CONCURRENCY} running"], by_label[f"MTP 3/1/4, {CONCURRENCY} running"]
    budget = timed.job_requests(CONCURRENCY)
    assert mtp.ok and off.ok
    assert not mtp.stopped_by_clock and mtp.requests == budget
    assert off.stopped_by_clock and off.requests < budget
    assert len(off.steady_tokens) >= CONCURRENCY  # stopped only with enough finished requests
    assert off.cancelled_requests >= 1 and mtp.cancelled_requests >= 1  # neither drained its last batch
    # Equal time does not change the ranking, and MTP off's estimate stays close to a full-length measurement.
    assert run.chosen is not None and run.chosen.label == mtp.candidate.label
    truths = {c.label: truth_tok_s(c.settings, c.concurrency) for c in run.candidates}
    assert truths[mtp.candidate.label] > truths[off.candidate.label]
    full = sim_config(tmp_path / "full", **space, equal_time=False, base_port=find_free_base_port(2))
    full_run = asyncio.run(run_tune(full, log=lambda line: None))
    full_off = next(j for j in full_run.jobs if j.candidate.label == off.candidate.label)
    assert not full_off.stopped_by_clock and full_off.requests == budget

    # Each run's MTP-off rate against the 3/1/4 rate measured beside it, on the same machine at the same moment:
    # the two runs are a minute apart, and load beside the suite that changes in between moves both candidates.
    # The kept-clock correction leaves a residue under heavy load that need not be the same for both candidates:
    # with a second SGLang tier beside the suite the two ratios were 0.52 and 0.45 (quiet: within 0.1), hence 0.2,
    # a wider margin for that load, not a bound on it.
    def off_vs_mtp(tune_run) -> float:  # type: ignore[no-untyped-def]
        rates = {index: e.tok_s_per_gpu for index, e in tune_run.estimates.items()}
        return rates[off.candidate.index] / rates[mtp.candidate.index]

    assert off_vs_mtp(run) == pytest.approx(off_vs_mtp(full_run), rel=0.2)
    # A replay with the job's own count sends exactly as many requests (what benchmarks/tune_speedup.py compares).
    sample = sample_prompts(timed.prompt_path, timed.sample_size, timed.seed)
    replay_config = timed.model_copy(update={"out_dir": str(tmp_path / "replay")})
    assert off.clock_s is not None and off.clock_s == mtp.clock_s  # one clock for the round
    replay = Job(off.candidate, 0, 0, limit=off.requests, seconds=off.clock_s)
    [replayed] = asyncio.run(run_jobs(replay_config, [replay], [0], sample, lambda r: None))
    assert replayed.clock_s == off.clock_s
    assert len(replayed.steady_tokens) >= CONCURRENCY and replayed.requests <= off.requests
    [unlimited] = asyncio.run(
        run_jobs(replay_config, [Job(off.candidate, 0, 0)], [0], sample, lambda r: None)
    )
    assert unlimited.requests == budget and not unlimited.stopped_by_clock  # without them: the whole job
