"""The simulated server's OpenAI surface: ``/v1/models`` and ``/v1/chat/completions`` (plain and SSE)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from aiohttp import web

from draftgen.sim.engine import SimRequest
from draftgen.sim.textgen import EOS_TOKEN_ID, count_text_tokens, render_chat_prompt, request_seed
from draftgen.sim.wire import BadRequest, sse

if TYPE_CHECKING:
    from draftgen.sim.server import SimServer


class OpenAIApi:
    def __init__(self, sim: SimServer):
        self.sim = sim

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.post("/v1/chat/completions", self.chat_completions),
        ]

    async def models(self, _: web.Request) -> web.Response:
        model = self.sim.config.model
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": int(self.sim.started),
                        "owned_by": "sglang",
                        "root": model,
                        "parent": None,
                        "max_model_len": self.sim.profile.context_length,
                    }
                ],
            }
        )

    async def chat_completions(self, http: web.Request) -> web.StreamResponse:
        accepted = await self.sim.accept(http, self._parse_chat, "chat")
        if isinstance(accepted, web.Response):
            return accepted
        parsed, request = accepted
        if parsed["stream"]:
            return await self._stream_chat(http, request, parsed)
        await self.sim.wait_for(request)
        return web.json_response(self._chat_body(request, parsed))

    def _parse_chat(self, body: object) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise BadRequest(f"messages[{index}] must be an object with a 'role'.")
        n = body.get("n") or 1
        if n != 1:
            raise BadRequest("draftgen sim supports n=1 only.")
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = bool(kwargs.get("enable_thinking", True)) if isinstance(kwargs, dict) else True
        prompt_tokens = count_text_tokens(render_chat_prompt(messages, thinking))
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = self.sim.max_tokens(body.get(max_key), prompt_tokens, max_key)
        stream_options = body.get("stream_options") or {}
        seed_payload = {"messages": messages, "thinking": thinking}
        return {
            "rid": str(body.get("rid") or uuid.uuid4().hex),
            "model": body.get("model") or self.sim.config.model,
            "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "thinking": thinking,
            "separate": body.get("separate_reasoning", True) is not False,
            "stream": bool(body.get("stream")),
            "include_usage": bool(stream_options.get("include_usage"))
            if isinstance(stream_options, dict)
            else False,
            "spec_details": bool(body.get("return_spec_tokens_details")),
            "seed": request_seed(seed_payload, body.get("seed")),
            "ignore_eos": bool(body.get("ignore_eos")),
        }

    def _texts(self, request: SimRequest, parsed: dict, start: int, end: int) -> tuple[str | None, str]:
        """(reasoning_content, content) of shown tokens[start:end], as SGLang's qwen3 parser splits them."""
        reasoning, answer = request.plan.split_range(start, end, separate=parsed["separate"])
        if not parsed["thinking"] or not parsed["separate"]:
            return None, answer
        return reasoning, answer

    def _usage(self, request: SimRequest) -> dict:
        return {
            "prompt_tokens": request.prompt_tokens,
            "completion_tokens": request.emitted,
            "total_tokens": request.prompt_tokens + request.emitted,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    def _finish_reason(self, request: SimRequest) -> tuple[str, int | None]:
        if request.outcome != "ok":
            return "abort", None
        if request.plan.finish_type == "stop":
            return "stop", EOS_TOKEN_ID
        return "length", None

    def _sglext(self, request: SimRequest, parsed: dict) -> dict | None:
        if not (
            parsed["spec_details"]
            and self.sim.profile.speculative
            and self.sim.faults.sglang_version == "0.5.23"
        ):
            return None
        if request.outcome != "ok":
            return None
        return {"spec_tokens_details": self.sim.spec_fields(request, "0.5.23")}

    def _chat_body(self, request: SimRequest, parsed: dict) -> dict:
        reasoning, content = self._texts(request, parsed, 0, request.shown_tokens)
        finish_reason, matched = self._finish_reason(request)
        body: dict[str, object] = {
            "id": request.rid,
            "object": "chat.completion",
            "created": int(request.arrival),
            "model": parsed["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content or None,
                        "reasoning_content": reasoning or None,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "matched_stop": matched,
                }
            ],
            "usage": None if self.sim.faults.omit_usage else self._usage(request),
            "metadata": {"weight_version": "default"},
        }
        sglext = self._sglext(request, parsed)
        if sglext is not None:
            body["sglext"] = sglext
        return body

    def _chunk(
        self, request: SimRequest, parsed: dict, delta: dict, finish: tuple[str | None, int | None]
    ) -> dict:
        return {
            "id": request.rid,
            "object": "chat.completion.chunk",
            "created": int(request.arrival),
            "model": parsed["model"],
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish[0],
                    "matched_stop": finish[1],
                }
            ],
            "usage": None,
        }

    async def _stream_chat(self, http: web.Request, request: SimRequest, parsed: dict) -> web.StreamResponse:
        async with self.sim.event_stream(http, request) as response:
            await response.write(
                sse(self._chunk(request, parsed, {"role": "assistant", "content": ""}, (None, None)))
            )
            sent = 0
            while True:
                await request.progress.wait()
                request.progress.clear()
                upto = request.shown_tokens
                if upto > sent:
                    reasoning, content = self._texts(request, parsed, sent, upto)
                    delta: dict[str, object] = {}
                    if reasoning:
                        delta["reasoning_content"] = reasoning
                    if content:
                        delta["content"] = content
                    if delta:
                        delta.setdefault("content", None)
                        await response.write(sse(self._chunk(request, parsed, delta, (None, None))))
                    sent = upto
                if request.done.is_set():
                    break
            await response.write(sse(self._chunk(request, parsed, {}, self._finish_reason(request))))
            if parsed["include_usage"] and not self.sim.faults.omit_usage:
                usage_chunk = self._chunk(request, parsed, {}, (None, None))
                usage_chunk["choices"] = []
                usage_chunk["usage"] = self._usage(request)
                await response.write(sse(usage_chunk))
            sglext = self._sglext(request, parsed)
            if sglext is not None:
                ext_chunk = self._chunk(request, parsed, {}, (None, None))
                ext_chunk["choices"] = []
                ext_chunk["sglext"] = sglext
                await response.write(sse(ext_chunk))
        return response
