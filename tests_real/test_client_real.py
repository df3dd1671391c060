"""The unchanged ServerClient against each real engine: what probe detects, and reasoning/usage in all three modes.

Thinking on here: the random model never closes </think>, so every completion is reasoning cut at max_tokens and
the answer is empty. That is the case the user's last run got wrong, and where the engines name the reasoning
field differently (vLLM ``reasoning``, transformers serve ``reasoning_content``).
"""

from __future__ import annotations

import asyncio

import pytest
from real_servers import RealServer

from draftgen.client import RequestError, ServerClient
from draftgen.params import SamplingParams

MAX_TOKENS = 12
EXPECTED = {
    # engine, accepts sampling extras, accepts chat_template_kwargs, /metrics, model list
    "vllm": ("vllm", True, True, True, True),
    "transformers": ("openai-compatible", False, True, False, False),
}

# What each engine answers to a model name it does not serve (vLLM hides paths as `<path>` in its message).
WRONG_MODEL = {"vllm": (404, "does not exist"), "transformers": (400, "Server is pinned to")}


@pytest.fixture(params=["vllm", "transformers"])
def server(request, real_servers: dict[str, RealServer]) -> RealServer:
    return real_servers[request.param]


def test_probe_detects_what_each_engine_accepts(server: RealServer):
    async def go():
        async with ServerClient(server.url, timeout_s=120) as client:
            caps = await client.probe(server.model, SamplingParams(max_tokens=MAX_TOKENS))
            return caps, await client.health(generate=True)

    caps, health = asyncio.run(go())
    engine, extras, template, metrics, listed = EXPECTED[server.engine]
    assert (caps.engine, caps.extra_fields, caps.template_kwargs, caps.metrics) == (
        engine,
        extras,
        template,
        metrics,
    )
    assert caps.spec_details is False  # neither engine returns per-request acceptance
    assert caps.model_ids == ((server.model,) if listed else ())
    assert health == 200  # neither has /health_generate: /health stands in


def test_wrong_model_name_fails_the_probe_with_the_servers_reason(server: RealServer):
    async def go():
        async with ServerClient(server.url, timeout_s=120) as client:
            await client.probe(server.model + "-typo", SamplingParams(max_tokens=MAX_TOKENS))

    with pytest.raises(RequestError) as failure:
        asyncio.run(go())
    status, says = WRONG_MODEL[server.engine]
    assert failure.value.status == status and says in failure.value.message


@pytest.mark.parametrize("mode", ["plain", "sdk-stream", "raw-stream"])
def test_reasoning_and_usage_in_every_mode(server: RealServer, mode: str, recording_proxy):
    proxy = recording_proxy(server)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, enable_thinking=True)
    messages = [{"role": "user", "content": "Count from one to ten."}]

    async def go():
        async with ServerClient(proxy.url, timeout_s=120) as client:
            await client.probe(server.model, sampling)
            if mode == "raw-stream":
                return await client.stream_chat(messages, sampling, server.model)
            return await client.chat(messages, sampling, server.model, stream=mode == "sdk-stream")

    result = asyncio.run(go())
    exchange = proxy.chats()[-1]
    if mode == "plain":
        usage = exchange.response_json()["usage"]
    else:
        usage = [e["usage"] for e in exchange.sse_events() if isinstance(e, dict) and e.get("usage")][-1]
    assert (result.prompt_tokens, result.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert result.usage_reported and result.completion_tokens == MAX_TOKENS
    assert result.finish_reason == "length"
    assert not (result.content or "").strip(), "thinking never closed: there is no answer"
    assert result.reasoning_content, "the reasoning was lost"
