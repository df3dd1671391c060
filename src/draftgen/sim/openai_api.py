"""The simulated server's OpenAI surface: ``/v1/models`` and ``/v1/chat/completions`` (plain and SSE).

``n > 1`` (not streamed) is served as SGLang 0.5.23 serves it (``TokenizerManager._handle_batch_request``): the
prompt is first sent alone with ``max_new_tokens=0`` to cache its prefix, and once that is done, ``n`` copies of
the request, each a request of its own sampled apart, answer as choices ``0..n-1`` of one reply whose usage counts
the prompt once and sums the completions (``UsageProcessor.calculate_response_usage``).

``tools`` are rendered into the prompt by the chat template, as SGLang renders them, and an assistant message's
tool-call arguments given as JSON strings are parsed to objects first (SGLang 0.5.23's
``normalize_assistant_tool_call_arguments``: not a JSON object → 400). An answer that ends in tool calls
(``draftgen.sim.toolcalls``) returns them in ``message.tool_calls`` / ``delta.tool_calls`` with ``finish_reason``
``"tool_calls"`` when the server was started with a parser that reads them, and as text in ``content`` otherwise.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from draftgen.sim.categories import classify
from draftgen.sim.engine import SimRequest
from draftgen.sim.logprobs import ServerLogprobs, asked_top
from draftgen.sim.temperature import temperature_of
from draftgen.sim.textgen import request_seed
from draftgen.sim.toolcalls import call_id
from draftgen.sim.wire import BadRequest, sse

if TYPE_CHECKING:
    from draftgen.sim.core import SimServer

Finish = tuple[str | None, int | None]  # a chunk's finish_reason and matched_stop


class OpenAIApi:
    def __init__(self, sim: SimServer):
        self.sim = sim
        self._logprobs = ServerLogprobs(sim.tokenizer)

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
        parsed = await self.sim.arrive(http, self._parse_chat, "chat")
        if isinstance(parsed, web.Response):
            return parsed
        if parsed["n"] > 1:
            return await self._parallel(parsed)
        request = self.sim.queue(parsed, "chat")
        if parsed["stream"]:
            return await self._stream_chat(http, request, parsed)
        await self.sim.wait_for(request)
        return web.json_response(self._chat_body([request], parsed))

    async def _parallel(self, parsed: dict) -> web.Response:
        """``n > 1``: the prompt prefilled alone first (a prefill-only request, kind ``prefill``), then ``n``
        copies queued together, each drawn from its own seed (SGLang uses a request's seed only with
        ``--enable-deterministic-inference``, so its copies are independent draws)."""
        warm_up = self.sim.queue(parsed, "prefill", rid=f"{parsed['rid']}-prefill", prefill_only=True)
        await self.sim.wait_for(warm_up)
        copies = [
            self.sim.queue(parsed, "chat", rid=f"{parsed['rid']}-{i}", seed=request_seed(parsed["seed"], i))
            for i in range(parsed["n"])
        ]
        await self.sim.wait_for(*copies)
        return web.json_response(self._chat_body(copies, parsed))

    def _parse_chat(self, body: object, headers: Mapping[str, str]) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("Messages cannot be empty.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise BadRequest(f"messages[{index}] must be an object with a 'role'.")
        n = body.get("n")
        n = 1 if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadRequest(f"n must be a positive integer, got {n!r}")
        if n > 1 and body.get("stream"):
            raise BadRequest("draftgen sim supports n > 1 without streaming only.")
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = bool(kwargs.get("enable_thinking", True)) if isinstance(kwargs, dict) else True
        tools = _tools(body.get("tools"))
        tokenizer = self.sim.tokenizer
        try:
            prompt_ids = tokenizer.encode(tokenizer.render(_rendered(messages), thinking, tools))
        except BadRequest:
            raise
        except Exception as exc:  # a template error is the client's request, as in SGLang
            raise BadRequest(f"the chat template could not render these messages: {exc}") from exc
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = self.sim.max_tokens(body.get(max_key), len(prompt_ids), max_key)
        stream_options = body.get("stream_options") or {}
        seed_payload = {"messages": messages, "thinking": thinking}
        if tools:
            seed_payload["tools"] = tools  # a prompt offered other tools is another prompt
        seed = request_seed(seed_payload, body.get("seed"))
        return {
            "rid": str(body.get("rid") or uuid.uuid4().hex),
            "n": n,
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
            "seed": seed,
            "top_logprobs": asked_top(body),  # None: no logprobs asked for
            "calls": self.sim.plan_calls(tools, messages, seed),
            "ignore_eos": bool(body.get("ignore_eos")),
            "category": classify(messages, tools),
            "temperature": temperature_of(body),
        }

    def _call_start(self, request: SimRequest) -> int | None:
        """Where the answer's tool calls begin, when the server's parser takes them out of the text."""
        plan = request.plan
        return plan.call_start if plan.calls and self.sim.parses_tool_calls else None

    def _tool_calls(self, request: SimRequest) -> list[dict]:
        """The answer's calls as the parser returns them, once they are whole (every token shown)."""
        if self._call_start(request) is None or request.shown_tokens < len(request.plan.ids):
            return []
        return [call.as_openai(call_id(request.rid, i), i) for i, call in enumerate(request.plan.calls)]

    def _texts(self, request: SimRequest, parsed: dict, start: int, end: int) -> tuple[str | None, str]:
        """(reasoning_content, content) of shown tokens[start:end], as SGLang's qwen3 parser splits them (without
        the tool calls' text, when the tool-call parser takes it out)."""
        cut = self._call_start(request)
        if cut is not None:
            end = min(end, cut)
            start = min(start, end)
        reasoning, answer = request.plan.split_range(start, end, separate=parsed["separate"])
        if not parsed["thinking"] or not parsed["separate"]:
            return None, answer
        return reasoning, answer

    def _usage(self, requests: Sequence[SimRequest], parsed: dict) -> dict:
        """SGLang 0.5.23's usage: the prompt (and its cached tokens) once, the choices' completions summed;
        reasoning tokens (up to ``</think>``) at the top and in the details, which are null when there are none;
        cached tokens only with ``--enable-cache-report``."""
        first = requests[0]
        completion = sum(r.emitted for r in requests)
        reasoning = sum(r.plan.reasoning_tokens(r.emitted) for r in requests) if parsed["separate"] else 0
        report = self.sim.config.cache.enable_cache_report
        return {
            "prompt_tokens": first.prompt_tokens,
            "total_tokens": first.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens} if report else None,
            "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
        }

    def _finish_reason(self, request: SimRequest) -> tuple[str, int | None]:
        if request.outcome != "ok":
            return "abort", None
        if request.plan.finish_type == "stop":
            if self._tool_calls(request):
                return "tool_calls", None  # SGLang: finish "tool_calls", matched_stop null
            return "stop", request.plan.eos_id
        return "length", None

    def _sglext(self, requests: Sequence[SimRequest], parsed: dict) -> dict | None:
        """The response-level ``sglext`` of 0.5.23 (spec details, a list of them with ``n > 1``, and/or ids), or
        None when nothing was asked for (or a request did not finish: SGLang omits the ids after an abort)."""
        if self.sim.faults.sglang_version != "0.5.23" or any(r.outcome != "ok" for r in requests):
            return None
        sglext: dict[str, object] = {}
        if parsed["spec_details"] and self.sim.profile.speculative:
            details = [self.sim.spec_tokens_details(r) for r in requests]
            sglext["spec_tokens_details"] = details if len(details) > 1 else details[0]
        if parsed["input_ids"]:
            sglext["input_ids"] = parsed["prompt_ids"]
        if parsed["output_ids"]:
            sglext["output_ids"] = [r.plan.output_ids(r.emitted) for r in requests]
        return sglext or None

    @staticmethod
    def _metadata(request: SimRequest) -> dict:
        return {
            "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": request.emitted}],
        }

    def _logprobs_of(self, request: SimRequest, parsed: dict, start: int, end: int) -> dict | None:
        """``{"content": [...]}`` for generated tokens ``start``..``end`` (the stop token included), or None when
        the request did not ask (SGLang sends ``logprobs: null`` then) or there are none."""
        if parsed["top_logprobs"] is None or end <= start:
            return None
        ids = request.plan.output_ids(end)[start:]  # the stop token included
        return self._logprobs.choice(request.seed or 0, ids, start, parsed["top_logprobs"])

    def _choice(self, request: SimRequest, parsed: dict, index: int) -> dict:
        reasoning, content = self._texts(request, parsed, 0, request.shown_tokens)
        finish_reason, matched = self._finish_reason(request)
        message: dict[str, object] = {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning if reasoning is not None else None,
        }
        calls = self._tool_calls(request)
        if calls:  # SGLang's ChatMessage leaves the key out when there are none
            message["tool_calls"] = calls
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs_of(request, parsed, 0, request.emitted),
            "finish_reason": finish_reason,
            "matched_stop": matched,
        }

    def _chat_body(self, requests: Sequence[SimRequest], parsed: dict) -> dict:
        """The reply: one choice per request (``n`` of them), its id and times the first one's, as SGLang's."""
        first = requests[0]
        body: dict[str, object] = {
            "id": first.rid,
            "object": "chat.completion",
            "created": int(first.arrival),
            "model": parsed["model"],
            "choices": [self._choice(r, parsed, i) for i, r in enumerate(requests)],
            "usage": None if self.sim.faults.omit_usage else self._usage(requests, parsed),
            "metadata": self._metadata(first),
        }
        sglext = self._sglext(requests, parsed)
        if sglext is not None:
            body["sglext"] = sglext
        return body

    def _chunk(
        self, request: SimRequest, parsed: dict, delta: dict, finish: Finish, logprobs: dict | None = None
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
                    "logprobs": logprobs,
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
            sent = scored = 0  # tokens shown, and tokens whose logprobs went out
            while True:
                await request.progress.wait()
                request.progress.clear()
                upto = request.shown_tokens
                # a step's logprobs ride on its first text chunk, else on a chunk of their own (SGLang's flush)
                logprobs = self._logprobs_of(request, parsed, scored, request.emitted)
                scored = request.emitted
                if upto > sent:
                    reasoning, content = self._texts(request, parsed, sent, upto)
                    if reasoning:
                        delta = {"reasoning_content": reasoning}
                        await response.write(sse(self._chunk(request, parsed, delta, (None, None), logprobs)))
                        logprobs = None
                    if content:
                        delta = {"reasoning_content": None, "content": content}
                        await response.write(sse(self._chunk(request, parsed, delta, (None, None), logprobs)))
                        logprobs = None
                    for delta in _call_deltas(self._tool_calls(request)):
                        await response.write(sse(self._chunk(request, parsed, delta, (None, None))))
                    sent = upto
                if logprobs is not None:
                    delta = {"reasoning_content": None}
                    await response.write(sse(self._chunk(request, parsed, delta, (None, None), logprobs)))
                if request.done.is_set():
                    break
            finish = self._chunk(request, parsed, {"reasoning_content": None}, self._finish_reason(request))
            await response.write(sse(finish))
            sglext = self._sglext([request], parsed)
            if sglext is not None:
                await response.write(sse(self._tail_chunk(request, parsed, usage=None, sglext=sglext)))
            if parsed["include_usage"] and not self.sim.faults.omit_usage:
                usage = self._usage([request], parsed)
                await response.write(sse(self._tail_chunk(request, parsed, usage=usage)))
        return response


def _tools(value: object) -> list[dict]:
    """The request's ``tools`` (SGLang's ``Tool`` model: objects with ``function.name``), or 400."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in value
    ):
        raise BadRequest("tools must be a list of {'type': 'function', 'function': {'name': ...}} objects.")
    return value


def _rendered(messages: list) -> list:
    """The messages the template renders: assistant tool-call arguments given as JSON strings parsed to objects,
    as SGLang 0.5.23 does before rendering (a string that is not a JSON object is refused)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list):
            out.append(message)
            continue
        message = copy.deepcopy(message)
        for call in message["tool_calls"]:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    arguments = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    raise BadRequest("Assistant tool call function.arguments must be valid JSON.") from None
                if not isinstance(arguments, dict):
                    raise BadRequest("Assistant tool call function.arguments must be a JSON object.")
                function["arguments"] = arguments
        out.append(message)
    return out


def _call_deltas(calls: list[dict]) -> list[dict]:
    """Whole calls as SGLang streams them (``serving_chat.py``: ``_process_tool_call_stream``): per call, a first
    delta with its id and name and empty arguments, then the arguments with id and name null."""
    deltas = []
    for call in calls:
        function = call["function"]
        for first in (True, False):
            piece = {
                "id": call["id"] if first else None,
                "index": call["index"],
                "type": "function",
                "function": {
                    "name": function["name"] if first else None,
                    "arguments": "" if first else function["arguments"],
                },
            }
            deltas.append({"role": None, "content": None, "reasoning_content": None, "tool_calls": [piece]})
    return deltas
