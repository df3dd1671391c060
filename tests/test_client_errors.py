"""The client's one error family: every failure reaches callers as a ``RequestError`` classified the same way
(kind, status, retryable, server fault, whether a connection was made), from the SDK's exceptions, the HTTP
stack's, and real sockets misbehaving in each way a server can; and leaving a request early closes its connection,
so SGLang sees the client go and aborts the request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2
import openai
import pytest

from draftgen.client import introspect
from draftgen.client.errors import RequestError, classify_error, cut_off, http_error
from draftgen.client.introspect import StartupStage
from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.params import SamplingParams

MESSAGES = [{"role": "user", "content": "hi"}]
SAMPLING = SamplingParams(max_tokens=8)
REQUEST = httpx2.Request("GET", "http://127.0.0.1:1/health")


# ----- classification of each library's exceptions ------------------------------------------------------------
def test_a_connection_never_made_is_refused_and_counts_against_the_server():
    for exc in (httpx2.ConnectError("refused", request=REQUEST), ConnectionRefusedError(111, "refused")):
        error = classify_error(exc)
        assert (error.kind, error.connected, error.refused) == ("connection", False, True)
        assert error.retryable and error.server_fault


def test_the_sdks_wrapped_connect_error_is_refused_too():
    wrapped = openai.APIConnectionError(request=REQUEST)
    wrapped.__cause__ = httpx2.ConnectError("refused", request=REQUEST)
    assert classify_error(wrapped).refused
    dropped = openai.APIConnectionError(request=REQUEST)
    dropped.__cause__ = httpx2.RemoteProtocolError("Server disconnected", request=REQUEST)
    error = classify_error(dropped)
    assert (error.kind, error.refused) == ("connection", False)


def test_a_deadline_is_a_timeout():
    error = classify_error(TimeoutError())
    assert (error.kind, error.connected, error.retryable, error.server_fault) == ("timeout", True, True, True)
    assert not error.refused


class AiohttpConnectError(OSError):
    """Stands in for aiohttp's connect error: any error carrying the ``os_error`` it failed with."""

    def __init__(self) -> None:
        super().__init__(111, "Connect call failed")
        self.os_error = ConnectionRefusedError(111, "Connect call failed")


def _mislabelled(cause: BaseException) -> httpx2.ConnectTimeout:
    """What the SDK's aiohttp backend raises for any failure to connect or to keep a connection."""
    exc = httpx2.ConnectTimeout(str(cause))
    exc.__cause__ = cause
    return exc


def test_the_aiohttp_backends_connect_timeout_is_read_by_what_it_wraps():
    refused = classify_error(_mislabelled(AiohttpConnectError()))
    assert (refused.kind, refused.refused) == ("connection", True)
    hung_up = classify_error(_mislabelled(ConnectionError("Server disconnected")))
    assert (hung_up.kind, hung_up.connected, hung_up.refused) == ("connection", True, False)
    through_the_sdk = openai.APITimeoutError(request=REQUEST)
    through_the_sdk.__cause__ = _mislabelled(AiohttpConnectError())
    assert classify_error(through_the_sdk).refused


def test_a_dropped_connection_is_a_connection_error_that_was_connected():
    error = classify_error(httpx2.RemoteProtocolError("Server disconnected", request=REQUEST))
    assert (error.kind, error.connected, error.refused) == ("connection", True, False)


def _status_error(status: int, body: object, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST)
    return openai.APIStatusError("failed", response=response, body=body)


@pytest.mark.parametrize(
    ("status", "retryable", "server_fault"),
    [(400, False, False), (422, False, False), (429, True, False), (500, True, True), (503, True, True)],
)
def test_http_statuses_from_the_sdk(status, retryable, server_fault):
    error = classify_error(_status_error(status, {"message": "no"}, {"retry-after": "2"}))
    assert (error.kind, error.status, error.message, error.retry_after) == ("http", status, "no", 2.0)
    assert (error.retryable, error.server_fault) == (retryable, server_fault)


def test_raw_http_errors_quote_the_servers_message():
    openai_style = http_error(400, json.dumps({"error": {"message": "bad field"}}), {})
    fastapi_style = http_error(422, json.dumps({"detail": "Unexpected fields"}), {"retry-after": "x"})
    plain = http_error(502, "Bad Gateway", {"retry-after": "1.5"})
    assert (openai_style.message, openai_style.status) == ("bad field", 400)
    assert (fastapi_style.message, fastapi_style.retry_after) == ("Unexpected fields", None)
    assert (plain.message, plain.retry_after, plain.server_fault) == ("Bad Gateway", 1.5, True)


def test_a_body_cut_off_or_unreadable_is_a_protocol_error():
    for error in (
        cut_off(httpx2.RemoteProtocolError("incomplete chunked read", request=REQUEST)),
        classify_error(json.JSONDecodeError("Expecting value", "{", 0)),
        classify_error(httpx2.DecodingError("bad gzip", request=REQUEST)),
    ):
        assert error.kind == "protocol" and error.retryable and not error.server_fault


def test_a_bug_is_not_classified_but_raised():
    with pytest.raises(KeyError):
        classify_error(KeyError("choices"))


# ----- real sockets -----------------------------------------------------------------------------------------------
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return await reader.readexactly(length)


async def wait_for_hang_up(reader: asyncio.StreamReader) -> None:
    """Returns once the client has closed its end of the connection."""
    while await reader.read(1024):
        pass


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def answer(status: int, body: bytes = b"") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


