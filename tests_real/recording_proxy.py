"""A pass-through HTTP proxy in front of one real server that keeps a copy of every exchange.

The tests compare what draftgen stored with what the server itself said (its ``usage``, its ``/metrics`` text)
and check which fields draftgen sent to which engine. Bytes pass through unchanged and streams are relayed chunk
by chunk as they arrive, so the client sees the server's own protocol (SSE framing, missing ``[DONE]``, usage
chunks with ``choices: []``). Runs its own event loop in a daemon thread, so papermill kernels in other
processes can use it while the test thread reads ``exchanges()``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from draftgen.client.sse import decode_events

DONE = "[DONE]"  # the last event's data (this module also runs in the SGLang tier's venv, without draftgen's deps)

# Headers that describe one hop, not the message: aiohttp sets its own on each side.
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}
)


@dataclass(frozen=True)
class Exchange:
    """One request through the proxy and the server's whole answer."""

    method: str
    path: str
    request_body: bytes
    status: int
    response_body: bytes
    started: float  # wall clock
    finished: float

    def request_json(self) -> Any:
        return json.loads(self.request_body) if self.request_body else None

    def response_json(self) -> Any:
        return json.loads(self.response_body)

    def sse_events(self) -> Iterator[Any]:
        """Each event's data of an SSE answer (draftgen's own decoder), JSON-decoded (``[DONE]`` stays the string
        "[DONE]")."""
        for event in decode_events(self.response_body):
            yield event.data if event.data == DONE else json.loads(event.data)


def vllm_ids(exchange: Exchange) -> tuple[list[int] | None, list[int] | None]:
    """(prompt ids, output ids) as vLLM sent them: on the body and choice, or the first chunk and every delta."""
    if not exchange.request_json().get("stream"):
        body = exchange.response_json()
        return body.get("prompt_token_ids"), body["choices"][0].get("token_ids")
    prompt, output = None, []
    for event in exchange.sse_events():
        if event == "[DONE]":
            continue
        prompt = prompt or event.get("prompt_token_ids")
        for choice in event["choices"]:
            output += choice.get("token_ids") or []
    return prompt, output or None


class RecordingProxy:
    """``RecordingProxy(upstream).start()`` → the proxy's base URL; ``stop()`` closes it."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.url: str | None = None
        self._exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._in_flight = 0  # exchanges begun and not yet recorded
        self._settled = threading.Condition(self._lock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # ----- records ------------------------------------------------------------------------------------------
    def exchanges(self, path: str | None = None, method: str | None = None) -> list[Exchange]:
        """Every finished exchange in the order the requests arrived.

        A client may act on an answer's last byte before this proxy has recorded it (the recording happens after
        ``write_eof``), so the read waits until no exchange is half-recorded; ordering by arrival keeps "the last
        N requests" meaning the last N sent, whichever finished last.
        """
        with self._settled:
            self._settled.wait_for(lambda: self._in_flight == 0, timeout=60)
            found = sorted(self._exchanges, key=lambda e: e.started)
        return [
            e for e in found if (path is None or e.path == path) and (method is None or e.method == method)
        ]

    def chats(self) -> list[Exchange]:
        return self.exchanges("/v1/chat/completions", "POST")

    # ----- life cycle ---------------------------------------------------------------------------------------
    def start(self) -> str:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    async def _start(self) -> int:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            # a fresh upstream connection per request: a pooled one the server had closed while idle was reset on
            # reuse (transformers serve, under load), and the proxy answered 500 for a request the server never saw
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # the port the OS chose
        return sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        started = time.time()
        with self._lock:
            self._in_flight += 1
        exchange: Exchange | None = None
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            received: list[bytes] = []
            async with self._session.request(
                request.method, self.upstream + request.path_qs, data=body or None, headers=headers
            ) as upstream:
                reply = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in HOP_HEADERS:
                        reply.headers[key] = value
                await reply.prepare(request)
                try:
                    async for data in upstream.content.iter_any():
                        received.append(data)
                        await reply.write(data)
                    await reply.write_eof()
                finally:
                    exchange = Exchange(
                        method=request.method,
                        path=request.path,
                        request_body=body,
                        status=upstream.status,
                        response_body=b"".join(received),
                        started=started,
                        finished=time.time(),
                    )
            return reply
        finally:
            with self._settled:
                if exchange is not None:
                    self._exchanges.append(exchange)
                self._in_flight -= 1
                self._settled.notify_all()
