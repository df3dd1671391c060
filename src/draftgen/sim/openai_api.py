"""The simulated server's OpenAI surface: ``/v1/models`` and ``/v1/chat/completions`` (plain and SSE)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from draftgen.sim.categories import classify
from draftgen.sim.engine import SimRequest
from draftgen.sim.temperature import temperature_of
from draftgen.sim.textgen import request_seed
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

    def _parse_chat(self, body: object, headers: Mapping[str, str]) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("Messages cannot be empty.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise BadRequest(f"messages[{index}] must be an object with a 'role'.")
        n = body.get("n") or 1
        if n != 1:
            raise BadRequest("draftgen sim supports n=1 only.")
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = bool(kwargs.get("enable_thinking", True)) if isinstance(kwargs, dict) else True
        tokenizer = self.sim.tokenizer
        try:
            prompt_ids = tokenizer.encode(tokenizer.render(messages, thinking))
        except Exception as exc:  # a template error is the client's request, as in SGLang
            raise BadRequest(f"the chat template could not render these messages: {exc}") from exc
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = self.sim.max_tokens(body.get(max_key), len(prompt_ids), max_key)
        stream_options = body.get("stream_options") or {}
        seed_payload = {"messages": messages, "thinking": thinking}
        return {
            "rid": str(body.get("rid") or uuid.uuid4().hex),
            "model": body.get("model") or self.sim.config.model,
            "prompt_ids": prompt_ids,
            "prompt_tokens": len(prompt_ids),
            "max_tokens": max_tokens,
            "thinking": thinking,
            "separate": body.get("separate_reasoning", True) is not False,
            "stream": bool(body.get("stream")),
            "include_usage": bool(stream_options.get("include_usage"))
            if isinstance(stream_options, dict)
            else False,
            "spec_details": bool(body.get("return_spec_tokens_details")),
            # SGLang 0.5.23: the body fields, or their headers
            "input_ids": bool(body.get("return_input_ids_in_sglext"))
            or headers.get("x-sglext-return-input-ids") == "1",
            "output_ids": bool(body.get("return_output_ids_in_sglext"))
            or headers.get("x-sglext-return-output-ids") == "1",
            "seed": request_seed(seed_payload, body.get("seed")),
            "ignore_eos": bool(body.get("ignore_eos")),
            "category": classify(messages),
            "temperature": temperature_of(body),
        }

    def _texts(self, request: SimRequest, parsed: dict, start: int, end: int) -> tuple[str | None, str]:
        """(reasoning_content, content) of shown tokens[start:end], as SGLang's qwen3 parser splits them."""
        reasoning, answer = request.plan.split_range(start, end, separate=parsed["separate"])
        if not parsed["thinking"] or not parsed["separate"]:
            return None, answer
        return reasoning, answer

    def _usage(self, request: SimRequest, parsed: dict) -> dict:
        """SGLang 0.5.23's usage: reasoning tokens (up to ``</think>``) at the top and in the details, which are
        null when there are none."""
        reasoning = request.plan.reasoning_tokens(request.emitted) if parsed["separate"] else 0
        return {
            "prompt_tokens": request.prompt_tokens,
            "total_tokens": request.prompt_tokens + request.emitted,
            "completion_tokens": request.emitted,
            "prompt_tokens_details": None,
            "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
        }

    def _finish_reason(self, request: SimRequest) -> tuple[str, int | None]:
        if request.outcome != "ok":
            return "abort", None
        if request.plan.finish_type == "stop":
            return "stop", request.plan.eos_id
        return "length", None

    def _sglext(self, request: SimRequest, parsed: dict) -> dict | None:
        """The response-level ``sglext`` of 0.5.23 (spec details and/or ids), or None when nothing was asked for
        (or the request did not finish: SGLang omits the ids after an abort)."""
        if self.sim.faults.sglang_version != "0.5.23" or request.outcome != "ok":
            return None
        sglext: dict[str, object] = {}
        if parsed["spec_details"] and self.sim.profile.speculative:
            sglext["spec_tokens_details"] = self.sim.spec_tokens_details(request)
        if parsed["input_ids"]:
            sglext["input_ids"] = parsed["prompt_ids"]
        if parsed["output_ids"]:
            sglext["output_ids"] = [request.plan.output_ids(request.emitted)]
        return sglext or None

    @staticmethod
    def _metadata(request: SimRequest) -> dict:
        return {
            "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": request.emitted}],
        }

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
                        "content": content,
                        "reasoning_content": reasoning if reasoning is not None else None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "matched_stop": matched,
                }
            ],
            "usage": None if self.sim.faults.omit_usage else self._usage(request, parsed),
            "metadata": self._metadata(request),
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
        }

    def _tail_chunk(self, request: SimRequest, parsed: dict, **fields: object) -> dict:
        """A ``choices: []`` chunk (the sglext one, the usage one)."""
        return {
            "id": request.rid,
            "object": "chat.completion.chunk",
            "created": int(request.arrival),
            "model": parsed["model"],
            "choices": [],
            **fields,
        }

    async def _stream_chat(self, http: web.Request, request: SimRequest, parsed: dict) -> web.StreamResponse:
        """SGLang 0.5.23's stream: the role chunk, reasoning deltas, content deltas (a step that crosses
        ``</think>`` sends one of each), the finish chunk, then ``choices: []`` chunks: sglext, then usage."""
        async with self.sim.event_stream(http, request) as response:
            first = {"reasoning_content": None, "role": "assistant", "content": ""}
            await response.write(sse(self._chunk(request, parsed, first, (None, None))))
            sent = 0
            while True:
                await request.progress.wait()
                request.progress.clear()
                upto = request.shown_tokens
                if upto > sent:
                    reasoning, content = self._texts(request, parsed, sent, upto)
                    if reasoning:
                        delta = {"reasoning_content": reasoning}
                        await response.write(sse(self._chunk(request, parsed, delta, (None, None))))
                    if content:
                        delta = {"reasoning_content": None, "content": content}
                        await response.write(sse(self._chunk(request, parsed, delta, (None, None))))
                    sent = upto
                if request.done.is_set():
                    break
            finish = self._chunk(request, parsed, {"reasoning_content": None}, self._finish_reason(request))
            await response.write(sse(finish))
            sglext = self._sglext(request, parsed)
            if sglext is not None:
                await response.write(sse(self._tail_chunk(request, parsed, usage=None, sglext=sglext)))
            if parsed["include_usage"] and not self.sim.faults.omit_usage:
                usage = self._usage(request, parsed)
                await response.write(sse(self._tail_chunk(request, parsed, usage=usage)))
        return response
