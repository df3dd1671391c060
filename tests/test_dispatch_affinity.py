"""Prefix affinity, one rule at a time, on fake servers and a virtual clock: a conversation's next turn and a prompt's
next sample wait for the server that holds their prefix when it has a free slot, for ``affinity_hold_s`` at most,
never while another server would sit idle, and never for a server that is down or slow; and with affinity on,
every prompt still ends exactly once."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict

import pytest
from dispatch_fakes import FAULT_TOLERANCE, FakeServer, Reply, always, dispatch, fake_config, prompts

from draftgen.client.errors import RequestError
from draftgen.generate.affinity import AffinitySettings, PrefixAffinity
from draftgen.generate.deadline import HangPolicy, ServerDeadline
from draftgen.generate.fleet_health import Server, ServerStats
from draftgen.generate.hedge import RateBook
from draftgen.generate.turns import Conversation
from draftgen.generate.work import Home, TurnState, Work, WorkQueue
from draftgen.prompts.rows import PromptRow
from draftgen.sampling_plan import Arm, sample_rows, sample_seed


@pytest.fixture
def make_config(tmp_path):
    return lambda **changes: fake_config(tmp_path, **changes)


def with_samples(rows: list[PromptRow], answers: int) -> list[PromptRow]:
    """Each row once per sample (a sampling plan of one arm, ``plan(answers)``)."""
    return [sample for row in rows for sample in sample_rows(row, [Arm(name="a", answers=answers)])]


def plan(answers: int) -> list[dict[str, object]]:
    return [{"name": "a", "answers": answers}]


def answered_on(servers: list[FakeServer]) -> dict[tuple[str, int | None, int], str]:
    """(prompt, seed, turn) → the server whose answer to it was kept (the fakes answer every request they see)."""
    return {
        (r.prompt_id, r.seed, r.turn): server.url
        for server in servers
        for r in server.requests
        if r.outcome == "answered"
    }


def sent(servers: list[FakeServer], seed: int) -> list[tuple[str, float]]:
    return [(s.url, r.sent_at) for s in servers for r in s.requests if r.seed == seed]


# ----- a conversation's turns ------------------------------------------------------------------------------------
def next_turns_at_home(make_config, hold_s: float) -> float:
    """Share of next turns whose first request went to the server that answered the turn before: three busy
    servers, one request in five failing at once (its retry, due after a backoff, waits as work under way beside
    the next turns, and goes to whichever server pulls it)."""
    rng = random.Random(3)

    def script(server, request):
        if rng.random() < 0.2:
            return Reply(after_s=0.1, error=RequestError("http", "busy", status=429))
        return Reply(after_s=rng.uniform(0.8, 1.2))

    servers = [FakeServer(f"http://s{i}", script) for i in range(3)]
    config = make_config(turns="all", affinity_hold_s=hold_s, backoff_base_s=0.5, max_attempts=20)
    outcome, recorder, _ = dispatch(config, servers, prompts(90, questions=3))
    assert outcome.status == "complete" and len(recorder.stored) == 90
    answered = answered_on(servers)
    first_sent: dict[tuple[str, int], tuple[float, str]] = {}
    for server in servers:
        for r in server.requests:
            key = (r.prompt_id, r.turn)
            first_sent[key] = min(first_sent.get(key, (r.sent_at, server.url)), (r.sent_at, server.url))
    at_home = [first_sent[(p, t)][1] == answered[(p, None, t - 1)] for (p, t) in first_sent if t > 0]
    assert len(at_home) == 180
    return sum(at_home) / len(at_home)


def test_a_conversations_next_turn_goes_to_the_server_that_answered_the_last(make_config):
    assert next_turns_at_home(make_config, hold_s=10.0) == 1.0
    # without affinity a retry that came due first is taken by the server just freed, the next turn by another
    assert next_turns_at_home(make_config, hold_s=0.0) < 0.9


# ----- a prompt's samples ----------------------------------------------------------------------------------------
def samples_together(make_config, hold_s: float) -> float:
    """Share of prompts (three samples each) answered on one server, three busy servers."""
    rng = random.Random(4)
    servers = [
        FakeServer(f"http://s{i}", lambda s, r: Reply(after_s=rng.uniform(0.8, 1.2))) for i in range(3)
    ]
    rows = with_samples(prompts(100), answers=3)
    config = make_config(affinity_hold_s=hold_s, sampling_plan=plan(3))
    outcome, recorder, _ = dispatch(config, servers, rows)
    assert outcome.status == "complete" and len(recorder.stored) == 300
    homes = defaultdict(set)
    for (prompt, _, _), url in answered_on(servers).items():
        homes[prompt].add(url)
    return sum(len(urls) == 1 for urls in homes.values()) / len(homes)


def test_a_prompts_later_samples_go_to_the_server_that_took_its_first(make_config):
    # Only the first wave (every worker idle at once: each takes whatever it is woken for) splits samples.
    assert samples_together(make_config, hold_s=10.0) >= 0.9
    assert samples_together(make_config, hold_s=0.0) < 0.3


# ----- bounded, and never at the cost of an idle slot ------------------------------------------------------------
def test_affine_work_is_taken_at_once_by_a_server_that_has_nothing_else(make_config):
    """The home is busy for 30 s and the other server has nothing to do: it takes the second sample at once."""
    home = FakeServer("http://a", always(Reply(after_s=30.0)))  # its worker waits first: it takes sample 0
    idle = FakeServer("http://b", always(Reply(after_s=1.0)))
    rows = with_samples(prompts(1), answers=2)
    config = make_config(concurrency_per_server=1, sampling_plan=plan(2))
    _, recorder, _ = dispatch(config, [home, idle], rows)
    assert len(recorder.stored) == 2
    assert sent([home, idle], sample_seed(rows[0].id)) == [("http://a", 0.0)]
    assert sent([home, idle], sample_seed(rows[1].id)) == [("http://b", 0.0)]


def test_an_idle_server_takes_a_sample_still_waiting_for_its_first_token_elsewhere(make_config):
    """The home's second worker is woken for the second sample, cannot take it yet (the first has not streamed a
    token there), and passes the wake on: the idle other server takes it at once."""

    def script(server, request):
        return Reply(after_s=30.0, first_token_s=5.0)

    home = FakeServer("http://a", script)  # two workers, both waiting first
    idle = FakeServer("http://b", always(Reply(after_s=1.0)))
    rows = with_samples(prompts(1), answers=2)
    config = make_config(concurrency_per_server=2, sampling_plan=plan(2))
    _, recorder, _ = dispatch(config, [home, idle], rows)
    assert len(recorder.stored) == 2
    assert sent([home, idle], sample_seed(rows[1].id)) == [("http://b", 0.0)]


@pytest.mark.parametrize(("hold_s", "expected"), [(100.0, ("http://a", 30.0)), (10.0, ("http://b", 10.0))])
def test_affine_work_waits_for_its_home_for_affinity_hold_s_at_most(make_config, hold_s, expected):
    """The other server has fresh prompts to do, so the second sample waits for its home's free slot (30 s away)
    — unless that is longer than the hold: then the other server takes it, before its next fresh prompt."""
    home = FakeServer("http://a", always(Reply(after_s=30.0)))
    other = FakeServer("http://b", always(Reply(after_s=1.0)))
    rows = with_samples(prompts(1), answers=2) + prompts(60)[1:]
    config = make_config(concurrency_per_server=1, affinity_hold_s=hold_s, sampling_plan=plan(2))
    _, recorder, _ = dispatch(config, [home, other], rows)
    assert len(recorder.stored) == 61
    [(url, at)] = sent([home, other], sample_seed(rows[1].id))
    assert url == expected[0] and expected[1] - 1e-6 <= at < expected[1] + 1.0


@pytest.mark.parametrize(("stream", "expected"), [(True, (5.0, 6.0)), (False, (0.0, 0.0))])
def test_a_later_sample_waits_for_its_first_samples_first_token_at_home(make_config, stream, expected):
    """Streamed, the second sample goes to its home once the first has streamed a token there (prefilled: sent
    together, one prefill step would take both and neither would find the other cached); not streamed there is
    no such signal, and it goes at the home's next free slot."""

    def script(server, request):
        first = request.prompt_id == "p0000"
        return Reply(after_s=20.0 if first and request.seed == seeds[0] else 1.0, first_token_s=5.0)

    home = FakeServer("http://a", script)  # its workers wait first: they take sample 0, then fresh prompts
    other = FakeServer("http://b", always(Reply(after_s=1.0)))
    rows = with_samples(prompts(1), answers=2) + prompts(40)[1:]
    seeds = [sample_seed(rows[0].id), sample_seed(rows[1].id)]
    config = make_config(concurrency_per_server=2, stream=stream, sampling_plan=plan(2))
    _, recorder, _ = dispatch(config, [home, other], rows)
    assert len(recorder.stored) == 41
    [(url, at)] = sent([home, other], seeds[1])
    assert url == "http://a" and expected[0] - 1e-6 <= at <= expected[1] + 1e-6


