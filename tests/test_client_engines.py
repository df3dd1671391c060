"""ServerClient against small stand-ins for vLLM and transformers serve, shaped like what the real servers sent.

The shapes were recorded from vLLM 0.32.0 (CPU build, n-gram speculation, qwen3 reasoning parser) and
transformers serve 5.19.0 by the real-server tier (tests_real/, ``make test-real``), which checks the same
behaviour against the real engines. Here it runs in milliseconds inside ``make test``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from sim_helpers import serve

from draftgen.client import introspect
from draftgen.client.errors import RequestError
from draftgen.client.server import ServerClient
from draftgen.params import SamplingParams

OPENAI_FIELDS = {"model", "messages", "max_tokens", "temperature", "top_p", "stream", "stream_options"}


def _reply(body: dict, reasoning_field: str, usage_on_finish: bool, done: bool) -> web.Response:
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    if not body.get("stream"):
        message = {"role": "assistant", "content": None, reasoning_field: "abc"}
        return web.json_response(
            {
                "id": "r1",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
                "usage": usage,
            }
        )
    chunks = [{"choices": [{"index": 0, "delta": {reasoning_field: piece}}]} for piece in ("a", "b", "c")]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    if usage_on_finish:
        chunks[-1]["usage"] = usage
    else:
        chunks.append({"choices": [], "usage": usage})
    lines = [
        "data: "
        + json.dumps(
            {"id": "r1", "object": "chat.completion.chunk", "created": 1, "model": body["model"], **c}
        )
        for c in chunks
    ]
    if done:
        lines.append("data: [DONE]")
    return web.Response(text="\n\n".join(lines) + "\n\n", content_type="text/event-stream")


def fixed(make: Callable[[], web.Response]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A GET handler that always gives the same answer."""

    async def handler(request: web.Request) -> web.Response:
        return make()

    return handler


