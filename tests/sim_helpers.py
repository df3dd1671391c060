"""Raw-HTTP helpers for the simulator tests (stdlib urllib, so they read exactly what goes over the wire),
``serve`` for tests that stand a small aiohttp app in for a server, and ``FleetView``: one test's view of a fleet
the worker shares."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from draftgen.client.sse import decode_events
from draftgen.sim import SimFleet
from draftgen.sim.tokenizer import SimTokenizer

USER = [{"role": "user", "content": "What is 17 times 23? Show the steps."}]


def post(url: str, body: dict, timeout: float = 30.0) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post_json(url: str, body: dict, timeout: float = 30.0) -> tuple[int, dict]:
    status, raw = post(url, body, timeout)
    return status, json.loads(raw) if raw else {}


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> dict:
    status, raw = get(url)
    assert status == 200, (url, status, raw)
    return json.loads(raw)


def sse_lines(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (draftgen's own decoder); asserts the framing: nothing but
    ``data: ...`` + blank line per event, as SGLang writes it."""
    events = decode_events(raw)
    framed = b"".join(b"data: " + event.data.encode() + b"\n\n" for event in events)
    assert raw == framed, raw[-200:]
    return [event.data for event in events]


def sse_json(raw: bytes) -> tuple[list[dict], bool]:
    """(JSON events, whether the stream ended with ``data: [DONE]``)."""
    lines = sse_lines(raw)
    done = bool(lines) and lines[-1] == "[DONE]"
    if done:
        lines = lines[:-1]
    assert "[DONE]" not in lines
    return [json.loads(line) for line in lines], done


def scrape(base_url: str) -> dict[str, object]:
    """/metrics parsed with prometheus_client: family name → family."""
    status, raw = get(f"{base_url}/metrics")
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(raw.decode())}


def sample_value(families: dict, family: str, sample: str | None = None) -> float:
    name = sample or family
    values = [s.value for s in families[family].samples if s.name == name]
    assert len(values) == 1, (family, name, families[family].samples)
    return values[0]


def wait_for(condition: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    """Poll until ``condition()`` is truthy; fail with ``what`` after ``timeout`` seconds (a wait, not a timing test)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def truth_for(fleet, rid: str, index: int | None = None, timeout: float = 20.0) -> dict:
    """The ground-truth record of request ``rid`` (waits for the server to write it)."""

    def find() -> dict | None:
        matches = [r for r in fleet.truth(index) if r["rid"] == rid]
        assert len(matches) <= 1, f"request {rid} recorded {len(matches)} times"
        return matches[0] if matches else None

    return wait_for(find, timeout, f"truth record of {rid}")  # type: ignore[return-value]


async def post_many(url: str, bodies: list[dict], limit_s: float = 60.0) -> list[tuple[int, dict]]:
    """POST every body at once (one aiohttp session): [(status, JSON reply)] in order."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_s)) as session:

        async def one(body: dict) -> tuple[int, dict]:
            async with session.post(url, json=body) as response:
                return response.status, await response.json(content_type=None)

        return list(await asyncio.gather(*(one(body) for body in bodies)))


def max_overlap(records: list[dict]) -> int:
    """Most requests running at once according to the truth ([admitted, finished] intervals)."""
    events = []
    for record in records:
        if record.get("admitted") is not None:
            events.append((record["admitted"], 1))
            events.append((record["finished"], -1))
    events.sort(key=lambda e: (e[0], e[1]))  # at a tie, a finish frees its slot before an admission
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def serve(app: web.Application, work: Callable[[str], Awaitable[object]]) -> object:
    """Run ``app`` on a free local port, return ``await work(its base URL)``, then stop it (pass or fail)."""

    async def go() -> object:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await work(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    return asyncio.run(go())


@functools.cache
def _tokenizer(folder: str) -> SimTokenizer:
    return SimTokenizer(folder)


def tokenizer_of(fleet: SimFleet) -> SimTokenizer:
    """The tokenizer a fleet's servers speak (the one they count, render and report ids with)."""
    return _tokenizer(str(fleet.tokenizer))


def count(fleet: SimFleet, text: str | None) -> int:
    """Tokens of ``text`` in the fleet's tokenizer."""
    return len(tokenizer_of(fleet).encode(text or ""))


def prompt_ids(
    fleet: SimFleet, messages: list[dict], thinking: bool = True, tools: list[dict] | None = None
) -> list[int]:
    """The ids of a chat prompt (with its ``tools``) as the fleet's servers render and encode it."""
    tokenizer = tokenizer_of(fleet)
    return tokenizer.encode(tokenizer.render(messages, thinking, tools))


def prompt_count(
    fleet: SimFleet, messages: list[dict], thinking: bool = True, tools: list[dict] | None = None
) -> int:
    return len(prompt_ids(fleet, messages, thinking, tools))


def eos_id(fleet: SimFleet) -> int:
    return tokenizer_of(fleet).eos_id


@dataclass
class FleetView:
    """The first ``servers`` servers of a fleet the worker shares, as one test sees them: their URLs and tokenizer,
    and only the ground truth recorded since the view was taken (``truth``). It offers nothing that changes the
    fleet (no kill, restart or faults), so a test that needs one asks for a fleet of its own."""

    fleet: SimFleet
    servers: int
    _marks: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        assert 1 <= self.servers <= self.fleet.servers, (self.servers, self.fleet.servers)
        wait_for(self._idle, 60.0, "the shared fleet's servers to finish the last test's requests")
        self._marks = [len(self._lines(i)) for i in range(self.servers)]

    @property
    def urls(self) -> list[str]:
        return self.fleet.urls[: self.servers]

    @property
    def tokenizer(self) -> Path | None:
        return self.fleet.tokenizer

    def truth(self, index: int | None = None) -> list[dict]:
        """What the servers (or server ``index``) recorded since the view was taken, in order."""
        indices = range(self.servers) if index is None else [index]
        return [json.loads(line) for i in indices for line in self._lines(i)[self._marks[i] :]]

    def _lines(self, index: int) -> list[str]:
        path = self.fleet.truth_path(index)
        return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def _idle(self) -> bool:
        """No request running or queued on any of the view's servers (a straggler of the last test would add to
        this one's truth)."""
        for url in self.urls:
            families = scrape(url)
            if sample_value(families, "sglang:num_running_reqs") or sample_value(
                families, "sglang:num_queue_reqs"
            ):
                return False
        return True