FIRST_CHUNK = chunked(b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n')
SGLANG = Capabilities("sglang")


def test_a_port_nobody_listens_on_reads_refused():
    async def go() -> tuple[RequestError, introspect.Readiness]:
        with (
            socket.socket() as bound
        ):  # bound, never listening: connections are refused, and no one takes the port
            bound.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{bound.getsockname()[1]}"
            async with ServerClient(url, capabilities=SGLANG) as client:
                with pytest.raises(RequestError) as caught:
                    await client.stream_chat(MESSAGES, SAMPLING, "m")
                return caught.value, await introspect.startup_stage(client, "/health_generate", 5.0)

    error, reading = asyncio.run(go())
    assert error.refused and reading.stage is StartupStage.REFUSED


@pytest.mark.parametrize(
    ("reply", "stage", "detail"),
    [
        (answer(200), StartupStage.READY, ""),
        (answer(503), StartupStage.WARMING, ""),
        (answer(404), StartupStage.ERROR, "HTTP 404"),
        (b"", StartupStage.ERROR, None),  # connected, then closed without an answer (a server going down)
        (None, StartupStage.SILENT, "no answer in 0.3s"),  # connected, never answers
    ],
)
def test_each_way_a_starting_server_answers_is_one_stage(reply, stage, detail):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if reply is None:
            await wait_for_hang_up(reader)
        else:
            writer.write(reply)
            await writer.drain()
        writer.close()

    async def go() -> introspect.Readiness:
        async with raw_server(handler) as url, ServerClient(url) as client:
            return await introspect.startup_stage(client, "/health_generate", 0.3)

    reading = asyncio.run(go())
    assert reading.stage is stage
    if detail is not None:
        assert reading.detail == detail


def test_a_stream_cut_after_its_headers_is_a_protocol_error_and_a_silent_one_times_out():
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + FIRST_CHUNK)
        await writer.drain()
        writer.close()  # no last chunk: the body ends mid-stream

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await wait_for_hang_up(reader)
        writer.close()

    async def failure(handler: Handler) -> RequestError:
        async with raw_server(handler) as url, ServerClient(url, capabilities=SGLANG) as client:
            with pytest.raises(RequestError) as caught:
                await client.stream_chat(MESSAGES, SAMPLING, "m", timeout_s=0.5)
            return caught.value

    broken = asyncio.run(failure(cut))
    assert (broken.kind, broken.connected, broken.server_fault) == ("protocol", True, False)
    assert "cut off" in broken.message
    late = asyncio.run(failure(silent))
    assert (late.kind, late.connected) == ("timeout", True)


@pytest.mark.parametrize("stream", [True, False])
def test_leaving_a_request_early_closes_its_connection_at_once(stream):
    """A hedged copy that lost, or a level's requests cancelled at its end: the server must see the client go
    (SGLang aborts a request when its connection closes), streamed or not."""

    async def go() -> None:
        started, hung_up = asyncio.Event(), asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            if stream:
                writer.write(STREAM_HEAD + FIRST_CHUNK)
                await writer.drain()
            started.set()
            await wait_for_hang_up(reader)
            hung_up.set()
            writer.close()

        async with raw_server(handler) as url, ServerClient(url, capabilities=SGLANG) as client:
            request = asyncio.create_task(client.chat(MESSAGES, SAMPLING, "m", stream=stream))
            await asyncio.wait_for(started.wait(), 10)
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
            await asyncio.wait_for(hung_up.wait(), 5)  # the connection closed, not left in a pool

    asyncio.run(go())


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as uvicorn's connection goes after its unhandled-exception 500."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


CHAT_ANSWER = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()


@pytest.mark.parametrize("call", ["sdk", "stream", "raw"])
def test_a_kept_alive_connection_the_server_dropped_is_resent_once_on_a_new_one(call):
    """transformers serve's /v1/models answers 500 (kept alive, no ``Connection: close``) and its uvicorn then resets
    that connection: the next request, taken from the pool, meets the reset before any answer. It was never
    answered, so it goes once more on a new connection, on every path a request takes."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        first = len(connections) == 1
        await read_request(reader)
        if first:  # the 500 that leaves the connection in the pool, then a reset when it is used again
            writer.write(answer(500, b"Internal Server Error"))
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
            reset(writer)
            return
        if call == "stream":
            last = (
                b'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}\n\n'
            )
            body = FIRST_CHUNK + chunked(last) + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"
            writer.write(STREAM_HEAD + body)
        else:
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            writer.write(f"{head}Content-Length: {len(CHAT_ANSWER)}\r\n\r\n".encode() + CHAT_ANSWER)
        await writer.drain()
        await wait_for_hang_up(reader)
        writer.close()

    async def go() -> object:
        async with raw_server(handler) as url, ServerClient(url, capabilities=SGLANG) as client:
            assert (await client.request("GET", "/v1/models")).status == 500
            if call == "raw":
                return (await client.request("POST", "/v1/chat/completions", json={"model": "m"})).status
            return (await client.chat(MESSAGES, SAMPLING, "m", stream=call == "stream")).content

    assert asyncio.run(go()) == (200 if call == "raw" else "OK" if call == "sdk" else "Hello")
    assert len(connections) == 2  # the pooled one, then exactly one new one


def test_a_reset_on_a_new_connection_is_the_servers_failure_and_not_resent():
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        await read_request(reader)
        reset(writer)

    async def go() -> RequestError:
        async with raw_server(handler) as url, ServerClient(url, capabilities=SGLANG) as client:
            with pytest.raises(RequestError) as caught:
                await client.chat(MESSAGES, SAMPLING, "m", stream=False)
            return caught.value

    error = asyncio.run(go())
    assert (error.kind, error.connected) == ("connection", True)
    assert connections == [0]  # sent once: a dropped request on a fresh connection is not tried again here
