"""ServerClient.stream_chat (SSE decoded by draftgen's own decoder) reads what the openai SDK's own stream
reader reads, and classifies failures."""

from __future__ import annotations

import asyncio

import pytest

from draftgen.client import introspect
from draftgen.client.errors import RequestError
from draftgen.client.server import ServerClient
from draftgen.client.stream import ChatAccumulator
from draftgen.params import SamplingParams

MODEL = "Qwen/Qwen3.6-27B"
MESSAGES = [{"role": "user", "content": "Name three prime numbers."}]
SAMPLING = SamplingParams(max_tokens=200)


async def _both(url: str) -> tuple:
    """The same request read by ``stream_chat`` and, as an independent reading, by the SDK's own streaming."""
    async with ServerClient(url) as client:
        await introspect.probe(client, MODEL, SAMPLING)
        raw = await client.stream_chat(MESSAGES, SAMPLING, MODEL)
        answer = ChatAccumulator(client.url, stream=True)
        request = client.request_kwargs(MESSAGES, SAMPLING, MODEL, stream=True)
        async with await client.openai.chat.completions.create(**request) as chunks:
            async for chunk in chunks:
                answer.add_chunk(chunk.model_dump(warnings=False))
        return raw, answer.result()


def test_raw_stream_reads_what_the_sdk_reads(sim_fleet):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=50.0)
    raw, sdk = asyncio.run(_both(fleet.urls[0]))
    for name in ("reasoning_content", "content", "finish_reason", "prompt_tokens", "completion_tokens"):
        assert getattr(raw, name) == getattr(sdk, name), name
    assert raw.spec_verify_ct == sdk.spec_verify_ct and raw.spec_accept_length == sdk.spec_accept_length
    assert raw.usage_reported and raw.done_sentinel is True
    assert len(raw.chunk_offsets) == len(sdk.chunk_offsets) and raw.ttft_s <= raw.latency_s


def test_missing_usage_and_done_are_tolerated_and_visible(sim_fleet):
    fleet = sim_fleet(servers=1, profile="instant", faults=["omit_usage=true", "omit_done=true"])

    async def go():
        async with ServerClient(fleet.urls[0]) as client:
            return await client.stream_chat(MESSAGES, SAMPLING, MODEL)

    result = asyncio.run(go())
    assert result.finish_reason in ("stop", "length") and result.reasoning_content
    assert (result.usage_reported, result.completion_tokens, result.done_sentinel) == (False, None, False)


def test_failures_raise_classified_request_errors(sim_fleet):
    fleet = sim_fleet(servers=1, profile="instant", faults=["error_rate=1.0"])

    async def go(url):
        async with ServerClient(url, timeout_s=5) as client:
            return await client.stream_chat(MESSAGES, SAMPLING, MODEL)

    with pytest.raises(RequestError) as caught:
        asyncio.run(go(fleet.urls[0]))
    assert (caught.value.kind, caught.value.status, caught.value.retryable) == ("http", 500, True)
    assert "injected" in caught.value.message
    with pytest.raises(RequestError) as caught:
        asyncio.run(go("http://127.0.0.1:9"))  # nothing listens on the discard port
    assert caught.value.kind == "connection"


# SGLang 0.5.23's own non-streamed answer (recorded from the real server in the SGLang tier): its `metadata` holds
# a list, where the openai SDK's model declares `metadata: dict[str, str]`.
SGLANG_0_5_23_ANSWER = {
    "id": "c77c91fd6fd340ad9e4f2464702076ef",
    "object": "chat.completion",
    "created": 1796120062,
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "The answer is forty-two.",
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": "stop",
            "matched_stop": 151645,
        }
    ],
    "usage": {
        "prompt_tokens": 13,
        "total_tokens": 20,
        "completion_tokens": 7,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    },
    "metadata": {
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": 7}],
    },
}


def test_sglangs_answer_metadata_reads_without_a_warning():
    """Every non-streamed SGLang answer used to print a pydantic serializer warning into the notebook."""
    import warnings

    from aiohttp import web

    async def answer(_request: web.Request) -> web.Response:
        return web.json_response(SGLANG_0_5_23_ANSWER)

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with ServerClient(f"http://127.0.0.1:{port}") as client:
                return await client.chat(MESSAGES, SAMPLING, "tiny")
        finally:
            await runner.cleanup()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = asyncio.run(go())
    assert result.content == "The answer is forty-two." and result.completion_tokens == 7
    assert [str(w.message) for w in caught] == []
