"""Wire helpers shared by the simulated server's HTTP surfaces: SGLang's JSON error body and SSE framing."""

from __future__ import annotations

import json

from aiohttp import web


class BadRequest(Exception):
    """A request SGLang would answer with 400; the message is sent as the error body's ``message``."""


def error_response(status: int, message: str, kind: str) -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
