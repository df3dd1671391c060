"""Dispatch's rules, one at a time, on fake servers and a virtual clock: retries, failover, hang deadlines,
the silence watch, hedging, and exactly-once under many interleavings. No HTTP, no threads, no sleeps."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from dispatch_fakes import FAULT_TOLERANCE, FakeServer, Reply, always, dispatch, fake_config, prompts

from draftgen.client.errors import RequestError
from draftgen.generate import GenerateConfig


@pytest.fixture
def make_config(tmp_path):
    def make(**changes: object) -> GenerateConfig:
        return fake_config(tmp_path, **{"backoff_base_s": 1.0, "backoff_max_s": 8.0, **changes})

    return make


def stored_ids(recorder) -> list[str]:
    return sorted(row["id"] for row in recorder.stored)


def unavailable(status: int = 503) -> RequestError:
    return RequestError("http", "busy", status=status)


def test_a_failed_request_is_retried_with_backoff_and_stored_once(make_config):
    def script(server, request):
        tries = sum(r.prompt_id == request.prompt_id for r in server.requests)
        return Reply(error=unavailable()) if request.prompt_id == "p0003" and tries <= 2 else Reply()

    server = FakeServer("http://a", script)
    outcome, recorder, _ = dispatch(make_config(), [server], prompts(8))
    assert outcome.status == "complete" and stored_ids(recorder) == [f"p{i:04d}" for i in range(8)]
    row = next(r for r in recorder.stored if r["id"] == "p0003")
    assert row["attempts"] == 3 and not recorder.failures
    sent = [r.sent_at for r in server.requests if r.prompt_id == "p0003"]
    assert sent[1] - sent[0] >= 1.0  # answered after 1 s, then a backoff wait before the retry
    assert outcome.servers[0].errors == 2


def test_a_request_the_server_refuses_fails_at_once_and_is_not_retried(make_config):
    refused = RequestError("http", "Messages cannot be empty.", status=400)
    server = FakeServer("http://a", lambda s, r: Reply(error=refused) if r.prompt_id == "p0001" else Reply())
    outcome, recorder, _ = dispatch(make_config(), [server], prompts(4))
    assert [f["id"] for f in recorder.failures] == ["p0001"]
    assert (
        recorder.failures[0]["attempts"] == 1 and "Messages cannot be empty." in recorder.failures[0]["error"]
    )
    assert sum(r.prompt_id == "p0001" for r in server.requests) == 1
    assert outcome.failed == 1 and outcome.completed == 3


def test_attempts_are_capped_then_the_prompt_goes_to_failed(make_config):
    server = FakeServer("http://a", always(Reply(error=unavailable(429))))  # 429: retried, never benches it
    outcome, recorder, _ = dispatch(make_config(max_attempts=3), [server], prompts(2))
    assert sorted(f["id"] for f in recorder.failures) == ["p0000", "p0001"]
    assert all(f["attempts"] == 3 for f in recorder.failures) and len(server.requests) == 6
    assert outcome.servers[0].downs == 0 and not recorder.stored


def test_a_failing_server_is_benched_its_work_moves_and_it_rejoins_when_healthy(make_config):
    broken = FakeServer("http://a", always(Reply(after_s=0.1, error=RequestError("connection", "refused"))))
    broken.health_status = 503
    healthy = FakeServer("http://b", always(Reply(after_s=2.0)))

    async def heal(dispatcher):
        import asyncio

        await asyncio.sleep(30.0)
        broken.script = always(Reply(after_s=2.0))
        broken.health_status = 200

    config = make_config(server_down_after=3, probe_interval_s=1.0, probe_max_interval_s=4.0)
    outcome, recorder, _ = dispatch(config, [broken, healthy], prompts(200), during=heal)
    assert outcome.status == "complete" and len(stored_ids(recorder)) == 200 and not recorder.failures
    downs = recorder.noted("marked down after 3 consecutive failures")
    assert len(downs) == 1 and downs[0][1] == "http://a"
    rejoined = recorder.noted("rejoined")
    assert len(rejoined) == 1 and 30.0 <= rejoined[0][0] <= 35.0  # probed with backoff capped at 4 s
    assert broken.count("answered") > 0  # it took work again after rejoining
    assert all(
        row["attempts"] <= 2 for row in recorder.stored
    )  # a connection error costs one attempt, no more


def test_a_hung_request_is_cut_at_the_learned_deadline_not_request_timeout(make_config):
    # Server a answers 100 tokens in 1 s until its 60th request, then its scheduler wedges: every request hangs
    # (and /health_generate, which needs the scheduler, fails, so the prober keeps it benched).
    def script(server, request):
        if len(server.requests) <= 60:
            return Reply(after_s=1.0)
        server.health_status = 503
        return Reply(hang=True)

    wedged = FakeServer("http://a", script)
    fine = FakeServer("http://b", always(Reply(after_s=1.0)))
    config = make_config(request_timeout_s=1800.0, hang_factor=3.0, hang_min_s=5.0, server_down_after=3)
    outcome, recorder, _ = dispatch(config, [wedged, fine], prompts(300))
    assert outcome.status == "complete" and len(stored_ids(recorder)) == 300
    learned = recorder.noted("hang deadline learned")
    assert {server for _, server, _ in learned} == {"http://a", "http://b"}
    down = recorder.noted("marked down")
    assert len(down) == 1 and "presumed hung: no answer within" in down[0][2]
    # The learned deadline is 3 x 100 tokens at 100 tok/s = 3 s, floored at hang_min_s: 5 s, not 1800 s.
    first_hang = min(r.sent_at for r in wedged.requests[60:])
    assert down[0][0] - first_hang < 10.0
    assert wedged.count("cancelled") >= 3 and wedged.count("answered") == 60


def test_the_silence_watch_benches_a_wedged_server_only_when_health_generate_fails(make_config):
    silent = FakeServer("http://a", always(Reply(hang=True)))
    fine = FakeServer("http://b", always(Reply(after_s=1.0)))
    config = make_config(hang_factor=0, server_silence_s=60.0, request_timeout_s=1800.0, probe_interval_s=5.0)

    async def break_health(dispatcher):
        import asyncio

        await asyncio.sleep(100.0)
        silent.health_status = 503

    outcome, recorder, _ = dispatch(config, [silent, fine], prompts(100), during=break_health)
    assert outcome.status == "complete" and len(stored_ids(recorder)) == 100
    waiting = recorder.noted("but /health_generate 200: waiting")
    down = recorder.noted("without an answer with")
    assert waiting and waiting[0][0] < 100.0  # silent but healthy: only noted
    assert len(down) == 1 and down[0][0] >= 100.0 and "/health_generate 503" in down[0][2]
    assert all(row["attempts"] == 1 for row in recorder.stored)  # evicted requests do not count as attempts


def test_the_tail_is_hedged_onto_idle_servers_and_the_loser_cancelled(make_config):
    slow = FakeServer("http://slow", always(Reply(after_s=31.0)))  # never in step with the fast ones
    fast = [FakeServer(f"http://fast{i}", always(Reply(after_s=3.0))) for i in range(3)]
    config = make_config(hedge_slow_ratio=0.5, concurrency_per_server=4)
    outcome, recorder, _ = dispatch(config, [slow, *fast], prompts(600))  # the slow one answers ~20 meanwhile
    assert outcome.status == "complete" and stored_ids(recorder) == [f"p{i:04d}" for i in range(600)]
    assert (
        outcome.hedged > 0 and outcome.hedge_wins == outcome.hedged
    )  # every copy beat a 10x slower original
    assert (
        slow.count("cancelled") == outcome.hedge_wins
    )  # the loser's connection closed: the server aborts it
    assert (
        outcome.servers[0].hedges == 0
        and sum(s.hedge_wins for s in outcome.servers[1:]) == outcome.hedge_wins
    )
    assert recorder.noted("hedged") and not recorder.failures
    kept = Counter(label for _, label, _ in recorder.kept_turns)
    assert set(kept.values()) == {1}  # one answer kept per turn, hedged or not


def test_hedging_waits_until_nothing_is_left_to_send(make_config):
    slow = FakeServer("http://slow", always(Reply(after_s=31.0)))  # never in step with the fast ones
    fast = FakeServer("http://fast", always(Reply(after_s=3.0)))
    outcome, recorder, _ = dispatch(make_config(hedge_slow_ratio=0.5), [slow, fast], prompts(400))
    hedges = recorder.noted("hedged")
    assert hedges and outcome.hedged > 0, "the tail was never hedged"
    # No copy while anything was left to send: every prompt had its first request before the first copy.
    first_hedge = hedges[0][0]
    originals = [r for s in (slow, fast) for r in s.requests if r.sent_at < first_hedge]
    assert {r.prompt_id for r in originals} == {f"p{i:04d}" for i in range(400)}
    assert len(originals) == 400


@pytest.mark.parametrize("seed", range(12))
def test_every_prompt_ends_exactly_once_under_random_faults(make_config, seed):
    """Random delays, errors, hangs, benching and rejoining, hedging, multi-turn conversations: every prompt is
    stored once or failed once — never both, never twice, never lost — and every stored row has all its turns."""
    rng = random.Random(seed)
    kinds = ("ok", "ok", "ok", "ok", "slow", "error", "refused", "hang", "connection")

    def script(server, request):
        kind = rng.choice(kinds)
        return {
            "ok": Reply(after_s=rng.uniform(0.5, 3.0)),
            "slow": Reply(after_s=rng.uniform(10.0, 40.0)),
            "error": Reply(after_s=rng.uniform(0.1, 1.0), error=unavailable(rng.choice((500, 503, 429)))),
            "refused": Reply(after_s=0.2, error=RequestError("http", "bad", status=400))
            if rng.random() < 0.05
            else Reply(),
            "hang": Reply(hang=True),
            "connection": Reply(after_s=0.05, error=RequestError("connection", "reset")),
        }[kind]

    servers = [FakeServer(f"http://s{i}", script) for i in range(3)]

    async def flap(dispatcher):
        import asyncio

        while True:
            await asyncio.sleep(rng.uniform(5.0, 30.0))
            target = rng.choice(servers)
            target.health_status = rng.choice((200, 200, 503))

    config = make_config(
        **FAULT_TOLERANCE,
        concurrency_per_server=rng.choice((1, 3, 8)),
        turns="all",
    )
    rows = prompts(40, questions=1) + [p for p in prompts(60, questions=3)[40:]]
    outcome, recorder, _ = dispatch(config, servers, rows, seed=seed, during=flap)
    assert outcome.status == "complete"
    stored = Counter(r["id"] for r in recorder.stored)
    failed = Counter(r["id"] for r in recorder.failures)
    assert all(n == 1 for n in stored.values()) and all(n == 1 for n in failed.values())
    assert not (set(stored) & set(failed))
    assert set(stored) | set(failed) == {p.id for p in rows}
    by_id = {p.id: p for p in rows}
    for row in recorder.stored:
        questions = sum(m["role"] == "user" for m in by_id[row["id"]].messages)
        assert len(row["turn_content"]) == questions
        assert row["turn_content"] == [f"the answer to {row['id']} turn {t}" for t in range(questions)]
    assert outcome.completed == len(stored) and outcome.failed == len(failed)
    assert all(s.closed for s in servers)
