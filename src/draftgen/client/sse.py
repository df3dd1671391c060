"""Server-sent events from bytes in any chunking: the one SSE decoder of draftgen, its tests and recorders included.

The rules are the WHATWG event-stream format's: a line ends in ``\\n``, ``\\r\\n`` or ``\\r``; a blank line ends an
event; a line starting with ``:`` is a comment (servers send them as keep-alives); ``field: value`` loses one space
after the colon; several ``data`` lines join with ``\\n``; an event without data is not dispatched; an ``event:``
line names the event (SGLang's ``sglext_ids``, sent only on request). Bytes after the last blank line are an
incomplete event and are dropped, so a stream cut mid-event never yields half a payload.

Standard library only: the SGLang tier's recorders import this module into a venv without draftgen's dependencies.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import NamedTuple

BOM = b"\xef\xbb\xbf"


class SseEvent(NamedTuple):
    """One dispatched event (a tuple: thousands arrive per second when a benchmark holds hundreds of streams)."""

    data: str
    event: str | None = None  # None: no ``event:`` line, the default "message" type
    id: str | None = None  # the last ``id:`` seen, which the format carries over to later events


class SseDecoder:
    """Feed it bytes as they arrive; it hands back each event whose blank line has come."""

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events completed by ``chunk`` (often none, often one), in order."""
        buffer = self._buffer + chunk
        if not self._started:
            if len(buffer) < len(BOM) and BOM.startswith(buffer):
                self._buffer = buffer  # a BOM split across chunks: wait for the rest
                return []
            self._started = True
            buffer = buffer.removeprefix(BOM)
        if b"\r" in buffer:
            # A trailing \r may be the first half of \r\n: keep it until the next chunk says.
            held = buffer.endswith(b"\r")
            body = buffer[:-1] if held else buffer
            buffer = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")
        *lines, self._buffer = buffer.split(b"\n")
        events: list[SseEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(SseEvent("\n".join(self._data), self._event, self._id))
                self._data = []
                self._event = None
            elif line[0] != 0x3A:  # ":" starts a comment
                self._field(line.decode("utf-8", errors="replace"))
        return events

    def close(self) -> list[SseEvent]:
        """At the end of the body: a held ``\\r`` ends its line after all; anything else unfinished is dropped."""
        if not self._buffer.endswith(b"\r"):
            return []
        return self.feed(b"\n")

    def _field(self, line: str) -> None:
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        # "retry" and unknown fields: nothing a client of one request needs


def decode_events(raw: bytes) -> list[SseEvent]:
    """Every complete event of a whole recorded body."""
    decoder = SseDecoder()
    return decoder.feed(raw) + decoder.close()


def iter_events(chunks: Iterable[bytes]) -> Iterator[SseEvent]:
    """Events as a blocking byte source (``requests``' ``iter_content``) yields them."""
    decoder = SseDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()


async def aiter_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[SseEvent]:
    """Events as an async byte source (an HTTP response's body) yields them."""
    decoder = SseDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.close():
        yield event
