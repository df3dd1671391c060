"""The simulator models a sampling plan's arms: thinking off answers far shorter with no reasoning, and the
temperature moves acceptance, each request's expected acceptance written to the ground truth."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI
from sim_helpers import truth_for

from draftgen.sim import categories, temperature
from draftgen.sim.profiles import B200_MTP, B200_TEMPERATURE_ACCEPT_LENGTH, RTX_PRO_6000
from draftgen.sim.speculative import mean_accept_length

MODEL = "Qwen/Qwen3.6-27B"
NEW = 2  # the shared fleet's SGLang 0.5.23 server (sglext acceptance per request)
SPEC = {"return_spec_tokens_details": True}


def _length_at(temp: float | None, category: str | None = None) -> float:
    factor = categories.factor_of(B200_MTP.category_accept, category) * temperature.factor_at(
        B200_MTP.temperature_accept, temp
    )
    return mean_accept_length(categories.scaled(B200_MTP.position_probabilities(), factor))


# ----- units ------------------------------------------------------------------------------------------------
def test_the_temperature_factors_give_the_profiles_lengths_and_none_keeps_its_own():
    for temp, length in B200_TEMPERATURE_ACCEPT_LENGTH.items():
        assert _length_at(temp) == pytest.approx(length)
    assert _length_at(None) == pytest.approx(B200_MTP.accept_mean)  # the model's default temperature
    assert _length_at(temperature.DEFAULT_TEMPERATURE) == pytest.approx(B200_MTP.accept_mean)
    assert _length_at(0.0) > _length_at(0.3) > _length_at(0.6) > _length_at(0.8) > _length_at(1.0)
    assert _length_at(1.5) == _length_at(1.9)  # flat past the last anchor
    # it multiplies the category's: code at temperature 1 below code at 0.6, above chat at 1
    assert _length_at(1.0, "chat") < _length_at(1.0, "code") < _length_at(0.6, "code")
    assert temperature.factor_at(RTX_PRO_6000.temperature_accept, 0.0) == 1.0  # no speculation, no anchors


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"temperature": 0}, 0.0), ({"temperature": 1.2}, 1.2), ({}, None), ({"temperature": None}, None)]
    + [({"temperature": v}, None) for v in (True, "0.7", -1.0)],
)
def test_a_request_temperature_is_read_when_it_is_a_number(body, expected):
    assert temperature.temperature_of(body) == expected


# ----- on the simulated server ------------------------------------------------------------------------------
async def _ask_many(url: str, count: int, **kwargs) -> list:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=60)
    try:
        messages = [[{"role": "user", "content": f"Say something about number {i}."}] for i in range(count)]
        return await asyncio.gather(
            *(client.chat.completions.create(model=MODEL, messages=m, **kwargs) for m in messages)
        )
    finally:
        await client.close()


def _measured(replies: list) -> float:
    """The arm's acceptance as SGLang counts it: its tokens over its verify steps (from sglext per request)."""
    details = [r.model_extra["sglext"]["spec_tokens_details"] for r in replies]
    tokens = sum(r.usage.completion_tokens for r in replies)
    return tokens / sum(d["spec_verify_ct"] for d in details)


def test_temperature_moves_acceptance_and_thinking_off_answers_short_without_reasoning(shared_sim_fleet):
    url = shared_sim_fleet.urls[NEW]
    arms = {
        "greedy": {"temperature": 0.0},
        "hot": {"temperature": 1.0},
        "off": {
            "temperature": 1.0,
            "extra_body": {**SPEC, "chat_template_kwargs": {"enable_thinking": False}},
        },
    }
    replies = {
        name: asyncio.run(
            _ask_many(url, 40, max_tokens=4096, **{"extra_body": SPEC, **kwargs}),
        )
        for name, kwargs in arms.items()
    }
    for name, temp in (("greedy", 0.0), ("hot", 1.0), ("off", 1.0)):
        for reply in replies[name][:5]:
            truth = truth_for(shared_sim_fleet, reply.id, NEW)
            assert truth["temperature"] == temp
            assert truth["category"] is None  # the prompts are of no category: the temperature alone moves it
            assert truth["accept_expected"] == pytest.approx(_length_at(temp))
        # what a client measures follows the expectation (40 requests, thousands of verify steps each arm)
        assert _measured(replies[name]) == pytest.approx(_length_at(temp), rel=0.03), name
    assert _measured(replies["greedy"]) - _measured(replies["hot"]) > 0.3
    # thinking off: no reasoning at all, and answers far shorter than thinking on at the same temperature
    off, on = replies["off"], replies["hot"]
    assert all(r.choices[0].message.model_extra.get("reasoning_content") is None for r in off)
    assert all(r.choices[0].message.model_extra.get("reasoning_content") for r in on)
    mean_off = sum(r.usage.completion_tokens for r in off) / len(off)
    mean_on = sum(r.usage.completion_tokens for r in on) / len(on)
    assert mean_off < 0.5 * mean_on