def vllm_like(seen: list[dict]) -> web.Application:
    """vLLM 0.32: reasoning in ``reasoning``; min_p refused with speculative decoding; usage chunk + [DONE]."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if "min_p" in body:
            message = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        return _reply(body, "reasoning", usage_on_finish=False, done=True)

    app = web.Application()
    app.router.add_get("/health", fixed(lambda: web.Response(text="")))
    app.router.add_get("/version", fixed(lambda: web.json_response({"version": "0.32.0"})))
    app.router.add_get(
        "/metrics",
        fixed(
            lambda: web.Response(
                text="# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 3.0\n"
            )
        ),
    )
    app.router.add_get(
        "/v1/models", fixed(lambda: web.json_response({"object": "list", "data": [{"id": "m"}]}))
    )
    app.router.add_post("/v1/chat/completions", chat)
    return app


def transformers_like(seen: list[dict], template_kwargs: bool = True) -> web.Application:
    """transformers serve 5.19: 422 on fields it does not know; /v1/models 500; usage on the finish chunk."""
    allowed = OPENAI_FIELDS | ({"chat_template_kwargs"} if template_kwargs else set())

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        unexpected = set(body) - allowed
        if unexpected:
            return web.json_response(
                {"detail": f"Unexpected fields in the request: {unexpected}"}, status=422
            )
        return _reply(body, "reasoning_content", usage_on_finish=True, done=False)

    app = web.Application()
    app.router.add_get("/health", fixed(lambda: web.json_response({"status": "ok"})))
    app.router.add_get("/v1/models", fixed(lambda: web.Response(status=500, text="Internal Server Error")))
    app.router.add_post("/v1/chat/completions", chat)
    return app


def probe(url: str, sampling: SamplingParams):
    async def go():
        async with ServerClient(url) as client:
            return await introspect.probe(client, "m", sampling), client

    return go()


@pytest.mark.parametrize("min_p", [None, 0.05])
def test_vllm_probe_steps_back_only_when_a_sampling_extra_is_refused(min_p):
    seen: list[dict] = []
    caps, _ = serve(vllm_like(seen), lambda url: probe(url, SamplingParams(min_p=min_p)))
    assert caps.engine == "vllm" and caps.version == "0.32.0" and caps.metrics
    assert caps.template_kwargs and caps.extra_fields is (min_p is None)
    assert not caps.spec_details  # no sglext in its answers
    assert (
        "chat_template_kwargs" in seen[-1] and "min_p" not in seen[-1] if min_p else "min_p" not in seen[-1]
    )


def test_transformers_probe_keeps_enable_thinking_but_drops_sampling_extras():
    seen: list[dict] = []

    async def work(url: str):
        async with ServerClient(url) as client:
            sampling = SamplingParams(top_k=20, enable_thinking=False)
            caps = await introspect.probe(client, "m", sampling)
            result = await client.chat([{"role": "user", "content": "hi"}], sampling, "m")
            return caps, result

    caps, result = serve(transformers_like(seen), work)
    assert caps.engine == "openai-compatible" and caps.model_ids == ()  # /v1/models answered 500
    assert caps.template_kwargs and not caps.extra_fields
    assert seen[0].keys() >= {"top_k", "return_spec_tokens_details"}  # the refused first try
    assert seen[-1]["chat_template_kwargs"] == {"enable_thinking": False} and "top_k" not in seen[-1]
    assert result.reasoning_content == "abc" and result.prompt_tokens == 7


def test_a_server_refusing_chat_template_kwargs_gets_plain_openai_fields():
    seen: list[dict] = []
    caps, _ = serve(transformers_like(seen, template_kwargs=False), lambda url: probe(url, SamplingParams()))
    assert not caps.template_kwargs and not caps.extra_fields
    assert set(seen[-1]) <= OPENAI_FIELDS and len(seen) == 3


@pytest.mark.parametrize("mode", ["plain", "chat-stream", "stream_chat"])
@pytest.mark.parametrize("engine", ["vllm", "transformers"])
def test_reasoning_usage_and_done_in_each_engines_shape(engine, mode):
    app = vllm_like([]) if engine == "vllm" else transformers_like([])

    async def work(url: str):
        async with ServerClient(url) as client:
            sampling = SamplingParams(max_tokens=3)
            await introspect.probe(client, "m", sampling)
            messages = [{"role": "user", "content": "hi"}]
            if mode == "stream_chat":
                return await client.stream_chat(messages, sampling, "m")
            return await client.chat(messages, sampling, "m", stream=mode == "chat-stream")

    result = serve(app, work)
    assert result.reasoning_content == "abc" and not result.content
    assert (result.prompt_tokens, result.completion_tokens, result.finish_reason) == (7, 3, "length")
    if mode != "plain":
        assert result.done_sentinel is (engine == "vllm")


def test_health_generate_falls_back_to_health_and_errors_quote_detail():
    async def work(url: str):
        async with ServerClient(url) as client:
            health = (await introspect.health(client, generate=True)).status
            with pytest.raises(RequestError) as refused:
                await client.chat(
                    [{"role": "user", "content": "hi"}], SamplingParams(top_k=5), "m"
                )  # capabilities unknown yet: extras are sent, and refused
            return health, refused.value

    health, error = serve(transformers_like([]), work)
    assert health == 200
    assert error.status == 422 and error.message.startswith("Unexpected fields in the request")


@pytest.mark.parametrize("stream", [False, True])
def test_a_gateway_gets_a_routing_key_per_conversation_and_a_server_none(stream: bool) -> None:
    """SMG pins requests that share ``x-smg-routing-key`` to one worker (with --routing-key-override): every turn of
    a conversation and every sample of a prompt carry the same key, another prompt another; SGLang gets none."""
    from draftgen.client.records import Capabilities
    from draftgen.client.server import ROUTING_KEY_HEADER

    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get(ROUTING_KEY_HEADER))
        return _reply(await request.json(), "reasoning_content", usage_on_finish=False, done=True)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"}]
    later = [*first, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    other = [{"role": "user", "content": "another prompt"}]

    async def work(url: str) -> None:
        for engine in ("smg", "sglang"):
            async with ServerClient(url, capabilities=Capabilities(engine)) as client:
                for messages in (first, later, first, other):
                    await client.chat(messages, SamplingParams(), "m", stream=stream)

    serve(app, work)
    keyed, plain = seen[:4], seen[4:]
    assert keyed[0] and keyed[0] == keyed[1] == keyed[2] != keyed[3] and keyed[3]
    assert plain == [None] * 4
