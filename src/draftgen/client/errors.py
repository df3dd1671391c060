"""A failed request, classified once (kind, status, Retry-After) so every retry policy reads the same facts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import aiohttp
import openai

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


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


def classify_error(exc: BaseException) -> RequestError:
    """Map openai/aiohttp/asyncio exceptions to a RequestError (kind, status, retry-after)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return RequestError("timeout", "no answer within the request timeout")
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, (dict, str)) else None
        message = error_text(body) if isinstance(body, dict) else (body or exc.message)
        return RequestError(
            "http", str(message)[:500], status=exc.status_code, retry_after=retry_after(exc.response.headers)
        )
    if isinstance(exc, (openai.APIConnectionError, aiohttp.ClientConnectionError, ConnectionError, OSError)):
        return RequestError("connection", str(exc) or type(exc).__name__)
    if isinstance(exc, (openai.APIResponseValidationError, json.JSONDecodeError, aiohttp.ClientPayloadError)):
        return RequestError("protocol", str(exc)[:500])
    raise exc
