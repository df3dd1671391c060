"""One server's HTTP stack: one ``httpx2.AsyncClient`` that carries the openai SDK's requests and every raw one.

The client is the SDK's own aiohttp-backed one (``openai.DefaultAioHttpClient``): the httpx2 interface the SDK needs,
on aiohttp's connection pool and C HTTP parser. httpx2's own transport (h11, pure Python) costs 1.5 times the client
CPU per streamed request (docs/figures.md, figure 12), and a benchmark holding hundreds of streams on one event loop
must not measure its own client.

One timeout model: a request has one total deadline, from sending to its last byte (``asyncio.timeout``); the
HTTP client itself has none, so no second timer can fire first or be forgotten. One error family: whatever goes
wrong leaves here as a ``RequestError`` (``errors.classify_error``), and a stream whose body breaks off after its
headers is told apart from a server that could not be reached (``errors.cut_off``). Leaving a stream early —
cancelled, hedged, timed out — closes its connection, so SGLang sees the client go and aborts the request.

A kept-alive connection the server has dropped is not a failure of the request sent on it: uvicorn (under
``transformers serve``, vLLM and SGLang alike) answers an unhandled exception with a 500 that does not say
``Connection: close`` and then resets the connection, so the next request taken from the pool meets the reset before
any answer. Such a request is sent once more on a new connection (``resend_if_dropped``), as curl and browsers do;
aiohttp does so itself for GETs only. A reset on a new connection is the server's failure and is raised.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx2

from draftgen.client.errors import classify_error, cut_off, http_error

# No practical connection cap: a benchmark level may hold hundreds of streams on one server (left unset, the
# aiohttp pool's own default would cap it at 100).
LIMITS = httpx2.Limits(max_connections=100_000, max_keepalive_connections=None)


@dataclass(frozen=True)
class Reply:
    status: int
    text: str
    headers: Mapping[str, str]


# Whether the request being sent in this task went out on a pooled connection (set by aiohttp's trace hook).
_REUSED: ContextVar[list[bool] | None] = ContextVar("draftgen_connection_reused", default=None)


async def _note_reuse(_session: object, _context: SimpleNamespace, _params: object) -> None:
    reused = _REUSED.get()
    if reused is not None:
        reused.append(True)


async def resend_if_dropped(
    request: aiohttp.ClientRequest,
    send: Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]],
) -> aiohttp.ClientResponse:
    """aiohttp middleware: a request whose pooled connection turns out dropped, before any answer, is sent once
    more (on a new connection: aiohttp closes the dropped one)."""
    for attempt in (1, 2):
        reused: list[bool] = []
        token = _REUSED.set(reused)
        try:
            return await send(request)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if attempt == 2 or not reused or isinstance(exc, aiohttp.ClientConnectorError):
                raise
        finally:
            _REUSED.reset(token)
    raise AssertionError("unreachable")


def _session() -> aiohttp.ClientSession:
    """One server's aiohttp pool: ``LIMITS``, and dropped kept-alive connections resent (``resend_if_dropped``).
    Built inside the running loop, on the first request."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_note_reuse)
    connector = aiohttp.TCPConnector(
        limit=LIMITS.max_connections or 0, keepalive_timeout=LIMITS.keepalive_expiry
    )
    return aiohttp.ClientSession(connector=connector, trace_configs=[trace], middlewares=(resend_if_dropped,))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The certificate store every client of the process shares: loading it takes 20 ms of CPU, 95% of building
    a client, and a run builds one client per server in each phase (docs/testing.md)."""
    return httpx2.create_ssl_context(trust_env=False)


def http_client(api_key: str) -> httpx2.AsyncClient:
    """The client one server's requests share. ``trust_env`` off: servers are addressed by their own URL, never
    through a proxy an environment variable happens to name. The SDK is imported here, when a client is built, not
    when a report merely reads the client's records (docs/design.md)."""
    import openai
    from openai._vendor.httpx_aiohttp import AiohttpTransport

    return openai.DefaultAioHttpClient(
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=None,
        limits=LIMITS,
        trust_env=False,
        transport=AiohttpTransport(verify=_tls_context(), limits=LIMITS, trust_env=False, client=_session),
    )


class Transport:
    """Raw requests to one server (``base_url`` + path), each under its own total deadline."""

    def __init__(self, base_url: str, http: httpx2.AsyncClient):
        self.base_url = base_url
        self.http = http
        self._urls: dict[str, httpx2.URL] = {}

    def url(self, path: str) -> httpx2.URL:
        """``base_url + path``, parsed once: parsing a URL string is half of httpx2's cost of building a request."""
        if path not in self._urls:
            self._urls[path] = httpx2.URL(f"{self.base_url}{path}")
        return self._urls[path]

    async def request(self, method: str, path: str, *, timeout_s: float, json: Any = None) -> Reply:
        """The whole answer, whatever its status; RequestError when there is no answer."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self.http.request(method, self.url(path), json=json)
            return Reply(response.status_code, response.text, response.headers)
        except Exception as exc:  # classify_error re-raises what it does not know
            raise classify_error(exc) from exc

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        timeout_s: float,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[httpx2.Response]:
        """A 200 answer whose body is read inside the block (``aiter_bytes``); any other status raises
        RequestError with the server's message. The deadline covers the whole block."""
        try:
            async with (
                asyncio.timeout(timeout_s),
                self.http.stream(method, self.url(path), json=json, headers=headers) as response,
            ):
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", errors="replace")
                    raise http_error(response.status_code, text, response.headers)
                try:
                    yield response
                except httpx2.TransportError as exc:  # the headers came: the body broke off
                    raise cut_off(exc) from exc
        except Exception as exc:  # classify_error re-raises what it does not know
            raise classify_error(exc) from exc
