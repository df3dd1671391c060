"""The real ``openai`` client (sync, async, streaming) against the simulator's /v1 endpoints.

Server 2 of the shared fleet speaks SGLang 0.5.23, server 1 0.5.9 and server 0 0.5.4 (see conftest.py).
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from sim_helpers import USER, count, eos_id, get_json, prompt_count, truth_for

MODEL = "Qwen/Qwen3.6-27B"
NEW = 2  # index of the 0.5.23 server in the shared fleet
THINK_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=30)


def ask(url: str, messages=USER, **kwargs):
    return client(url).chat.completions.create(model=MODEL, messages=messages, **kwargs)


def reasoning_of(message_or_delta) -> str | None:
    return getattr(message_or_delta, "reasoning_content", None)


def stream_chunks(url: str, messages=USER, **kwargs) -> list:
    return list(ask(url, messages, stream=True, **kwargs))


def joined(chunks: list, field: str) -> str:
    parts = []
    for chunk in chunks:
        for choice in chunk.choices:
            value = reasoning_of(choice.delta) if field == "reasoning" else choice.delta.content
            parts.append(value or "")
    return "".join(parts)


@pytest.fixture(scope="module")
def full_reply(shared_sim_fleet):
    """One complete thinking-on reply to USER (the reference for truncation and streaming comparisons)."""
    reply = ask(shared_sim_fleet.urls[NEW], max_tokens=8192)
    assert reply.choices[0].finish_reason == "stop", "the reference prompt must finish on its own"
    return reply


def test_models_lists_the_served_model(shared_sim_fleet):
    raw = get_json(f"{shared_sim_fleet.urls[NEW]}/v1/models")
    assert raw["object"] == "list" and len(raw["data"]) == 1
    entry = raw["data"][0]
    assert set(entry) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"}
    assert entry["id"] == MODEL and entry["root"] == MODEL and entry["object"] == "model"
    assert entry["owned_by"] == "sglang" and entry["parent"] is None
    assert isinstance(entry["created"], int) and entry["max_model_len"] == 262_144
    assert [m.id for m in client(shared_sim_fleet.urls[NEW]).models.list()] == [MODEL]


def test_thinking_reply_splits_reasoning_from_answer(shared_sim_fleet, full_reply):
    choice = full_reply.choices[0]
    reasoning, content = reasoning_of(choice.message), choice.message.content
    assert reasoning and content and content.strip()
    assert "</think>" not in reasoning and "</think>" not in content and "<think>" not in reasoning
    assert choice.message.role == "assistant"
    dumped = full_reply.model_dump()
    end = full_reply.usage.completion_tokens
    assert dumped["metadata"] == {
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": end}],
    }
    assert dumped["choices"][0]["matched_stop"] == eos_id(shared_sim_fleet)
    assert (
        "tool_calls" not in dumped["choices"][0]["message"]
        or dumped["choices"][0]["message"]["tool_calls"] is None
    )


def test_usage_counts_follow_the_simulated_tokenization(shared_sim_fleet, full_reply):
    usage = full_reply.usage
    message = full_reply.choices[0].message
    assert usage.prompt_tokens == prompt_count(shared_sim_fleet, USER, True)
    # reasoning, "</think>", answer (which keeps its leading blank line): their canonical ids, and the unseen EOS
    reasoning_and_end = count(shared_sim_fleet, reasoning_of(message) + "</think>")
    assert (
        usage.completion_tokens
        == count(shared_sim_fleet, reasoning_of(message) + "</think>" + message.content) + 1
    )
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # SGLang 0.5.23: the tokens up to and including </think>, at the top and in the details
    assert usage.model_extra["reasoning_tokens"] == reasoning_and_end
    assert usage.completion_tokens_details.reasoning_tokens == reasoning_and_end
    truth = truth_for(shared_sim_fleet, full_reply.id, NEW)
    assert truth["outcome"] == "ok" and truth["finish_type"] == "stop" and truth["kind"] == "chat"
    assert truth["completion_tokens"] == usage.completion_tokens
    assert truth["prompt_tokens"] == usage.prompt_tokens


def test_enable_thinking_false_gives_only_an_answer(shared_sim_fleet):
    reply = ask(shared_sim_fleet.urls[NEW], max_tokens=4096, extra_body=THINK_OFF)
    message = reply.choices[0].message
    assert reasoning_of(message) is None and message.content
    assert "</think>" not in message.content
    assert reply.usage.prompt_tokens == prompt_count(shared_sim_fleet, USER, False)
    assert reply.usage.completion_tokens == count(shared_sim_fleet, message.content) + 1
    assert reply.usage.model_extra["reasoning_tokens"] == 0 and reply.usage.completion_tokens_details is None


def test_separate_reasoning_false_keeps_everything_in_content(shared_sim_fleet, full_reply):
    reply = ask(shared_sim_fleet.urls[NEW], max_tokens=8192, extra_body={"separate_reasoning": False})
    message = reply.choices[0].message
    reference = full_reply.choices[0].message
    assert reasoning_of(message) is None
    assert message.content == reasoning_of(reference) + "</think>" + reference.content


def test_truncation_before_think_end_means_no_answer(shared_sim_fleet, full_reply):
    url = shared_sim_fleet.urls[NEW]
    full_reasoning = reasoning_of(full_reply.choices[0].message)
    r = count(shared_sim_fleet, full_reasoning)
    for max_tokens in (5, r, r + 1):  # early, just before "</think>", and "</think>" itself the last token
        reply = ask(url, max_tokens=max_tokens)
        choice = reply.choices[0]
        assert choice.finish_reason == "length", max_tokens
        assert not choice.message.content, max_tokens  # empty or null
        assert reply.usage.completion_tokens == max_tokens
        assert full_reasoning.startswith(reasoning_of(choice.message))
    assert reasoning_of(choice.message) == full_reasoning
    # streaming: no content ever arrives
    chunks = stream_chunks(url, max_tokens=r)
    assert joined(chunks, "content") == "" and joined(chunks, "reasoning") == full_reasoning
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streaming_matches_non_streaming(shared_sim_fleet, full_reply):
    chunks = stream_chunks(shared_sim_fleet.urls[NEW], max_tokens=8192)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(len(chunk.choices) == 1 for chunk in chunks)  # no usage chunk unless asked
    assert all(chunk.usage is None for chunk in chunks)
    assert joined(chunks, "reasoning") == reasoning_of(full_reply.choices[0].message)
    assert joined(chunks, "content") == full_reply.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert len({chunk.id for chunk in chunks}) == 1
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)


def test_include_usage_sends_a_final_chunk_without_choices(shared_sim_fleet, full_reply):
    chunks = stream_chunks(
        shared_sim_fleet.urls[NEW], max_tokens=8192, stream_options={"include_usage": True}
    )
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(len(chunk.choices) == 1 and chunk.usage is None for chunk in body)
    expected = full_reply.usage
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        expected.prompt_tokens,
        expected.completion_tokens,
        expected.total_tokens,
    )


def _spec_details(reply) -> dict | None:
    sglext = (reply.model_extra or {}).get("sglext")
    return None if sglext is None else sglext["spec_tokens_details"]


def test_spec_tokens_details_on_request_in_0_5_23(shared_sim_fleet):
    url = shared_sim_fleet.urls[NEW]
    reply = ask(url, max_tokens=300, extra_body={"return_spec_tokens_details": True})
    details = _spec_details(reply)
    assert details is not None
    assert {
        "spec_accept_length",
        "spec_accept_rate",
        "spec_verify_ct",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
    } <= set(details)
    tokens = reply.usage.completion_tokens
    assert details["spec_accept_length"] == pytest.approx(tokens / details["spec_verify_ct"])
    assert 1.0 <= details["spec_accept_length"] <= 4.0
    assert details["spec_num_correct_drafts"] == tokens - details["spec_verify_ct"]
    assert details["spec_num_proposed_drafts"] == 3 * details["spec_verify_ct"]
    assert details["spec_accept_rate"] == pytest.approx(
        details["spec_num_correct_drafts"] / details["spec_num_proposed_drafts"]
    )
    assert truth_for(shared_sim_fleet, reply.id, NEW)["verify_steps"] == details["spec_verify_ct"]
    assert _spec_details(ask(url, max_tokens=300)) is None  # only on request


@pytest.mark.parametrize("index", [0, 1], ids=["0.5.4", "0.5.9"])
def test_older_shapes_carry_no_acceptance_data(shared_sim_fleet, index):
    url = shared_sim_fleet.urls[index]
    extra = {"return_spec_tokens_details": True}
    assert _spec_details(ask(url, max_tokens=64, extra_body=extra)) is None
    chunks = stream_chunks(url, max_tokens=64, extra_body=extra, stream_options={"include_usage": True})
    assert all("sglext" not in (chunk.model_extra or {}) for chunk in chunks)
    assert [len(chunk.choices) for chunk in chunks].count(0) == 1  # the usage chunk only


def test_streamed_spec_tokens_details_come_in_their_own_chunk(shared_sim_fleet):
    chunks = stream_chunks(
        shared_sim_fleet.urls[NEW],
        max_tokens=300,
        extra_body={"return_spec_tokens_details": True},
        stream_options={"include_usage": True},
    )
    with_ext = [chunk for chunk in chunks if "sglext" in (chunk.model_extra or {})]
    assert len(with_ext) == 1 and with_ext[0].choices == []
    usage = next(chunk.usage for chunk in chunks if chunk.usage is not None)
    details = with_ext[0].model_extra["sglext"]["spec_tokens_details"]
    assert details["spec_accept_length"] == pytest.approx(usage.completion_tokens / details["spec_verify_ct"])


def test_async_client_concurrent_requests_are_deterministic(shared_sim_fleet):
    urls = shared_sim_fleet.urls
    prompts = [
        [{"role": "user", "content": f"Question number {i}: name a prime above {10 * i}."}] for i in range(6)
    ]

    async def run() -> list[list[tuple]]:
        clients = [AsyncOpenAI(base_url=f"{u}/v1", api_key="EMPTY", max_retries=0, timeout=30) for u in urls]
        try:

            async def one(c: AsyncOpenAI, messages) -> tuple:
                reply = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=600)
                message = reply.choices[0].message
                return (reasoning_of(message), message.content, reply.usage.completion_tokens)

            return [list(await asyncio.gather(*(one(c, p) for p in prompts))) for c in clients]
        finally:
            for c in clients:
                await c.close()

    per_server = asyncio.run(run())
    assert per_server[0] == per_server[1] == per_server[2]  # same prompt → same completion on every server
    assert len({answer for answer in per_server[0]}) == len(prompts)  # different prompts differ
    sync = ask(urls[0], prompts[3], max_tokens=600).choices[0].message
    assert (reasoning_of(sync), sync.content) == per_server[0][3][:2]


def test_async_streaming(shared_sim_fleet, full_reply):
    async def run() -> tuple[str, str, list]:
        c = AsyncOpenAI(
            base_url=f"{shared_sim_fleet.urls[NEW]}/v1", api_key="EMPTY", max_retries=0, timeout=30
        )
        try:
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=USER,
                max_tokens=8192,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
        finally:
            await c.close()
        return joined(chunks, "reasoning"), joined(chunks, "content"), chunks

    reasoning, content, chunks = asyncio.run(run())
    assert reasoning == reasoning_of(full_reply.choices[0].message)
    assert content == full_reply.choices[0].message.content
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full_reply.usage.completion_tokens
    )


def test_request_past_the_context_window_is_a_400(shared_sim_fleet):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        ask(shared_sim_fleet.urls[NEW], max_tokens=300_000)
