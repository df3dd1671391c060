"""A failed request, classified once (kind, status, Retry-After, whether it reached the server), so every caller —
retry policy, fleet health, serve's start-up stages — reads the same facts from one error type."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping

import httpx2

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
SERVER_FAULT_STATUS = frozenset({500, 502, 503, 504})


class RequestError(Exception):
    """A failed request, classified so a retry policy can decide what to do."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        connected: bool = True,
    ):
        super().__init__(message)
        self.kind = kind  # "timeout", "connection", "http", "protocol"
        self.status = status
        self.retry_after = retry_after
        self.message = message
        # False: no connection was made (refused, unreachable), so the server never saw the request
        self.connected = connected

    @property
    def retryable(self) -> bool:
        if self.kind in ("timeout", "connection", "protocol"):
            return True
        return self.status in RETRYABLE_STATUS

    @property
    def server_fault(self) -> bool:
        """The failure says the server itself is unwell (not the prompt, not back-pressure like 429)."""
        if self.kind in ("connection", "timeout"):
            return True
        return self.kind == "http" and self.status in SERVER_FAULT_STATUS

    @property
    def refused(self) -> bool:
        """Nothing listens there (yet): SGLang opens its port only once the weights are loaded."""
        return self.kind == "connection" and not self.connected

    def __str__(self) -> str:
        return f"{self.kind}{f' {self.status}' if self.status else ''}: {self.message}"


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def error_text(body: dict) -> str:
    """The message of a JSON error body: OpenAI-style ``message``, or FastAPI's ``detail`` (transformers serve)."""
    for key in ("message", "detail"):
        if body.get(key):
            return str(body[key])
    return str(body)


def http_error(status: int, text: str, headers: Mapping[str, str]) -> RequestError:
    """A non-200 answer read from raw bytes: the JSON body's message where there is one."""
    message = text
    try:
        payload = json.loads(text)
        if isinstance(payload, dict):
            inner = payload.get("error", payload)
            message = error_text(inner) if isinstance(inner, dict) else str(inner)
    except json.JSONDecodeError:
        pass
    return RequestError("http", message[:500], status=status, retry_after=retry_after(headers))


def cut_off(exc: Exception) -> RequestError:
    """The answer's body broke off after its headers: the server answered, then the stream ended early."""
    return RequestError("protocol", f"answer cut off mid-body: {_describe(exc)}"[:500])


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _transport_failure(exc: httpx2.TransportError) -> RequestError:
    """A request that got no answer. The SDK's aiohttp backend reports every such failure as ``ConnectTimeout`` (a
    server hanging up included; no timer of its own is ever set here), so what happened is read from what it wraps:
    a failed connect is aiohttp's error carrying the ``os_error`` it failed with."""
    never = isinstance(exc, httpx2.ConnectError) or hasattr(exc.__cause__, "os_error")
    return RequestError("connection", _describe(exc), connected=not never)


def classify_error(exc: BaseException) -> RequestError:
    """Map openai / httpx2 / asyncio exceptions to a RequestError; re-raise anything else (a bug)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):  # a deadline of ours (transport, server)
        return RequestError("timeout", "no answer within the request timeout")
    # The SDK's errors can only come from the SDK, so it is not imported here: 2 s of CPU for processes that
    # classify errors without sending anything (reports, the status command).
    openai = sys.modules.get("openai")
    if openai is None:
        return _classify_transport(exc)
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, (dict, str)) else None
        message = error_text(body) if isinstance(body, dict) else (body or exc.message)
        return RequestError(
            "http", str(message)[:500], status=exc.status_code, retry_after=retry_after(exc.response.headers)
        )
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError too: the SDK wraps the transport's error
        cause = exc.__cause__
        if isinstance(cause, httpx2.TransportError):
            return _transport_failure(cause)
        return RequestError("connection", _describe(exc))
    if isinstance(exc, openai.APIResponseValidationError):
        return RequestError("protocol", _describe(exc)[:500])
    return _classify_transport(exc)


def _classify_transport(exc: BaseException) -> RequestError:
    if isinstance(exc, (httpx2.DecodingError, json.JSONDecodeError)):
        return RequestError("protocol", _describe(exc)[:500])
    if isinstance(exc, httpx2.TransportError):
        return _transport_failure(exc)
    if isinstance(exc, OSError):
        return RequestError(
            "connection", _describe(exc), connected=not isinstance(exc, ConnectionRefusedError)
        )
    raise exc
