"""One accumulator for a chat answer, whichever way it arrives.

An answer reaches us as a whole JSON body (non-streaming, through the openai SDK) or as SSE events decoded from the
stream's bytes (``sse.SseDecoder``). Both hand plain dicts to ``ChatAccumulator``, so the engines' differences — the reasoning field's name, ``choices: []`` chunks carrying usage or ``sglext``, usage on the finish
chunk, a missing ``[DONE]``, the token ids (SGLang's ``sglext.input_ids`` / ``sglext.output_ids``, vLLM's
``prompt_token_ids`` / ``choices[].token_ids``), the tool calls (whole in ``message.tool_calls``, or streamed in
OpenAI's incremental shape, as SGLang 0.5.23's ``serving_chat.py`` sends them: per call ``index``, a first delta with
``id`` and ``function.name``, then ``function.arguments`` pieces with both null) — are read in one place and
``ChatResult`` is built once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from draftgen.client.entropy import EntropySummary
from draftgen.client.errors import RequestError
from draftgen.client.loops import REPETITION_LOOP, LoopRule, TextLoop, TextLoopCheck
from draftgen.client.records import ChatResult, LoopEnd
from draftgen.client.sse import SseEvent
from draftgen.training.tools import target_calls

# The separated reasoning text: SGLang and transformers serve name it reasoning_content, vLLM (0.10 and later)
# reasoning.
REASONING_FIELDS = ("reasoning_content", "reasoning")
DONE = "[DONE]"  # the data of the event that ends an OpenAI stream (transformers serve sends none)


def reasoning_of(message: Mapping[str, Any] | None) -> str | None:
    """The reasoning text of a message or delta, whichever field name the engine uses."""
    if not message:
        return None
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str):
            return value
    return None


def _spec_details(sglext: Any) -> dict[str, Any] | None:
    """The first choice's ``sglext.spec_tokens_details`` (a list of them when n > 1), or None."""
    if not isinstance(sglext, dict):
        return None
    details = sglext.get("spec_tokens_details")
    if isinstance(details, list):
        details = details[0] if details else None
    return details if isinstance(details, dict) else None


def spec_from_sglext(sglext: Any) -> tuple[float | None, int | None]:
    """(accept length, verify steps) of SGLang's per-request ``sglext.spec_tokens_details`` (a list when n > 1)."""
    details = _spec_details(sglext)
    if details is None:
        return None, None
    length, verify = details.get("spec_accept_length"), details.get("spec_verify_ct")
    return (float(length) if length is not None else None), (int(verify) if verify is not None else None)


def drafts_histogram_of(sglext: Any) -> list[int] | None:
    """SGLang 0.5.23's ``spec_correct_drafts_histogram``: element k counts the request's verify steps that accepted
    exactly k drafts (the bonus token not counted), as long as the largest k seen + 1. None when the server sent
    none, or something else (an empty list: the request had no verify step)."""
    details = _spec_details(sglext)
    return _int_list(details.get("spec_correct_drafts_histogram")) if details is not None else None