def test_a_later_sample_does_not_wait_for_a_first_that_failed_before_its_first_token(make_config):
    """The first sample's request fails at home before streaming anything: the prefix will not be there, so the
    second goes at once to whichever server is free (not after the hold, nor once fresh prompts run out)."""

    def script(server, request):
        if request.seed == seeds[0] and len(server.requests) == 1:
            return Reply(after_s=5.0, error=RequestError("http", "busy", status=503), first_token_s=10.0)
        return Reply(after_s=1.0)

    home = FakeServer("http://a", script)
    other = FakeServer("http://b", always(Reply(after_s=1.0)))
    rows = with_samples(prompts(1), answers=2) + prompts(200)[1:]
    seeds = [sample_seed(rows[0].id), sample_seed(rows[1].id)]
    config = make_config(concurrency_per_server=1, sampling_plan=plan(2), affinity_hold_s=1000.0)
    _, recorder, _ = dispatch(config, [home, other], rows)
    assert len(recorder.stored) == 201
    [(_, at)] = sent([home, other], seeds[1])
    assert 5.0 - 1e-6 <= at <= 6.0 + 1e-6


def test_a_benched_home_hands_its_conversations_to_the_other_servers(make_config):
    """Server a answers every first turn it gets, then fails: benched, its conversations' next turns go to b at
    once (no hold), and every conversation is stored once, with all its turns."""

    def flaky(server, request):
        if request.turn == 0:
            return Reply(after_s=1.0)
        server.health_status = 503
        return Reply(after_s=0.1, error=RequestError("connection", "refused"))

    broken = FakeServer("http://a", flaky)
    fine = FakeServer("http://b", always(Reply(after_s=1.0)))
    config = make_config(
        turns="all",
        server_down_after=2,
        probe_interval_s=1000.0,
        probe_max_interval_s=1000.0,
        affinity_hold_s=1000.0,
    )
    outcome, recorder, _ = dispatch(config, [broken, fine], prompts(20, questions=2))
    assert outcome.status == "complete" and sorted(r["id"] for r in recorder.stored) == [
        f"p{i:04d}" for i in range(20)
    ]
    assert recorder.noted("marked down")
    later = [r for r in fine.requests if r.turn == 1]
    assert len(later) == 20 and max(r.sent_at for r in later) < 100.0  # not held for a server that is down


