"""The server's own token ids reach ``ChatResult`` from both byte sources: the SDK's body and the decoded stream.

Two small stand-ins speak the two engines' shapes: SGLang 0.5.23 (``return_input_ids_in_sglext`` /
``return_output_ids_in_sglext`` → ``sglext.input_ids`` and ``sglext.output_ids``, a list per choice; streaming, in
the ``choices: []`` sglext chunk) and vLLM 0.32 (``return_token_ids`` → ``prompt_token_ids`` on the body or first
chunk, ``token_ids`` on the choice or per delta). The probe detects which, or none, per server.
"""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from sim_helpers import serve

from draftgen.client import introspect
from draftgen.client.server import ServerClient
from draftgen.params import SamplingParams

PROMPT_IDS = [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]
OUTPUT_IDS = [151667, 198, 32313, 11, 151668, 271, 9707, 13, 151645]
PIECES = [("reasoning_content", "Okay,"), ("reasoning_content", " so"), ("content", "\n\nHello.")]
SPEC = {"spec_verify_ct": 3, "spec_accept_length": 3.0}
MESSAGES = [{"role": "user", "content": "hi"}]
SAMPLING = SamplingParams(max_tokens=16)


def _sse(chunks: list[dict], done: bool = True) -> web.Response:
    lines = [f"data: {json.dumps(c)}" for c in chunks] + (["data: [DONE]"] if done else [])
    return web.Response(text="\n\n".join(lines) + "\n\n", content_type="text/event-stream")


def _envelope(body: dict, **fields) -> dict:
    return {"id": "r1", "object": "chat.completion.chunk", "created": 1, "model": body["model"], **fields}


def sglang_like(seen: list[dict], *, ids: bool = True, refuse_ids: bool = False) -> web.Application:
    """SGLang 0.5.23's shapes; ``ids`` false: an older SGLang that ignores the fields; ``refuse_ids``: one that
    answers 400 to them."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        asked = body.get("return_output_ids_in_sglext")
        if refuse_ids and asked:
            return web.json_response({"object": "error", "message": "unknown field", "code": 400}, status=400)
        sglext: dict = {"spec_tokens_details": SPEC} if body.get("return_spec_tokens_details") else {}
        if ids and asked:
            sglext |= {"input_ids": PROMPT_IDS, "output_ids": [OUTPUT_IDS]}
        usage = {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": len(OUTPUT_IDS), "total_tokens": 18}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "Hello.", "reasoning_content": "Okay, so"}
            reply = {
                "id": "r1",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": message, "finish_reason": "stop", "matched_stop": 151645}
                ],
                "usage": usage,
            }
            if sglext:
                reply["sglext"] = sglext
            return web.json_response(reply)
        chunks = [_envelope(body, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
        chunks += [_envelope(body, choices=[{"index": 0, "delta": {k: v}}], usage=None) for k, v in PIECES]
        chunks.append(_envelope(body, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        if sglext:
            chunks.append(_envelope(body, choices=[], usage=None, sglext=sglext))
        chunks.append(_envelope(body, choices=[], usage=usage))
        return _sse(chunks)

    app = web.Application()
    info = {"version": "0.5.23", "speculative_algorithm": "NGRAM", "internal_states": [{}]}
    app.router.add_get("/server_info", fixed(info))
    app.router.add_get("/health", fixed({}))
    app.router.add_get("/v1/models", fixed({"object": "list", "data": [{"id": "m"}]}))
    app.router.add_post("/v1/chat/completions", chat)
    return app


def vllm_like(seen: list[dict]) -> web.Application:
    """vLLM 0.32's ``return_token_ids``: prompt ids at the top (first chunk only), output ids on the choice."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        asked = body.get("return_token_ids")
        usage = {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": len(OUTPUT_IDS), "total_tokens": 18}
        if not body.get("stream"):
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello.", "reasoning": "Okay, so"},
            }
            choice["finish_reason"] = "stop"
            reply = {"id": "r1", "object": "chat.completion", "created": 1, "model": body["model"]}
            reply |= {"choices": [choice], "usage": usage}
            if asked:
                choice["token_ids"] = OUTPUT_IDS
                reply["prompt_token_ids"] = PROMPT_IDS
            return web.json_response(reply)
        # The output ids cut into per-delta pieces (the last delta carries the stop token).
        cuts = [(0, 3), (3, 4), (4, 8)]
        chunks = []
        for (field, text), (a, b) in zip(PIECES, cuts, strict=True):
            choice = {"index": 0, "delta": {field.replace("_content", ""): text}}
            if asked:
                choice["token_ids"] = OUTPUT_IDS[a:b]
            chunks.append(_envelope(body, choices=[choice]))
        if asked:
            chunks[0]["prompt_token_ids"] = PROMPT_IDS
        last = {"index": 0, "delta": {}, "finish_reason": "stop"} | (
            {"token_ids": OUTPUT_IDS[8:]} if asked else {}
        )
        chunks.append(_envelope(body, choices=[last]))
        chunks.append(_envelope(body, choices=[], usage=usage))
        return _sse(chunks)

    app = web.Application()
    app.router.add_get("/health", fixed({}))
    app.router.add_get("/version", fixed({"version": "0.32.0"}))
    app.router.add_get("/v1/models", fixed({"object": "list", "data": [{"id": "m"}]}))
    app.router.add_post("/v1/chat/completions", chat)
    return app


