"""One client per inference server: its one HTTP stack carries chat (the openai SDK's, and streams read here) and
the server's raw endpoints.

The same code talks to SGLang, ``draftgen sim``, vLLM and ``transformers serve``. What differs between engines is
detected once per server (``introspect.probe``) into a ``Capabilities`` record, never configured by hand:
engine-specific body fields are sent only to servers that accept them. Retries are the caller's policy
(``client.retry``): the SDK is built with ``max_retries=0`` so attempts never multiply. A non-streamed chat goes
through ``AsyncOpenAI`` on this client's own ``httpx2.AsyncClient``; a streamed one is read straight off the
socket through ``sse.SseDecoder`` into ``ChatAccumulator`` (several times less client CPU per chunk than the SDK's
typed chunks, which matters when hundreds of streams run at once, and it sees ``[DONE]`` and named events).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from draftgen.client.errors import RequestError, classify_error
from draftgen.client.loops import LoopRule
from draftgen.client.records import Capabilities, ChatResult
from draftgen.client.sse import SseDecoder
from draftgen.client.stream import ChatAccumulator
from draftgen.client.transport import Reply, Transport, http_client
from draftgen.params import SamplingParams

CHAT_PATH = "/v1/chat/completions"
METRICS_PATH = "/metrics"  # Prometheus text: SGLang with --enable-metrics, vLLM, draftgen sim
SIM_INFO_PATH = "/sim/info"  # draftgen sim only: its profile, clock speed, clock kept and pid
WORKERS_PATH = "/workers"  # SMG, SGLang's gateway, only: the workers it routes to
RAW_TIMEOUT_S = 30.0  # GETs of the server's own endpoints (health, models, info, metrics)
SIM_INFO_TIMEOUT_S = 10.0

# The body fields that ask each engine for the prompt and output token ids (Capabilities.token_ids). SGLang's also
# work streaming (the ids arrive in the ``choices: []`` sglext chunk); vLLM's too (prompt ids on the first chunk,
# output ids per delta). SGLang's own ``return_token_ids`` is refused when streaming, so never sent to it.
TOKEN_ID_FIELDS: dict[str | None, dict[str, bool]] = {
    "sglext": {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True},
    "vllm": {"return_token_ids": True},
}


# SMG's routing-key header (its --routing-key-headers default). With ``--routing-key-override`` (sticky sessions) SMG
# pins every request carrying one key to one worker, so a conversation's turns and a prompt's samples meet their
# prefix in that worker's cache (docs/engines.md, "Behind SMG"); without it SMG ignores the header.
ROUTING_KEY_HEADER = "x-smg-routing-key"


def routing_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """A conversation's key for a gateway's sticky routing: a hash of its messages up to its first user turn, which
    each of its later turns (they carry it) and each sample of the same prompt share."""
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages) - 1)
    text = json.dumps(list(messages[: first_user + 1]), sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


class ServerClient:
    """One inference server: one ``httpx2.AsyncClient`` under an ``AsyncOpenAI`` (``max_retries=0``) and the raw
    requests."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str = "EMPTY",
        timeout_s: float = 1800.0,
        capabilities: Capabilities | None = None,
        loop_rule: LoopRule | None = None,
        entropy_top_k: int = 0,
    ):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self.capabilities = capabilities or Capabilities(engine="unknown")
        self.loop_rule = loop_rule  # chat answers are checked for repetition loops (client.loops) when given
        # > 0: chat requests ask for that many top_logprobs (where the probe found them accepted), and each answer's
        # per-token entropy is summarised (client.entropy)
        self.entropy_top_k = entropy_top_k
        # The SDK is imported here, not with this module: it costs 2 s of CPU (docs/design.md).
        from openai import AsyncOpenAI

        http = http_client(api_key)
        self.transport = Transport(self.url, http)
        # timeout=None: the SDK sets no per-phase timers of its own; each call's one deadline is ours (transport)
        self.openai = AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=None, http_client=http
        )

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def routing_headers(self, messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """The headers a chat request carries besides the body: a gateway (SMG) gets the conversation's routing
        key; a server, none."""
        return {ROUTING_KEY_HEADER: routing_key(messages)} if self.capabilities.engine == "smg" else {}

    async def close(self) -> None:
        await self.openai.close()  # closes the shared httpx2 client too
        await self.transport.http.aclose()

    # ----- raw endpoints ------------------------------------------------------------------------------
    async def request(
        self, method: str, path: str, *, timeout_s: float = RAW_TIMEOUT_S, json: Any = None
    ) -> Reply:
        """The server's answer to one raw request (any status); RequestError when there is none."""
        return await self.transport.request(method, path, timeout_s=timeout_s, json=json)

    async def get(self, path: str, timeout_s: float = RAW_TIMEOUT_S) -> tuple[int | None, str]:
        """(status, body) of a GET; status None when the server cannot be reached (the body says why)."""
        try:
            reply = await self.request("GET", path, timeout_s=timeout_s)
        except RequestError as exc:
            return None, str(exc)
        return reply.status, reply.text

    async def get_json(self, path: str, timeout_s: float = RAW_TIMEOUT_S) -> Any | None:
        status, text = await self.get(path, timeout_s)
        if status != 200:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None

    async def metrics_text(self, timeout_s: float = RAW_TIMEOUT_S) -> str | None:
        """``GET /metrics``: the Prometheus text (None: no answer, or not 200; ``client.metrics`` parses it)."""
        status, text = await self.get(METRICS_PATH, timeout_s)
        return text if status == 200 else None

    async def sim_info(self, timeout_s: float = SIM_INFO_TIMEOUT_S) -> dict[str, Any] | None:
        """``GET /sim/info``: what a ``draftgen sim`` server says of itself (None: another engine, or no answer)."""
        data = await self.get_json(SIM_INFO_PATH, timeout_s)
        return data if isinstance(data, dict) else None

    async def gateway_workers(self, timeout_s: float = RAW_TIMEOUT_S) -> dict[str, bool] | None:
        """SMG's ``GET /workers``: each worker's URL → whether SMG finds it healthy (None: this is no gateway)."""
        data = await self.get_json(WORKERS_PATH, timeout_s)
        workers = data.get("workers") if isinstance(data, dict) else None
        if not isinstance(workers, list):
            return None
        return {
            str(w["url"]): bool(w.get("is_healthy", True))
            for w in workers
            if isinstance(w, dict) and w.get("url")
        }

    # ----- chat ---------------------------------------------------------------------------------------
    def request_kwargs(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        model: str,
        *,
        stream: bool,
        max_tokens: int | None = None,
        seed: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The create() arguments for this server: OpenAI fields always, engine extras only where accepted;
        ``seed`` (OpenAI's own field) and ``tools`` (the conversation's tool schemas; ``tool_choice`` is left to the
        server's default, "auto") when given."""
        caps = self.capabilities
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens or sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if seed is not None:
            kwargs["seed"] = seed
        if caps.logprobs and self.entropy_top_k:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = self.entropy_top_k
        if tools:
            kwargs["tools"] = [dict(tool) for tool in tools]
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
        if headers := self.routing_headers(messages):
            kwargs["extra_headers"] = headers
        return kwargs

    @staticmethod
    def _asks_logprobs(request: Mapping[str, Any]) -> bool:
        return bool(request.get("top_logprobs"))

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        model: str,
        *,
        stream: bool = False,
        timeout_s: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> ChatResult:
        """One chat completion, whole (the openai SDK) or streamed (``stream_chat``); failures raise RequestError.
        ``on_first_token`` is called once a stream's first text arrives (never for a whole answer)."""
        if stream:
            return await self.stream_chat(
                messages,
                sampling,
                model,
                timeout_s=timeout_s,
                max_tokens=max_tokens,
                seed=seed,
                tools=tools,
                on_first_token=on_first_token,
            )
        request = self.request_kwargs(
            messages, sampling, model, stream=False, max_tokens=max_tokens, seed=seed, tools=tools
        )
        answer = ChatAccumulator(
            self.url,
            stream=False,
            loop_rule=self.loop_rule,
            max_tokens=request["max_tokens"],
            entropy=self._asks_logprobs(request),
        )
        try:
            async with asyncio.timeout(timeout_s or self.timeout_s):
                reply = await self.openai.chat.completions.create(**request)
            # warnings off: SGLang 0.5.23's metadata.weight_versions (a list) is not the SDK's dict[str, str]; the
            # value is kept as sent.
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
        seed: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> ChatResult:
        """A streamed chat, its SSE bytes decoded as they arrive; also records whether ``data: [DONE]`` came.

        Once the loop check has found a repetition loop the stream is left there: its connection closes, and the
        server (SGLang, the simulator) aborts the request, generating nothing more. ``on_first_token`` is called
        when the first text arrives: the server has prefilled the prompt (SGLang's prefix cache holds it then)."""
        kwargs = self.request_kwargs(
            messages, sampling, model, stream=True, max_tokens=max_tokens, seed=seed, tools=tools
        )
        body = {k: v for k, v in kwargs.items() if k not in ("extra_body", "extra_headers")}
        body.update(kwargs.get("extra_body", {}))
        answer = ChatAccumulator(
            self.url,
            stream=True,
            loop_rule=self.loop_rule,
            max_tokens=kwargs["max_tokens"],
            entropy=self._asks_logprobs(kwargs),
        )
        decoder = SseDecoder()
        async with self.transport.stream(
            "POST",
            CHAT_PATH,
            json=body,
            timeout_s=timeout_s or self.timeout_s,
            headers=kwargs.get("extra_headers"),
        ) as reply:
            async for data in reply.aiter_bytes():
                for event in decoder.feed(data):
                    answer.add_event(event)
                if on_first_token is not None and answer.started:
                    on_first_token()
                    on_first_token = None
                if answer.ended:
                    break
            else:
                for event in decoder.close():
                    answer.add_event(event)
        return answer.result()