def cached_of(usage: Mapping[str, Any] | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``: what SGLang 0.5.23 sends, with ``--enable-cache-report``,
    in a whole answer's usage and in a stream's usage chunk (without the flag the details are null)."""
    details = usage.get("prompt_tokens_details") if usage else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if type(cached) is int else None


def _int_list(value: Any) -> list[int] | None:
    """A list of ints (token ids, counts) as sent, or None for anything else (an engine that sends none, or a
    malformed field)."""
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return None


def ids_from_sglext(sglext: Any) -> tuple[list[int] | None, list[int] | None]:
    """(prompt ids, first choice's output ids) of SGLang's ``sglext.input_ids`` / ``sglext.output_ids`` (a list per
    choice)."""
    if not isinstance(sglext, dict):
        return None, None
    outputs = sglext.get("output_ids")
    first = outputs[0] if isinstance(outputs, list) and outputs else None
    return _int_list(sglext.get("input_ids")), _int_list(first)


class ChatAccumulator:
    """Folds one answer — a whole body, or its stream's events in order — into a ``ChatResult``.

    Every piece of generated text and every token id the server sends with it passes ``_take_delta``, in order: the
    one place a check on the answer as it grows belongs. The repetition-loop check (``loop_rule``) reads the text
    there; once it finds a loop, ``ended`` is true, the rest of the answer is not wanted (a stream's reader closes it,
    and the server aborts the request) and ``result`` keeps the answer up to the end of the cycle's first repetition,
    finish reason ``repetition_loop``, without output ids (they cannot be cut to the text without the tokenizer)."""

    def __init__(
        self,
        server: str,
        *,
        stream: bool,
        started_at: float | None = None,
        loop_rule: LoopRule | None = None,
        max_tokens: int | None = None,
        entropy: bool = False,
    ) -> None:
        self.server = server
        self.stream = stream
        self.started_at = time.time() if started_at is None else started_at
        self._t0 = time.perf_counter()
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._offsets: list[float] = []
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._sglext: Any = None
        self._response_id: str | None = None
        self._done: bool | None = False if stream else None
        # vLLM's return_token_ids: prompt ids on the body (first chunk), output ids on the choice (per delta).
        self._prompt_ids: list[int] | None = None
        self._output_ids: list[int] | None = None
        self._loops = TextLoopCheck(loop_rule) if loop_rule is not None else None
        self._calls: dict[int, dict[str, Any]] = {}  # the tool calls by index, as their deltas arrive
        self._max_tokens = max_tokens
        self.loop: TextLoop | None = None
        # the answer's top-k logprobs folded per token into a summary (client.entropy); None: not asked for
        self._entropy = EntropySummary() if entropy else None

    @property
    def started(self) -> bool:
        """A stream's first reasoning or answer text has arrived."""
        return bool(self._offsets)

    @property
    def ended(self) -> bool:
        """A loop was found: nothing more of this answer is wanted."""
        return self.loop is not None

    def add_response(self, body: Mapping[str, Any]) -> None:
        """A non-streaming answer: ``choices[0].message``."""
        choices = body.get("choices") or ()
        if not choices:
            raise RequestError("protocol", "response has no choices")
        choice = choices[0]
        message = choice.get("message") or {}
        self._note_envelope(body)
        ids = choice.get("token_ids")
        self._take_delta(reasoning_of(message), message.get("content"), ids, streamed=False)
        if self._entropy is not None:
            self._entropy.add(choice.get("logprobs"))
        for index, call in enumerate(message.get("tool_calls") or ()):
            self._take_call(call, index)
        self._finish_reason = choice.get("finish_reason")

    def add_event(self, event: SseEvent) -> None:
        """One decoded SSE event of a chat stream: a chunk, or the ``[DONE]`` that ends it.

        Named events are not chat chunks (SGLang sends ``sglext_ids`` only when asked with a header draftgen never
        sets): they are passed over."""
        if (event.event is not None and event.event != "message") or self.ended:
            return
        if event.data == DONE:
            self._done = True
            return
        try:
            chunk = json.loads(event.data)
        except json.JSONDecodeError as exc:
            raise RequestError("protocol", f"stream chunk is not JSON ({exc}): {event.data[:200]!r}") from exc
        if not isinstance(chunk, dict):
            raise RequestError("protocol", f"stream chunk is not an object: {event.data[:200]!r}")
        self.add_chunk(chunk)

    def add_chunk(self, chunk: Mapping[str, Any]) -> None:
        """One streamed chunk; ``choices: []`` chunks (usage, sglext) included."""
        if "error" in chunk and "choices" not in chunk:
            raise RequestError("protocol", f"error in stream: {str(chunk['error'])[:300]}")
        self._note_envelope(chunk)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            self._take_delta(
                reasoning_of(delta), delta.get("content"), choice.get("token_ids"), streamed=True
            )
            for position, call in enumerate(delta.get("tool_calls") or ()):
                self._take_call(call, position)
            if self._entropy is not None and not self.ended:
                self._entropy.add(choice.get("logprobs"))
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]

    def _take_delta(
        self, reasoning: str | None, content: str | None, token_ids: Any, *, streamed: bool
    ) -> None:
        """One piece of the answer: its reasoning and answer text, and the output ids sent with it (vLLM)."""
        if self.ended:
            return
        if reasoning:
            self._reasoning.append(reasoning)
        if content:
            self._content.append(content)
        if self._loops is not None:
            self._check_loop(reasoning, content, whole=not streamed)
        if streamed and (reasoning or content):
            self._offsets.append(time.perf_counter() - self._t0)
        if streamed and isinstance(token_ids, list) and token_ids:
            if self._output_ids is None:
                self._output_ids = []
            self._output_ids.extend(token_ids)
        elif not streamed and token_ids is not None:
            self._output_ids = _int_list(token_ids)

    def _take_call(self, call: Mapping[str, Any], position: int) -> None:
        """One tool call, or one delta of a streamed one: the first piece of a call names it, the rest add argument
        text (a call without ``index`` is the ``position``-th of its list, as in a whole ``message.tool_calls``)."""
        if not isinstance(call, Mapping):
            raise RequestError("protocol", f"a tool call is not an object: {str(call)[:200]!r}")
        index = call.get("index")
        index = position if not isinstance(index, int) else index
        function = call.get("function") or {}
        kept = self._calls.setdefault(index, {"id": None, "function": {"name": None, "arguments": ""}})
        if call.get("id") and not kept["id"]:
            kept["id"] = call["id"]
        if function.get("name") and not kept["function"]["name"]:
            kept["function"]["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            kept["function"]["arguments"] += arguments
        elif arguments is not None:
            kept["function"]["arguments"] += json.dumps(arguments, ensure_ascii=False)

    def _check_loop(self, reasoning: str | None, content: str | None, *, whole: bool) -> None:
        loops = self._loops
        assert loops is not None
        if reasoning and self._content:
            self._loops = None  # reasoning after the answer began: its offsets would not map onto the text
            return
        if reasoning:
            self.loop = loops.feed(reasoning, "reasoning")
        if content and self.loop is None:
            self.loop = loops.feed(content, "content")
        if whole and self.loop is None:
            self.loop = loops.finish()

    def _loop_end(self) -> LoopEnd | None:
        """The loop that ended this answer: found live (the stream closed there), or in the answer once whole."""
        live = self.loop is not None and self.stream and self._finish_reason is None
        if self.loop is None and self._loops is not None and self.stream:
            self.loop = self._loops.finish()  # a stream that finished: its last piece, after the fact
        if self.loop is None:
            return None
        return LoopEnd(self.loop, live=live, max_tokens=self._max_tokens)

    def _note_envelope(self, body: Mapping[str, Any]) -> None:
        self._response_id = self._response_id or body.get("id")
        usage = body.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        self._sglext = body.get("sglext") or self._sglext
        prompt_ids = body.get("prompt_token_ids")
        if prompt_ids is not None:
            self._prompt_ids = _int_list(prompt_ids)

    def result(self) -> ChatResult:
        loop = self._loop_end()
        if self.stream and self._finish_reason is None and loop is None:
            raise RequestError("protocol", "stream ended without a finish_reason (connection closed early?)")
        accept_length, verify_ct = spec_from_sglext(self._sglext)
        prompt_ids, output_ids = ids_from_sglext(self._sglext)
        usage = self._usage
        reasoning, content = "".join(self._reasoning), "".join(self._content)
        finish_reason = self._finish_reason
        output_ids = output_ids if output_ids is not None else _int_list(self._output_ids)
        if loop is not None:
            # kept: up to the end of the cycle's first repetition, over the reasoning then the answer
            keep = loop.loop.kept_chars
            reasoning, content = reasoning[:keep], content[: max(0, keep - len(reasoning))]
            finish_reason, output_ids = REPETITION_LOOP, None
        return ChatResult(
            server=self.server,
            response_id=self._response_id,
            reasoning_content=reasoning or None,
            content=content or None,
            finish_reason=finish_reason,
            prompt_tokens=usage.get("prompt_tokens") if usage else None,
            completion_tokens=usage.get("completion_tokens") if usage else None,
            usage_reported=usage is not None,
            spec_accept_length=accept_length,
            spec_verify_ct=verify_ct,
            started_at=self.started_at,
            latency_s=time.perf_counter() - self._t0,
            ttft_s=self._offsets[0] if self._offsets else None,
            chunk_offsets=self._offsets if self.stream else [],
            stream=self.stream,
            done_sentinel=self._done,
            prompt_ids=prompt_ids if prompt_ids is not None else self._prompt_ids,
            output_ids=output_ids,
            loop=loop,
            tool_calls=target_calls([self._calls[i] for i in sorted(self._calls)]),
            cached_tokens=cached_of(usage),
            drafts_histogram=drafts_histogram_of(self._sglext),
            entropy=self._entropy.summary() if self._entropy is not None and loop is None else None,
        )
