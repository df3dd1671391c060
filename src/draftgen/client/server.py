"""One client per inference server: chat requests through ``AsyncOpenAI`` and the server's raw endpoints.

The same code talks to SGLang, ``draftgen sim``, vLLM and ``transformers serve``. What differs between engines is
detected once per server (``probe``) into a ``Capabilities`` record, never configured by hand: engine-specific body
fields are sent only to servers that accept them. Retries are the caller's policy: every client here is built
with ``max_retries=0`` so attempts never multiply.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import openai
from openai import AsyncOpenAI

from draftgen.params import SamplingParams

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
PROBE_MAX_TOKENS = 8


@dataclass(frozen=True)
class Capabilities:
    """What one server accepts and reports, detected by ``ServerClient.probe``."""

    engine: str  # "sglang", "vllm", "sglang-router", "openai-compatible" (e.g. transformers serve)
    model_ids: tuple[str, ...] = ()
    extra_fields: bool = (
        True  # accepts the non-OpenAI sampling fields (top_k, min_p, return_spec_tokens_details)
    )
    template_kwargs: bool = True  # accepts chat_template_kwargs (enable_thinking); transformers serve does
    spec_details: bool = False  # answers return_spec_tokens_details with sglext.spec_tokens_details
    metrics: bool = False  # GET /metrics answers Prometheus text
    version: str | None = None
    workers: tuple[str, ...] = ()  # sglang-router only: the worker URLs its GET /workers lists


class RequestError(Exception):
    """A failed request, classified so a retry policy can decide what to do."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, retry_after: float | None = None
    ):
        super().__init__(message)
        self.kind = kind  # "timeout", "connection", "http", "protocol"
        self.status = status
        self.retry_after = retry_after
        self.message = message

    @property
    def retryable(self) -> bool:
        if self.kind in ("timeout", "connection", "protocol"):
            return True
        return self.status in RETRYABLE_STATUS

    def __str__(self) -> str:
        return f"{self.kind}{f' {self.status}' if self.status else ''}: {self.message}"


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
    done_sentinel: bool | None = None  # stream_chat only: the stream ended with "data: [DONE]"


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _error_text(body: dict) -> str:
    """The message of a JSON error body: OpenAI-style ``message``, or FastAPI's ``detail`` (transformers serve)."""
    for key in ("message", "detail"):
        if body.get(key):
            return str(body[key])
    return str(body)