# ----- the queue and the policy, directly --------------------------------------------------------------------------
def _servers(*urls: str) -> list[Server]:
    hang = ServerDeadline(HangPolicy(1800.0, 100, 0.0, 300.0))
    return [Server(i, FakeServer(url), hang, ServerStats(url)) for i, url in enumerate(urls)]


def _work(name: str, *, prefer: str | None = None, fresh: bool = False) -> Work:
    state = TurnState.FRESH if fresh else TurnState.QUEUED
    return Work(
        Conversation(PromptRow(name, ({"role": "user", "content": "q"},), 1), "all"), state, prefer=prefer
    )


def test_the_queue_order_for_one_servers_worker():
    """Its own lane, work under way, other lanes that waited hold_s, fresh prompts, then other lanes."""

    async def order() -> list[str]:
        a, b = _servers("http://a", "http://b")
        queue = WorkQueue(PrefixAffinity(AffinitySettings(5.0, 0.0), [a, b], RateBook()))
        queue.put_nowait(_work("b-old", prefer="http://b"))
        await asyncio.sleep(6.0)  # past the hold: open to every server
        queue.put_nowait(_work("b-new", prefer="http://b"))
        queue.put_nowait(_work("fresh", fresh=True))
        queue.put_nowait(_work("retry"))
        queue.put_nowait(_work("a-next", prefer="http://a"))
        assert queue.qsize() == 5
        return [(await queue.get("http://a")).conversation.id for _ in range(5)]

    from dispatch_fakes import run_virtual

    assert run_virtual(order()) == ["a-next", "retry", "b-old", "fresh", "b-new"]


