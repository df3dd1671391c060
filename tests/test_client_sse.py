"""The one SSE decoder (``client.sse``) and what ``ChatAccumulator`` makes of its events: every chunking of the same
bytes gives the same events; named events, comments (keep-alives), ``choices: []`` chunks and ``[DONE]`` each read
as the format and the engines mean them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from sim_helpers import serve

from draftgen.client.errors import RequestError
from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.client.sse import SseDecoder, SseEvent, aiter_events, decode_events, iter_events
from draftgen.client.stream import ChatAccumulator
from draftgen.params import SamplingParams

# One body with every rule in it: LF, CRLF and lone CR line ends, a BOM, comments, a named event with an id, data
# over two lines, a field without the space, an event with no data (not dispatched), multi-byte UTF-8, and a last
# event cut off before its blank line.
BODY = (
    '\ufeffdata: {"a": 1}\n\n'
    ": keep-alive\n\n"
    "event: sglext_ids\r\nid: 7\r\ndata: [1, 2]\r\n\r\n"
    "data: first line\rdata:second line\r\r"
    ": ping\n"
    "event: nothing\n\n"
    "data: día ✓ 思\n\n"
    "data\n\n"
    "retry: 10\ndata: [DONE]\n\n"
    "data: {cut"
).encode()
EXPECTED = [
    SseEvent('{"a": 1}'),
    SseEvent("[1, 2]", "sglext_ids", "7"),
    SseEvent("first line\nsecond line", None, "7"),  # the last id carries over, as the format says
    SseEvent("día ✓ 思", None, "7"),
    SseEvent("", None, "7"),
    SseEvent("[DONE]", None, "7"),
]


def test_the_whole_body_decodes_as_the_format_says():
    assert decode_events(BODY) == EXPECTED


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7])
def test_fixed_size_chunks_give_the_same_events(step):
    chunks = [BODY[i : i + step] for i in range(0, len(BODY), step)]
    assert list(iter_events(chunks)) == EXPECTED


def test_every_pair_of_cut_points_gives_the_same_events():
    """Chunk boundaries anywhere: inside a field name, a CRLF, a BOM, a multi-byte character."""
    for first in range(len(BODY) + 1):
        for second in range(first, len(BODY) + 1, 3):
            decoder = SseDecoder()
            events = (
                decoder.feed(BODY[:first]) + decoder.feed(BODY[first:second]) + decoder.feed(BODY[second:])
            )
            assert events + decoder.close() == EXPECTED, (first, second)


def test_a_lone_cr_at_the_very_end_still_ends_its_event():
    decoder = SseDecoder()
    assert decoder.feed(b"data: x\r\r") == []  # the last \r might be half of \r\n: held
    assert decoder.close() == [SseEvent("x")]


def test_comments_alone_dispatch_nothing_and_empty_chunks_are_harmless():
    decoder = SseDecoder()
    assert decoder.feed(b"") == [] and decoder.feed(b": keep-alive\n\n:\n\n") == []
    assert decoder.feed(b"data: 1\n") == [] and decoder.feed(b"\n") == [SseEvent("1")]


def test_the_async_source_gives_the_same_events():
    async def chunks():
        for i in range(0, len(BODY), 4):
            yield BODY[i : i + 4]

    async def collect() -> list[SseEvent]:
        return [event async for event in aiter_events(chunks())]

    assert asyncio.run(collect()) == EXPECTED


# ----- the chat accumulator on decoded events -----------------------------------------------------------------
def _chunk(**fields) -> str:
    return "data: " + json.dumps({"id": "r1", "object": "chat.completion.chunk", **fields}) + "\n\n"


SGLANG_STREAM = "".join(
    [
        ": keep-alive\n\n",
        _chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
        _chunk(choices=[{"index": 0, "delta": {"reasoning_content": "Let me "}}]),
        "event: sglext_ids\ndata: [[9, 9]]\n\n",  # a list: read as a chunk it would be refused
        _chunk(choices=[{"index": 0, "delta": {"reasoning_content": "think."}}]),
        ": keep-alive\n\n",
        _chunk(choices=[{"index": 0, "delta": {"content": "Four."}}]),
        _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        _chunk(
            choices=[], sglext={"input_ids": [1, 2], "output_ids": [[5, 6, 7]], "spec_tokens_details": {}}
        ),
        _chunk(choices=[], usage={"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}),
        "data: [DONE]\n\n",
    ]
).encode()


def accumulate(raw: bytes, step: int) -> ChatAccumulator:
    answer = ChatAccumulator("http://server", stream=True)
    for event in iter_events(raw[i : i + step] for i in range(0, len(raw), step)):
        answer.add_event(event)
    return answer


@pytest.mark.parametrize("step", [1, 13, 4096])
def test_a_stream_reads_the_same_in_any_chunking(step):
    result = accumulate(SGLANG_STREAM, step).result()
    assert (result.reasoning_content, result.content, result.finish_reason) == (
        "Let me think.",
        "Four.",
        "stop",
    )
    # the choices: [] chunks carried the ids and the usage; the named event was not taken for a chunk
    assert (result.prompt_ids, result.output_ids) == ([1, 2], [5, 6, 7])
    assert (result.prompt_tokens, result.completion_tokens, result.usage_reported) == (2, 3, True)
    assert result.done_sentinel is True and len(result.chunk_offsets) == 3


def test_a_stream_without_done_says_so():
    raw = SGLANG_STREAM.removesuffix(b"data: [DONE]\n\n")
    result = accumulate(raw, 64).result()
    assert result.done_sentinel is False and result.content == "Four."


def test_a_stream_cut_before_its_finish_is_a_protocol_error():
    cut = SGLANG_STREAM[: SGLANG_STREAM.index(b'"finish_reason": "stop"') - 20]
    with pytest.raises(RequestError) as caught:
        accumulate(cut, 64).result()
    assert caught.value.kind == "protocol" and caught.value.retryable


@pytest.mark.parametrize("data", ["{not json", "[1, 2]"])
def test_a_chunk_that_is_not_a_json_object_is_a_protocol_error(data):
    answer = ChatAccumulator("http://server", stream=True)
    with pytest.raises(RequestError) as caught:
        answer.add_event(SseEvent(data))
    assert caught.value.kind == "protocol"


def test_an_error_object_in_the_stream_is_a_protocol_error():
    answer = ChatAccumulator("http://server", stream=True)
    with pytest.raises(RequestError, match="error in stream"):
        answer.add_event(SseEvent(json.dumps({"error": {"message": "out of memory"}})))


def test_vllm_ids_accumulate_per_delta():
    raw = "".join(
        [
            _chunk(
                prompt_token_ids=[1, 2], choices=[{"index": 0, "delta": {"content": "a"}, "token_ids": [5]}]
            ),
            _chunk(choices=[{"index": 0, "delta": {"content": "b"}, "token_ids": [6, 7]}]),
            _chunk(choices=[{"index": 0, "delta": {}, "token_ids": [], "finish_reason": "length"}]),
        ]
    ).encode()
    result = accumulate(raw, 5).result()
    assert (result.prompt_ids, result.output_ids, result.content) == ([1, 2], [5, 6, 7], "ab")


def test_stream_chat_reads_the_same_stream_sent_a_few_bytes_at_a_time():
    """Over a real socket: keep-alive comments, a named event and ``choices: []`` chunks, in 7-byte writes."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        for i in range(0, len(SGLANG_STREAM), 7):
            await reply.write(SGLANG_STREAM[i : i + 7])
        await reply.write_eof()
        return reply

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)

    async def work(url: str):
        async with ServerClient(url, capabilities=Capabilities("sglang", token_ids="sglext")) as client:
            return await client.stream_chat([{"role": "user", "content": "2+2?"}], SamplingParams(), "m")

    result = serve(app, work)
    assert (result.reasoning_content, result.content, result.output_ids) == (
        "Let me think.",
        "Four.",
        [5, 6, 7],
    )
    assert result.done_sentinel is True and result.usage_reported


def test_the_decoder_needs_only_the_standard_library():
    """The SGLang tier's recorders import it into a venv without draftgen's dependencies (no site-packages here)."""
    src = Path(__file__).resolve().parents[1] / "src"
    code = f"import sys; sys.path.insert(0, {str(src)!r}); import draftgen.client.sse as s; print(s.decode_events(b'data: 1\\n\\n'))"
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "SseEvent(data='1'" in result.stdout, result.stderr
