"""Every injected fault kind, seen through the openai client and raw HTTP, checked against the ground truth.

startup_delay and load_delay are covered by test_sim_native.py::test_health_transitions_refused_then_503_then_200.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx2
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from prometheus_client.parser import text_string_to_metric_families
from sim_helpers import (
    USER,
    count,
    post,
    post_json,
    post_many,
    sample_value,
    scrape,
    sse_json,
    truth_for,
    wait_for,
)

from draftgen.sim import SimFleet
from draftgen.sim.fleet import http_status
from draftgen.sim.profiles import get_profile

MODEL = "Qwen/Qwen3.6-27B"
ERROR, HANG, EMPTY, ABORT, OMIT, SOME_ERRORS, SLOW, PLAIN = range(8)
FAULT_FLEET = {
    ERROR: ["error_rate=1"],
    HANG: ["hang_rate=1"],
    EMPTY: ["empty_answer_rate=1"],
    ABORT: ["abort_rate=1"],
    OMIT: ["omit_usage=true", "omit_done=true"],
    SOME_ERRORS: ["error_rate=0.3"],
    SLOW: ["slow=5"],
    PLAIN: [],
}
SPEED = 50.0
OPENAI_ERROR = {429: openai.RateLimitError, 503: openai.InternalServerError}


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    fleet = SimFleet(
        servers=len(FAULT_FLEET),
        profile="b200-mtp",
        speed=SPEED,
        per_server_faults=FAULT_FLEET,
        work_dir=tmp_path_factory.mktemp("faulty-sim"),
    )
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.cleanup()


def client(url: str, timeout: float = 30.0) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=timeout)


def chat(url: str, timeout: float = 30.0, **kwargs):
    kwargs.setdefault("max_tokens", 64)
    return client(url, timeout).chat.completions.create(model=MODEL, messages=USER, **kwargs)


def records(fleet: SimFleet, index: int, outcome: str) -> list[dict]:
    return [r for r in fleet.truth(index) if r["outcome"] == outcome]


def test_error_rate_one_answers_500(faulty):
    url = faulty.urls[ERROR]
    with pytest.raises(openai.InternalServerError) as caught:
        chat(url)
    assert caught.value.status_code == 500
    status, body = post_json(f"{url}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    assert status == 500 and body["object"] == "error" and body["code"] == 500
    errors = records(faulty, ERROR, "error_500")
    assert len(errors) == 2 and all(r["http_status"] == 500 for r in errors)
    assert http_status(f"{url}/health") == 200  # the server itself stays up


def test_error_rate_fraction_fails_some_requests(faulty):
    url = f"{faulty.urls[SOME_ERRORS]}/v1/chat/completions"
    bodies = [
        {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 8} for i in range(40)
    ]
    statuses = [status for status, _ in asyncio.run(post_many(url, bodies))]
    assert set(statuses) == {200, 500}
    assert statuses.count(500) == len(records(faulty, SOME_ERRORS, "error_500"))


def test_hang_accepts_and_never_answers_while_health_is_200(faulty):
    url = faulty.urls[HANG]
    with pytest.raises(openai.APITimeoutError):
        chat(url, timeout=1.0)
    assert http_status(f"{url}/health") == 200
    hung = wait_for(lambda: records(faulty, HANG, "hung"), what="the hung request's record")
    assert len(hung) == 1 and hung[0]["completion_tokens"] == 0


def test_empty_answer_is_the_short_failure_and_no_real_answer(faulty):
    url = faulty.urls[EMPTY]
    reply = chat(url, max_tokens=4096)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content.strip() == "OK."
    assert not (getattr(choice.message, "reasoning_content", None) or "").strip()
    tokens = count(faulty, "\n</think>\n\nOK.") + 1  # and the EOS: 6 tokens in Qwen3's vocabulary
    assert reply.usage.completion_tokens == tokens
    assert truth_for(faulty, reply.id, EMPTY)["completion_tokens"] == tokens
    chunks = list(chat(url, max_tokens=4096, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == "OK."


def test_abort_gives_empty_text_and_abort_finish(faulty):
    url = faulty.urls[ABORT]
    before = sample_value(scrape(url), "sglang:num_aborted_requests", "sglang:num_aborted_requests_total")
    reply = chat(url)
    assert reply.choices[0].finish_reason == "abort"
    assert not reply.choices[0].message.content and reply.usage.completion_tokens == 0
    chunks = list(chat(url, stream=True))
    assert chunks[-1].choices[0].finish_reason == "abort"
    assert all(not (c.choices[0].delta.content or "") for c in chunks)
    status, body = post_json(f"{url}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and body["text"] == "" and body["meta_info"]["finish_reason"]["type"] == "abort"
    assert truth_for(faulty, reply.id, ABORT)["outcome"] == "aborted"
    after = sample_value(scrape(url), "sglang:num_aborted_requests", "sglang:num_aborted_requests_total")
    assert after - before == 3


def test_omit_usage_and_omit_done(faulty):
    url = faulty.urls[OMIT]
    assert chat(url).usage is None
    chunks = list(
        chat(url, stream=True, stream_options={"include_usage": True})
    )  # the client copes without [DONE]
    assert chunks and all(len(c.choices) == 1 and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    body = {"model": "m", "messages": USER, "max_tokens": 32, "stream": True}
    status, raw = post(f"{url}/v1/chat/completions", body)
    events, done = sse_json(raw)
    assert status == 200 and events and not done
    status, raw = post(
        f"{url}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 8}, "stream": True}
    )
    assert status == 200 and not sse_json(raw)[1]
    # the same requests on a plain server do end with [DONE]
    status, raw = post(f"{faulty.urls[PLAIN]}/v1/chat/completions", body)
    assert sse_json(raw)[1]


def test_slow_multiplies_step_time(faulty):
    """The step clock only ever runs late, so slow=5 gives a hard lower bound of 5x the nominal step time."""
    status, reply = post_json(
        f"{faulty.urls[SLOW]}/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 600}
    )
    assert status == 200
    truth = truth_for(faulty, reply["id"], SLOW)
    nominal = truth["verify_steps"] * get_profile("b200-mtp").step_seconds(1) / SPEED
    assert truth["finished"] - truth["admitted"] >= 0.999 * 5 * nominal


@pytest.mark.parametrize("status_code", [429, 503])
def test_overload_rejects_past_the_queue_limit(sim_fleet, status_code):
    """One request runs (cap 1), two wait (the limit): the next ones are refused, raw and via the client."""
    fleet = sim_fleet(
        profile="b200-mtp",
        speed=2,
        max_running_requests=1,
        faults=["overload=2", f"overload_status={status_code}"],
    )
    url = fleet.urls[0]

    async def scenario() -> tuple[int, dict, BaseException | None, list[float]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def send(content: str, max_tokens: int, **extra: object) -> tuple[int, dict]:
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": content}],
                    "max_tokens": max_tokens,
                }
                async with session.post(f"{url}/v1/chat/completions", json={**body, **extra}) as response:
                    return response.status, await response.json(content_type=None)

            async def gauges() -> list[float]:
                async with session.get(f"{url}/metrics") as response:
                    families = {f.name: f for f in text_string_to_metric_families(await response.text())}
                return [
                    sample_value(families, f"sglang:{name}")
                    for name in ("num_running_reqs", "num_queue_reqs")
                ]

            async def until(running: int, queued: int) -> list[float]:
                for _ in range(3000):
                    state = await gauges()
                    if state == [running, queued]:
                        return state
                    await asyncio.sleep(0.01)
                raise AssertionError(f"server never reached running={running} queued={queued}: {state}")

            # Minutes of simulated work: still running when the client hangs up, however slow this machine is.
            long = asyncio.ensure_future(send("long", 200_000, ignore_eos=True))
            await until(1, 0)
            waiting = [asyncio.ensure_future(send(f"short {i}", 1)) for i in range(2)]
            full = await until(1, 2)  # with the cap at 1 the two others queue behind it
            status, body = await send("one too many", 1)
            api = AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=30)
            try:
                await api.chat.completions.create(model=MODEL, messages=USER, max_tokens=1)
                raised = None
            except openai.APIStatusError as exc:
                raised = exc
            finally:
                await api.close()
            for task in [long, *waiting]:  # hang up: the server aborts them
                task.cancel()
            await asyncio.gather(long, *waiting, return_exceptions=True)
            return status, body, raised, full

    status, body, raised, full = asyncio.run(scenario())
    assert full == [1, 2]
    assert status == status_code and body["object"] == "error" and body["code"] == status_code
    assert isinstance(raised, OPENAI_ERROR[status_code]) and raised.status_code == status_code
    overloaded = wait_for(lambda: records(fleet, 0, "overloaded"), what="overload records")
    assert len(overloaded) == 2 and all(r["http_status"] == status_code for r in overloaded)
    assert http_status(f"{url}/health") == 200
    aborted = wait_for(lambda: len(records(fleet, 0, "client_disconnected")) == 3 or None, what="3 aborts")
    assert aborted


def test_crash_after_requests_and_seconds(sim_fleet):
    fleet = sim_fleet(
        profile="b200-mtp",
        speed=SPEED,
        servers=2,
        per_server_faults={0: ["crash_after=3"], 1: ["crash_after=1.5s"]},
    )
    url = fleet.urls[0]
    assert chat(url).choices[0].finish_reason in ("stop", "length")
    assert chat(url).choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.APIConnectionError):
        chat(url)  # the third request takes the process down with it
    assert (
        wait_for(lambda: fleet.returncode(0) is not None, what="server 0 to exit")
        and fleet.returncode(0) == 70
    )
    assert http_status(f"{url}/health") is None
    assert len([r for r in fleet.truth(0) if r["kind"] == "chat"]) == 2
    wait_for(lambda: fleet.returncode(1) is not None, what="server 1 to exit by the clock")
    assert fleet.returncode(1) == 70


@pytest.mark.slow  # started first (tests/long_first.py)
def test_wedge_after_n_freezes_running_and_later_requests_while_health_is_200(sim_fleet):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=1.0, faults=["wedge_after=3"])
    url = fleet.urls[0]
    first = chat(url, max_tokens=16)
    assert first.usage.completion_tokens > 0
    with client(url, timeout=2.0).chat.completions.create(
        model=MODEL, messages=USER, max_tokens=4096, stream=True
    ) as running:  # request 2: still decoding when request 3 wedges the scheduler
        next(iter(running))
        with pytest.raises(openai.APITimeoutError):
            chat(url, timeout=1.0, max_tokens=16)  # request 3
        with pytest.raises((openai.APITimeoutError, httpx2.ReadTimeout)):
            for _ in running:  # the running request stops mid-answer
                pass
    with pytest.raises(openai.APITimeoutError):
        chat(url, timeout=1.0, max_tokens=16)  # and so does every later one
    assert http_status(f"{url}/health") == 200
    # SGLang's /health_generate gives up after 20 s without a word from the scheduler: 503.
    assert http_status(f"{url}/health_generate", timeout=30.0) == 503
    outcomes = sorted(r["outcome"] for r in fleet.truth(0) if r["kind"] == "chat")
    assert outcomes == ["client_disconnected", "client_disconnected", "client_disconnected", "ok"]
