"""The unchanged ServerClient against each real engine: what probe detects, and reasoning/usage in all three modes.

Thinking on here: the random model almost never closes </think>, so a completion is reasoning cut at max_tokens
with an empty answer. That is the case the user's last run got wrong, and where the engines name the reasoning
field differently (vLLM ``reasoning``, transformers serve ``reasoning_content``).
"""

from __future__ import annotations

import asyncio

import pytest
from real_servers import RealServer
from recording_proxy import Exchange, vllm_ids

from draftgen.client import introspect
from draftgen.client.errors import RequestError
from draftgen.client.server import ServerClient
from draftgen.params import SamplingParams

MAX_TOKENS = 12
REQUESTS = 3
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
            caps = await introspect.probe(client, server.model, SamplingParams(max_tokens=MAX_TOKENS))
            return caps, (await introspect.health(client, generate=True)).status

    caps, health = asyncio.run(go())
    engine, extras, template, metrics, listed = EXPECTED[server.engine]
    assert (caps.engine, caps.extra_fields, caps.template_kwargs, caps.metrics) == (
        engine,
        extras,
        template,
        metrics,
    )
    assert caps.spec_details is False  # neither engine returns per-request acceptance
    # vLLM sends the target's own token ids on return_token_ids; transformers serve refuses unknown fields
    assert caps.token_ids == ("vllm" if server.engine == "vllm" else None)
    assert caps.model_ids == ((server.model,) if listed else ())
    assert health == 200  # neither has /health_generate: /health stands in


def test_wrong_model_name_fails_the_probe_with_the_servers_reason(server: RealServer):
    async def go():
        async with ServerClient(server.url, timeout_s=120) as client:
            await introspect.probe(client, server.model + "-typo", SamplingParams(max_tokens=MAX_TOKENS))

    with pytest.raises(RequestError) as failure:
        asyncio.run(go())
    status, says = WRONG_MODEL[server.engine]
    assert failure.value.status == status and says in failure.value.message


def raw_answer(exchange: Exchange) -> tuple[str, str, str | None, dict]:
    """(reasoning, answer, finish_reason, usage) exactly as the server sent them, whatever it names the fields."""
    if not exchange.request_json().get("stream"):
        choice = exchange.response_json()["choices"][0]
        message = choice["message"]
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        return (
            reasoning,
            message.get("content") or "",
            choice["finish_reason"],
            exchange.response_json()["usage"],
        )
    reasoning, content, finish, usage = [], [], None, None
    for event in exchange.sse_events():
        if event == "[DONE]":
            continue
        usage = event.get("usage") or usage
        for choice in event["choices"]:
            delta = choice.get("delta") or {}
            reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
            content.append(delta.get("content") or "")
            finish = choice.get("finish_reason") or finish
    return "".join(reasoning), "".join(content), finish, usage


@pytest.mark.parametrize("mode", ["plain", "chat-stream", "stream_chat"])
def test_reasoning_answer_and_usage_read_as_the_server_sent_them(
    server: RealServer, mode: str, recording_proxy
):
    """Thinking on, sampled: each answer is compared field by field with the raw bytes the server sent.

    A sampled token may close </think> or end the turn early (about 1 in 1,000 per token for this model), so
    the split is not assumed, it is read from the server; three requests make sure some reasoning was there
    to lose.
    """
    proxy = recording_proxy(server)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, enable_thinking=True)
    messages = [{"role": "user", "content": "Count from one to ten."}]

    async def go() -> list:
        async with ServerClient(proxy.url, timeout_s=120) as client:
            await introspect.probe(client, server.model, sampling)
            results = []
            for _ in range(REQUESTS):
                if mode == "stream_chat":
                    results.append(await client.stream_chat(messages, sampling, server.model))
                else:
                    stream = mode == "chat-stream"
                    results.append(await client.chat(messages, sampling, server.model, stream=stream))
            return results

    results = asyncio.run(go())
    answers = [raw_answer(e) for e in proxy.chats()[-REQUESTS:]]
    for result, (reasoning, content, finish, usage) in zip(results, answers, strict=True):
        assert (result.reasoning_content or "", result.content or "") == (reasoning, content)
        assert result.finish_reason == finish
        assert result.usage_reported
        assert (result.prompt_tokens, result.completion_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
    for result, exchange in zip(results, proxy.chats()[-REQUESTS:], strict=True):
        if server.engine != "vllm":
            assert result.prompt_ids is None and result.output_ids is None
            continue
        prompt, output = vllm_ids(exchange)
        assert (result.prompt_ids, result.output_ids) == (prompt, output)
        assert len(output) == result.completion_tokens and len(prompt) == result.prompt_tokens
    assert any(reasoning.strip() for reasoning, *_ in answers), "the server separated no reasoning at all"
