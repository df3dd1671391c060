"""One client per inference server: chat requests through ``AsyncOpenAI`` and the server's raw endpoints.

The same code talks to SGLang, ``draftgen sim``, vLLM and ``transformers serve``. What differs between engines is
detected once per server (``introspect.probe``) into a ``Capabilities`` record, never configured by hand:
engine-specific body fields are sent only to servers that accept them. Retries are the caller's policy: every
client here is built with ``max_retries=0`` so attempts never multiply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from draftgen.client.errors import classify_error, http_error
from draftgen.client.records import Capabilities, ChatResult
from draftgen.client.stream import ChatAccumulator, read_sse
from draftgen.params import SamplingParams

# The body fields that ask each engine for the prompt and output token ids (Capabilities.token_ids). SGLang's also
# work streaming (the ids arrive in the ``choices: []`` sglext chunk); vLLM's too (prompt ids on the first chunk,
# output ids per delta). SGLang's own ``return_token_ids`` is refused when streaming, so never sent to it.
TOKEN_ID_FIELDS: dict[str | None, dict[str, bool]] = {
    "sglext": {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True},
    "vllm": {"return_token_ids": True},
}


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
        extra.update(TOKEN_ID_FIELDS.get(caps.token_ids, {}))
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
        """Send one chat completion through the openai SDK; failures raise RequestError."""
        request = kwargs or self.request_kwargs(
            messages, sampling, model, stream=stream, max_tokens=max_tokens
        )
        if timeout_s is not None:
            request["timeout"] = timeout_s
        answer = ChatAccumulator(self.url, stream=bool(request.get("stream")))
        try:
            if answer.stream:
                stream_reply = await self.openai.chat.completions.create(**request)
                async with stream_reply:
                    async for chunk in stream_reply:
                        # warnings off: SGLang 0.5.23's metadata.weight_versions (a list) is not the SDK's
                        # dict[str, str]; the value is kept as sent.
                        answer.add_chunk(chunk.model_dump(warnings=False))
            else:
                reply = await self.openai.chat.completions.create(**request)
                answer.add_response(reply.model_dump(warnings=False))
            return answer.result()
        except Exception as exc:  # classify_error re-raises what it does not know
            raise classify_error(exc) from exc

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
        answer = ChatAccumulator(self.url, stream=True)
        try:
            async with self._raw().post(
                f"{self.url}/v1/chat/completions", json=body, timeout=timeout
            ) as reply:
                if reply.status != 200:
                    raise http_error(reply.status, await reply.text(), reply.headers)
                return await read_sse(reply, answer)
        except Exception as exc:  # classify_error re-raises what it does not know
            raise classify_error(exc) from exc