def test_a_home_that_is_down_or_slow_is_no_home():
    async def homes() -> tuple[object, ...]:
        a, b, c = _servers("http://a", "http://b", "http://c")
        rates = RateBook()
        for _ in range(10):
            rates.observe("http://a", 100, 1.0)
            rates.observe("http://b", 100, 1.0)
            rates.observe("http://c", 100, 10.0)  # ten times slower
        affinity = PrefixAffinity(AffinitySettings(5.0, 0.7), [a, b, c], rates)
        queue = WorkQueue(affinity)
        queue.put_nowait(_work("on-b", prefer="http://b"))
        b.up = False  # benched while its work waits: open to every worker at once, before fresh prompts
        queue.put_nowait(_work("fresh", fresh=True))
        first = (await queue.get("http://a")).conversation.id
        return (
            first,
            affinity.home(_work("x", prefer="http://a")),
            affinity.home(_work("y", prefer="http://b")),
            affinity.home(_work("z", prefer="http://c")),
        )

    from dispatch_fakes import run_virtual

    assert run_virtual(homes()) == ("on-b", Home("http://a"), None, None)


# ----- exactly once --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(8))
def test_every_sample_and_turn_ends_exactly_once_with_affinity_under_random_faults(make_config, seed):
    rng = random.Random(seed)

    def script(server, request):
        kind = rng.choice(("ok", "ok", "ok", "slow", "error", "hang", "connection"))
        return {
            "ok": Reply(after_s=rng.uniform(0.5, 3.0)),
            "slow": Reply(after_s=rng.uniform(10.0, 40.0)),
            "error": Reply(after_s=rng.uniform(0.1, 1.0), error=RequestError("http", "busy", status=503)),
            "hang": Reply(hang=True),
            "connection": Reply(after_s=0.05, error=RequestError("connection", "reset")),
        }[kind]

    servers = [FakeServer(f"http://s{i}", script) for i in range(3)]

    async def flap(dispatcher):
        while True:
            await asyncio.sleep(rng.uniform(5.0, 30.0))
            rng.choice(servers).health_status = rng.choice((200, 200, 503))

    config = make_config(
        **FAULT_TOLERANCE,
        concurrency_per_server=rng.choice((1, 3, 8)),
        turns="all",
        affinity_hold_s=rng.choice((0.5, 5.0, 60.0)),
        sampling_plan=plan(2),
    )
    rows = with_samples(prompts(20, questions=1) + prompts(30, questions=3)[20:], answers=2)
    outcome, recorder, _ = dispatch(config, servers, rows, seed=seed, during=flap)
    assert outcome.status == "complete"
    stored = Counter(r["id"] for r in recorder.stored)
    failed = Counter(r["id"] for r in recorder.failures)
    assert all(n == 1 for n in stored.values()) and all(n == 1 for n in failed.values())
    assert not (set(stored) & set(failed)) and set(stored) | set(failed) == {r.id for r in rows}
    for row in recorder.stored:
        questions = 1 if row["prompt_id"] < "p0020" else 3
        assert row["turn_content"] == [f"the answer to {row['prompt_id']} turn {t}" for t in range(questions)]