def fixed(value: object):
    """A GET handler that always answers ``value`` as JSON."""

    async def handler(_: web.Request) -> web.Response:
        return web.json_response(value)

    return handler


def ask(app: web.Application, mode: str):
    async def work(url: str):
        async with ServerClient(url) as client:
            caps = await introspect.probe(client, "m", SAMPLING)
            if mode == "stream_chat":
                result = await client.stream_chat(MESSAGES, SAMPLING, "m")
            else:
                result = await client.chat(MESSAGES, SAMPLING, "m", stream=mode == "chat-stream")
            return caps, result

    return serve(app, work)


@pytest.mark.parametrize("mode", ["sdk-body", "chat-stream", "stream_chat"])
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_ids_reach_the_result_from_every_byte_source(engine, mode):
    seen: list[dict] = []
    app = sglang_like(seen) if engine == "sglang" else vllm_like(seen)
    caps, result = ask(app, mode)
    assert caps.token_ids == ("sglext" if engine == "sglang" else "vllm")
    assert result.prompt_ids == PROMPT_IDS and result.output_ids == OUTPUT_IDS
    assert result.reasoning_content == "Okay, so" and result.content.strip() == "Hello."
    asked = (
        {"return_input_ids_in_sglext", "return_output_ids_in_sglext"}
        if engine == "sglang"
        else {"return_token_ids"}
    )
    assert asked <= set(seen[-1])
    other = {"return_token_ids"} if engine == "sglang" else {"return_output_ids_in_sglext"}
    assert not other & set(seen[-1])  # SGLang refuses its own return_token_ids when streaming: never sent
    if engine == "sglang":
        assert (
            caps.spec_details and result.spec_verify_ct == 3
        )  # the ids share the sglext chunk with the spec details


@pytest.mark.parametrize("mode", ["sdk-body", "stream_chat"])
def test_an_sglang_that_ignores_the_fields_sends_no_ids_and_the_probe_says_so(mode):
    caps, result = ask(sglang_like([], ids=False), mode)
    assert caps.token_ids is None and caps.spec_details
    assert result.prompt_ids is None and result.output_ids is None


def test_an_engine_that_refuses_the_id_fields_keeps_every_other_extra():
    seen: list[dict] = []
    caps, result = ask(sglang_like(seen, refuse_ids=True), "stream_chat")
    assert caps.token_ids is None and caps.spec_details and caps.extra_fields and caps.template_kwargs
    assert "return_output_ids_in_sglext" in seen[0] and "return_output_ids_in_sglext" not in seen[-1]
    assert result.output_ids is None and result.spec_verify_ct == 3


def test_preflight_engine_row_names_the_token_id_source():
    from draftgen.client.records import Capabilities
    from draftgen.generate.preflight import describe_token_ids

    assert (
        describe_token_ids(Capabilities("sglang", token_ids="sglext")) == "token ids from the server (sglext)"
    )
    assert describe_token_ids(Capabilities("openai-compatible")) == (
        "no token ids from openai-compatible: validate re-tokenizes"
    )