def classify_error(exc: BaseException) -> RequestError:
    """Map openai/aiohttp/asyncio exceptions to a RequestError (kind, status, retry-after)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return RequestError("timeout", "no answer within the request timeout")
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, (dict, str)) else None
        message = _error_text(body) if isinstance(body, dict) else (body or exc.message)
        return RequestError(
            "http", str(message)[:500], status=exc.status_code, retry_after=_retry_after(exc.response.headers)
        )
    if isinstance(exc, (openai.APIConnectionError, aiohttp.ClientConnectionError, ConnectionError, OSError)):
        return RequestError("connection", str(exc) or type(exc).__name__)
    if isinstance(exc, (openai.APIResponseValidationError, json.JSONDecodeError, aiohttp.ClientPayloadError)):
        return RequestError("protocol", str(exc)[:500])
    raise exc


def _extra(obj: Any, name: str) -> Any:
    """A non-OpenAI field of a response object (reasoning_content, sglext, matched_stop), or None."""
    if obj is None:
        return None
    extra = getattr(obj, "model_extra", None) or {}
    if name in extra:
        return extra[name]
    return getattr(obj, name, None)


# The separated reasoning text: SGLang and transformers serve name it reasoning_content, vLLM (0.10 and later)
# reasoning.
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _reasoning(obj: Any) -> str | None:
    """The reasoning text of a message or delta (object or dict), whichever field name the engine uses."""
    for name in REASONING_FIELDS:
        value = obj.get(name) if isinstance(obj, dict) else _extra(obj, name)
        if isinstance(value, str):
            return value
    return None


def _spec_from_sglext(sglext: Any) -> tuple[float | None, int | None]:
    if not isinstance(sglext, dict):
        return None, None
    details = sglext.get("spec_tokens_details")
    if isinstance(details, list):
        details = details[0] if details else None
    if not isinstance(details, dict):
        return None, None
    length, verify = details.get("spec_accept_length"), details.get("spec_verify_ct")
    return (float(length) if length is not None else None), (int(verify) if verify is not None else None)


def _http_error(status: int, text: str, headers: Mapping[str, str]) -> RequestError:
    message = text
    try:
        payload = json.loads(text)
        if isinstance(payload, dict):
            inner = payload.get("error", payload)
            message = _error_text(inner) if isinstance(inner, dict) else str(inner)
    except json.JSONDecodeError:
        pass
    return RequestError("http", message[:500], status=status, retry_after=_retry_after(headers))


async def _read_sse(url: str, reply: aiohttp.ClientResponse, started_at: float, t0: float) -> ChatResult:
    """Parse an OpenAI chat SSE stream: ``choices: []`` chunks (usage, sglext), usage on any chunk, [DONE] or not."""
    reasoning: list[str] = []
    content: list[str] = []
    offsets: list[float] = []
    finish_reason = usage = sglext = response_id = None
    done = False
    buffer = b""
    async for data in reply.content.iter_any():
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            if not raw.startswith(b"data:"):
                continue
            payload = raw[5:].strip()
            if payload == b"[DONE]":
                done = True
                continue
            chunk = json.loads(payload)
            if not isinstance(chunk, dict):
                raise RequestError("protocol", f"stream chunk is not an object: {payload[:200]!r}")
            if "error" in chunk and "choices" not in chunk:
                raise RequestError("protocol", f"error in stream: {str(chunk['error'])[:300]}")
            now = time.perf_counter() - t0
            response_id = response_id or chunk.get("id")
            usage = chunk.get("usage") or usage
            sglext = chunk.get("sglext") or sglext
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                piece_r, piece_c = _reasoning(delta), delta.get("content")
                if piece_r:
                    reasoning.append(piece_r)
                if piece_c:
                    content.append(piece_c)
                if piece_r or piece_c:
                    offsets.append(now)
                if choice.get("finish_reason") is not None:
                    finish_reason = choice["finish_reason"]
    if finish_reason is None:
        raise RequestError("protocol", "stream ended without a finish_reason (connection closed early?)")
    accept_length, verify_ct = _spec_from_sglext(sglext)
    usage = usage if isinstance(usage, dict) else None
    return ChatResult(
        server=url,
        response_id=response_id,
        reasoning_content="".join(reasoning) or None,
        content="".join(content) or None,
        finish_reason=finish_reason,
        prompt_tokens=usage.get("prompt_tokens") if usage else None,
        completion_tokens=usage.get("completion_tokens") if usage else None,
        usage_reported=usage is not None,
        spec_accept_length=accept_length,
        spec_verify_ct=verify_ct,
        started_at=started_at,
        latency_s=time.perf_counter() - t0,
        ttft_s=offsets[0] if offsets else None,
        chunk_offsets=offsets,
        stream=True,
        done_sentinel=done,
    )


class ServerClient:
    """One inference server: an ``AsyncOpenAI`` for chat (``max_retries=0``) and raw GETs for the rest."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str = "EMPTY",
        timeout_s: float = 1800.0,
        capabilities: Capabilities | None = None,
    ):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self.capabilities = capabilities or Capabilities(engine="unknown")
        self.openai = AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=timeout_s
        )
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.openai.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ----- raw endpoints ------------------------------------------------------------------------------
    def _raw(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Authorization": f"Bearer {self._api_key}"}
            # No connection cap (aiohttp's default is 100): stream_chat may hold more streams than that.
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=30),
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    async def get(self, path: str, timeout_s: float = 30.0) -> tuple[int | None, str]:
        """(status, body) of a GET; status None when the server cannot be reached."""
        try:
            async with self._raw().get(
                f"{self.url}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as reply:
                return reply.status, await reply.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return None, f"{type(exc).__name__}: {exc}"

    async def get_json(self, path: str, timeout_s: float = 30.0) -> Any | None:
        status, text = await self.get(path, timeout_s)
        if status != 200:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None

    async def health(self, generate: bool = False, timeout_s: float = 30.0) -> int | None:
        """Status of /health, or of SGLang's /health_generate (a real 1-token generation) with ``generate``.

        Engines without /health_generate (vLLM, transformers serve answer 404) fall back to /health: callers
        that need proof of generation send a request of their own (preflight's probe and canary do).
        """
        if generate:
            status, _ = await self.get("/health_generate", timeout_s)
            if status != 404:
                return status
        status, _ = await self.get("/health", timeout_s)
        return status

    async def model_ids(self) -> tuple[str, ...]:
        data = await self.get_json("/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            return ()
        return tuple(str(item.get("id")) for item in data["data"] if isinstance(item, dict))

    async def server_info(self) -> dict | None:
        for path in ("/server_info", "/get_server_info"):
            data = await self.get_json(path)
            if isinstance(data, dict):
                return data
        return None

    async def router_workers(self) -> tuple[str, ...] | None:
        """SGLang's router (``sglang-router``): the worker URLs of ``GET /workers``; None when this is no router."""
        data = await self.get_json("/workers")
        workers = data.get("workers") if isinstance(data, dict) else None
        if not isinstance(workers, list):
            return None
        return tuple(str(w["url"]) for w in workers if isinstance(w, dict) and w.get("url"))

    async def metrics_text(self) -> str | None:
        status, text = await self.get("/metrics")
        return text if status == 200 else None

    # ----- chat ---------------------------------------------------------------------------------------
    def request_kwargs(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        model: str,
        *,
        stream: bool,
        max_tokens: int | None = None,
    ) -> dict[str, Any]:
        """The create() arguments for this server: OpenAI fields always, engine extras only where accepted."""
        caps = self.capabilities
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens or sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        extra: dict[str, Any] = {}
        if caps.template_kwargs:
            extra["chat_template_kwargs"] = {"enable_thinking": sampling.enable_thinking}
        if caps.extra_fields:
            if sampling.top_k is not None:
                extra["top_k"] = sampling.top_k
            if sampling.min_p is not None:
                extra["min_p"] = sampling.min_p
            if caps.spec_details:
                extra["return_spec_tokens_details"] = True
        if extra:
            kwargs["extra_body"] = extra
        if stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        model: str,
        *,
        stream: bool = False,
        timeout_s: float | None = None,
        max_tokens: int | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> ChatResult:
        """Send one chat completion; failures raise RequestError."""
        request = kwargs or self.request_kwargs(
            messages, sampling, model, stream=stream, max_tokens=max_tokens
        )
        if timeout_s is not None:
            request["timeout"] = timeout_s
        started_at = time.time()
        t0 = time.perf_counter()
        try:
            if request.get("stream"):
                return await self._chat_stream(request, started_at, t0)
            reply = await self.openai.chat.completions.create(**request)
        except Exception as exc:  # classify_error re-raises what it does not know
            raise classify_error(exc) from exc
        latency = time.perf_counter() - t0
        if not reply.choices:
            raise RequestError("protocol", "response has no choices")
        choice = reply.choices[0]
        message = choice.message
        usage = reply.usage
        accept_length, verify_ct = _spec_from_sglext(_extra(reply, "sglext"))
        return ChatResult(
            server=self.url,
            response_id=reply.id,
            reasoning_content=_reasoning(message),
            content=message.content,
            finish_reason=choice.finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            usage_reported=usage is not None,
            spec_accept_length=accept_length,
            spec_verify_ct=verify_ct,
            started_at=started_at,
            latency_s=latency,
        )

    async def _chat_stream(self, request: dict[str, Any], started_at: float, t0: float) -> ChatResult:
        reasoning: list[str] = []
        content: list[str] = []
        offsets: list[float] = []
        finish_reason = None
        usage = None
        sglext = None
        response_id = None
        stream = await self.openai.chat.completions.create(**request)
        async with stream:
            async for chunk in stream:
                now = time.perf_counter() - t0
                response_id = response_id or chunk.id
                if chunk.usage is not None:
                    usage = chunk.usage
                sglext = _extra(chunk, "sglext") or sglext
                for choice in chunk.choices or ():  # usage / sglext chunks carry choices: []
                    delta = choice.delta
                    piece_r = _reasoning(delta) if delta is not None else None
                    piece_c = delta.content if delta is not None else None
                    if piece_r:
                        reasoning.append(piece_r)
                    if piece_c:
                        content.append(piece_c)
                    if piece_r or piece_c:
                        offsets.append(now)
                    if choice.finish_reason is not None:
                        finish_reason = choice.finish_reason
        latency = time.perf_counter() - t0
        accept_length, verify_ct = _spec_from_sglext(sglext)
        return ChatResult(
            server=self.url,
            response_id=response_id,
            reasoning_content="".join(reasoning) or None,
            content="".join(content) or None,
            finish_reason=finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            usage_reported=usage is not None,
            spec_accept_length=accept_length,
            spec_verify_ct=verify_ct,
            started_at=started_at,
            latency_s=latency,
            ttft_s=offsets[0] if offsets else None,
            chunk_offsets=offsets,
            stream=True,
        )

    async def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        model: str,
        *,
        timeout_s: float | None = None,
        max_tokens: int | None = None,
    ) -> ChatResult:
        """A streaming chat read straight from the SSE bytes: same result as ``chat(stream=True)``.

        About six times less client CPU per chunk than the OpenAI SDK, which matters when hundreds of streams run
        at once (a benchmark must not measure its own client). Also records whether ``data: [DONE]`` came.
        """
        kwargs = self.request_kwargs(messages, sampling, model, stream=True, max_tokens=max_tokens)
        body = {k: v for k, v in kwargs.items() if k != "extra_body"}
        body.update(kwargs.get("extra_body", {}))
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        started_at = time.time()
        t0 = time.perf_counter()
        try:
            async with self._raw().post(
                f"{self.url}/v1/chat/completions", json=body, timeout=timeout
            ) as reply:
                if reply.status != 200:
                    raise _http_error(reply.status, await reply.text(), reply.headers)
                return await _read_sse(self.url, reply, started_at, t0)
        except Exception as exc:  # classify_error re-raises what it does not know
            raise classify_error(exc) from exc

    # ----- capability detection -------------------------------------------------------------------------
    async def detect_engine(self) -> tuple[str, str | None, bool, tuple[str, ...]]:
        """(engine, version, metrics available, router workers) from endpoints only one engine family serves."""
        info = await self.server_info()
        metrics = await self.metrics_text()
        has_metrics = metrics is not None and "# TYPE" in metrics
        if info is not None and ("internal_states" in info or "speculative_algorithm" in info):
            return "sglang", str(info.get("version")) if info.get("version") else None, has_metrics, ()
        workers = await self.router_workers()
        if workers is not None:
            return "sglang-router", None, has_metrics, workers
        version = await self.get_json("/version")
        if isinstance(version, dict) and "version" in version and (metrics is None or "vllm:" in metrics):
            return "vllm", str(version["version"]), has_metrics, ()
        return "openai-compatible", None, has_metrics, ()

    async def probe(self, model: str, sampling: SamplingParams) -> Capabilities:
        """Detect the engine and which extras it accepts, with one tiny request per step back.

        The first request carries every extra; a 400/422 (transformers serve: "Unexpected fields"; vLLM with
        speculative decoding: min_p "not yet supported") retries without the sampling extras (top_k, min_p,
        return_spec_tokens_details) but with chat_template_kwargs (enable_thinking), then with plain OpenAI
        fields only. Any other failure, or a 400/422 on the plain request (a wrong model name), raises.
        """
        engine, version, has_metrics, workers = await self.detect_engine()
        ids = await self.model_ids()
        steps = (
            {"extra_fields": True, "template_kwargs": True, "spec_details": True},
            {"extra_fields": False, "template_kwargs": True, "spec_details": False},
            {"extra_fields": False, "template_kwargs": False, "spec_details": False},
        )
        for index, step in enumerate(steps):
            self.capabilities = Capabilities(
                engine=engine, model_ids=ids, metrics=has_metrics, version=version, workers=workers, **step
            )
            try:
                result = await self.chat(
                    [{"role": "user", "content": "Say OK."}],
                    sampling,
                    model,
                    max_tokens=PROBE_MAX_TOKENS,
                    timeout_s=min(self.timeout_s, 120.0),
                )
            except RequestError as exc:
                if exc.status not in (400, 422) or index == len(steps) - 1:
                    raise
                continue
            self.capabilities = replace(
                self.capabilities, spec_details=step["spec_details"] and result.spec_verify_ct is not None
            )
            break
        return self.capabilities
