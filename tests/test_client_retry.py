"""The one retry policy (``client.retry``), with fakes: which failures are retried, how long each wait is, and the
``retrying`` loop preflight's probe and canary go through."""

from __future__ import annotations

import asyncio
import random

import pytest

from draftgen.client.errors import RequestError
from draftgen.client.retry import RetryPolicy, retrying


def test_backoff_is_full_jitter_exponential_and_capped():
    policy = RetryPolicy(max_attempts=10, base_s=1.0, max_s=8.0)
    rng = random.Random(1)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = [policy.delay(attempt, None, rng) for _ in range(400)]
        assert 0.0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > 0.8 * ceiling and min(delays) < 0.2 * ceiling  # spread over [0, ceiling]


def test_retry_after_is_a_floor():
    policy = RetryPolicy(max_attempts=5, base_s=0.01, max_s=1.0)
    error = RequestError("http", "slow down", status=429, retry_after=3.0)
    assert all(policy.delay(1, error, random.Random(i)) >= 3.0 for i in range(50))


def test_what_is_retried_and_what_marks_a_server_down():
    policy = RetryPolicy(max_attempts=3)
    timeout = RequestError("timeout", "t")
    assert policy.should_retry(timeout, 1) and policy.should_retry(timeout, 2)
    assert not policy.should_retry(timeout, 3)
    assert not policy.should_retry(RequestError("http", "too long", status=400), 1)
    assert policy.should_retry(RequestError("http", "busy", status=429), 1)
    assert RequestError("connection", "refused").server_fault
    assert RequestError("http", "boom", status=500).server_fault
    assert not RequestError("http", "busy", status=429).server_fault
    assert not RequestError("http", "bad", status=400).server_fault


class FlakyCall:
    """Fails with each of ``errors`` in turn, then answers ``"answer"``; counts its calls."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "answer"


class Sleeps:
    """A fake sleep that records each wait instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def run(call: FlakyCall, policy: RetryPolicy, sleeps: Sleeps, seed: int = 7) -> str:
    return asyncio.run(retrying(call, policy, rng=random.Random(seed), sleep=sleeps))


def test_retrying_waits_the_policys_draws_between_transient_failures():
    policy = RetryPolicy(max_attempts=3, base_s=1.0, max_s=2.0)
    call, sleeps = FlakyCall(RequestError("http", "boom", status=500), RequestError("timeout", "t")), Sleeps()
    assert run(call, policy, sleeps) == "answer" and call.calls == 3
    rng = random.Random(7)
    assert sleeps.waits == [policy.delay(1, None, rng), policy.delay(2, None, rng)]
    assert sleeps.waits[0] <= 1.0 and sleeps.waits[1] <= 2.0


def test_retrying_honours_retry_after():
    policy = RetryPolicy(max_attempts=2, base_s=0.01, max_s=1.0)
    call, sleeps = FlakyCall(RequestError("http", "slow down", status=429, retry_after=4.0)), Sleeps()
    assert run(call, policy, sleeps) == "answer"
    assert sleeps.waits[0] >= 4.0


def test_a_failure_that_is_not_retryable_is_raised_at_once():
    call, sleeps = FlakyCall(RequestError("http", "wrong model", status=400)), Sleeps()
    with pytest.raises(RequestError) as caught:
        run(call, RetryPolicy(max_attempts=5), sleeps)
    assert caught.value.status == 400 and call.calls == 1 and sleeps.waits == []


def test_the_last_failure_is_raised_after_max_attempts():
    errors = [RequestError("connection", f"refused {i}", connected=False) for i in range(4)]
    call, sleeps = FlakyCall(*errors), Sleeps()
    with pytest.raises(RequestError) as caught:
        run(call, RetryPolicy(max_attempts=3, base_s=0.1, max_s=0.1), sleeps)
    assert caught.value.message == "refused 2" and call.calls == 3 and len(sleeps.waits) == 2


def test_a_bug_is_never_retried():
    call, sleeps = FlakyCall(KeyError("choices")), Sleeps()
    with pytest.raises(KeyError):
        run(call, RetryPolicy(max_attempts=5), sleeps)
    assert call.calls == 1 and sleeps.waits == []
