"""The simulated scheduler: the running-request cap, the queue behind it, and the step clock."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from sim_helpers import USER, max_overlap, post_json, sample_value, scrape, truth_for, wait_for

from draftgen.client.sse import SseDecoder
from draftgen.sim.profiles import get_profile


def test_queueing_past_max_running_requests(sim_fleet):
    """b200-mtp caps the batch at 48 (SGLang's default with speculation on): 60 at once means 12 wait."""
    fleet = sim_fleet(profile="b200-mtp", speed=10)
    url = fleet.urls[0]
    bodies = [
        {
            "model": "m",
            "messages": [{"role": "user", "content": f"Task {i}: sort these numbers."}],
            "max_tokens": 128,
        }
        for i in range(60)
    ]

    async def run() -> tuple[list[tuple[int, dict]], list[tuple[float, float]]]:
        gauges: list[tuple[float, float]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def one(body: dict) -> tuple[int, dict]:
                async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                    return response.status, await response.json()

            async def watch(tasks: list[asyncio.Task]) -> None:
                while not all(task.done() for task in tasks):
                    async with session.get(f"{url}/metrics") as response:
                        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
                    gauges.append(
                        (
                            sample_value(families, "sglang:num_running_reqs"),
                            sample_value(families, "sglang:num_queue_reqs"),
                        )
                    )
                    await asyncio.sleep(0.01)

            tasks = [asyncio.ensure_future(one(body)) for body in bodies]
            await watch(tasks)
            return [task.result() for task in tasks], gauges

    replies, gauges = asyncio.run(run())
    assert all(status == 200 for status, _ in replies)
    assert all(reply["choices"][0]["finish_reason"] in ("stop", "length") for _, reply in replies)
    assert max(queued for _, queued in gauges) > 0
    assert max(running for running, _ in gauges) <= 48
    records = [truth_for(fleet, reply["id"]) for _, reply in replies]
    assert max_overlap(records) == 48  # the cap is reached and never passed
    waited = [r for r in records if r["admitted"] > min(x["finished"] for x in records)]
    assert len(waited) >= 12  # these were admitted only once a slot freed


def test_step_clock_lower_bound(sim_fleet):
    """A request alone takes at least its steps' simulated time: (t0 + t1) per verify step, divided by speed.

    Scheduling only ever adds delay, so this bound holds however busy the machine is.
    """
    profile = get_profile("b200-mtp")
    fleet = sim_fleet(profile="b200-mtp", speed=20)
    status, reply = post_json(
        f"{fleet.urls[0]}/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 400}
    )
    assert status == 200
    truth = truth_for(fleet, reply["id"])
    nominal = truth["verify_steps"] * profile.step_seconds(1) / 20
    assert truth["finished"] - truth["admitted"] >= 0.999 * nominal


def test_client_disconnect_frees_the_slot_for_good(sim_fleet):
    """A client that hangs up mid-stream: its request is aborted once, leaves the batch, and never comes back."""
    fleet = sim_fleet(profile="b200-mtp", speed=5)
    url = fleet.urls[0]
    before = scrape(url)
    body = {"model": "m", "messages": USER, "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def hang_up_early() -> str:
        async with aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/v1/chat/completions", json=body)
            decoder, events = SseDecoder(), []
            async for data in response.content.iter_any():
                events += decoder.feed(data)
                if len(events) >= 4:  # the role chunk, then a few steps of reasoning
                    break
            response.close()  # drop the connection mid-generation
            return json.loads(events[0].data)["id"]

    rid = asyncio.run(hang_up_early())

    def idle_twice() -> bool:  # two looks a few steps apart: a resurrected request would be running
        first = sample_value(scrape(url), "sglang:num_running_reqs")
        time.sleep(0.05)
        return first == 0 and sample_value(scrape(url), "sglang:num_running_reqs") == 0

    wait_for(idle_twice, what="the batch to empty")
    record = truth_for(fleet, rid)  # asserts a single record
    assert record["outcome"] == "client_disconnected" and record["finish_type"] == "abort"
    assert 0 < record["completion_tokens"] < 400
    after = scrape(url)
    generated = sample_value(
        after, "sglang:generation_tokens", "sglang:generation_tokens_total"
    ) - sample_value(before, "sglang:generation_tokens", "sglang:generation_tokens_total")
    verified = sample_value(
        after, "sglang:spec_verify_calls", "sglang:spec_verify_calls_total"
    ) - sample_value(before, "sglang:spec_verify_calls", "sglang:spec_verify_calls_total")
    assert (generated, verified) == (record["completion_tokens"], record["verify_steps"])
    aborted = sample_value(after, "sglang:num_aborted_requests", "sglang:num_aborted_requests_total")
    assert aborted == 1
    assert [r["rid"] for r in fleet.truth()].count(rid) == 1
