"""What a server is (``Capabilities``) and what one chat request gave back (``ChatResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftgen.client.loops import TextLoop

# The finish reasons of an answer that ended at its stop token: "stop", or "tool_calls" (SGLang's name for a stop
# after tool calls its parser read). Anything else ("length", "abort", ...) ended it otherwise.
STOPPED = frozenset({"stop", "tool_calls"})


@dataclass(frozen=True)
class Capabilities:
    """What one server accepts and reports, detected by ``introspect.probe``."""

    engine: str  # "sglang", "vllm", "smg" (SGLang's gateway), "openai-compatible" (e.g. transformers serve)
    model_ids: tuple[str, ...] = ()
    # accepts the non-OpenAI sampling fields (top_k, min_p, return_spec_tokens_details)
    extra_fields: bool = True
    template_kwargs: bool = True  # accepts chat_template_kwargs (enable_thinking); transformers serve does
    spec_details: bool = False  # answers return_spec_tokens_details with sglext.spec_tokens_details
    metrics: bool = False  # GET /metrics answers Prometheus text
    version: str | None = None
    workers: tuple[str, ...] = ()  # a gateway (smg) only: the worker URLs its GET /workers lists
    # Where the server's own prompt and output token ids come from: "sglext" (SGLang's return_*_ids_in_sglext),
    # "vllm" (return_token_ids) or None (the engine sends none: validate re-tokenizes the text).
    token_ids: str | None = None
    # Answers top_logprobs (asked for only when the client wants an entropy summary: client.entropy)
    logprobs: bool = False


@dataclass(frozen=True)
class LoopEnd:
    """A repetition loop found in an answer (``client.loops``) and what was done: the answer was cut at the end of the
    cycle's first repetition; ``live``: found while streaming and the stream closed there, so its server stopped
    generating (else found in a whole answer: flagged, nothing saved); ``max_tokens``: what the request asked for."""

    loop: TextLoop
    live: bool
    max_tokens: int | None

    def as_row(self) -> dict[str, object]:
        """The stored row's ``turn_loop`` element (docs/design.md, the stored row)."""
        found = self.loop
        return {
            "period": found.period,
            "start": found.start,
            "kept": found.kept,
            "received": found.received,
            "start_char": found.start_char,
            "kept_chars": found.kept_chars,
            "received_chars": found.received_chars,
            "live": self.live,
            "max_tokens": self.max_tokens,
        }


@dataclass
class ChatResult:
    """One completed chat request, with where each number came from."""

    server: str
    response_id: str | None
    reasoning_content: str | None
    content: str | None
    finish_reason: str | None
    prompt_tokens: int | None  # from usage; None when the server sent no usage
    completion_tokens: int | None
    usage_reported: bool
    spec_accept_length: float | None  # per request, from sglext when the server gives it
    spec_verify_ct: int | None
    started_at: float  # wall clock (time.time()) when the request was sent
    latency_s: float  # request sent → last byte
    ttft_s: float | None = None  # streaming only: first reasoning or answer text
    chunk_offsets: list[float] = field(default_factory=list)  # streaming only: arrival of each text chunk (s)
    stream: bool = False
    done_sentinel: bool | None = None  # raw SSE streams only: the stream ended with "data: [DONE]"
    # The target's own token ids as the server reported them (Capabilities.token_ids); None when it sent none.
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    # A repetition loop ended the answer (finish_reason "repetition_loop"); its text is cut, its output ids dropped.
    loop: LoopEnd | None = None
    # The target's tool calls, as the server's tool-call parser returned them (``message.tool_calls``, or the
    # streamed ``delta.tool_calls`` put together): {"id", "type", "function": {"name", "arguments": str}}; () none.
    tool_calls: tuple[dict[str, Any], ...] = ()
    # Prompt tokens the server's prefix cache held (usage.prompt_tokens_details.cached_tokens: SGLang with
    # --enable-cache-report); None when the server did not say.
    cached_tokens: int | None = None
    # SGLang 0.5.23's sglext.spec_tokens_details.spec_correct_drafts_histogram: element k counts the verify steps
    # that accepted exactly k drafts (docs/engines.md); None when the server sent none.
    drafts_histogram: list[int] | None = None
    # How flat the target's next-token distribution was over the answer (client.entropy: tokens, mean, p10, p50,
    # p90 of each token's top-k entropy, nats); None when logprobs were not asked for or not sent.
    entropy: dict[str, float | int] | None = None
