"""Which servers take work: benched after failures or silence, probed, and back when healthy.

A server is marked down after ``server_down_after`` consecutive failures that say the server itself is unwell
(connection, timeout, 5xx), or when it has been silent for ``server_silence_s`` with requests in flight and its
``/health_generate`` fails (a wedged scheduler while ``/health`` still says 200). Its in-flight requests are
evicted (handed back to the queue, the attempt not counted); a prober asks ``/health_generate`` with backoff and
the server rejoins on a 200. While every server is down the run waits, spending no attempts, for up to
``all_down_timeout_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from draftgen.client import introspect
from draftgen.client.errors import RequestError
from draftgen.client.records import ChatResult
from draftgen.generate.config import GenerateConfig
from draftgen.generate.deadline import ServerDeadline
from draftgen.generate.work import Flight, FlightState

SILENCE_POLL_S = 5.0  # how often the silence watch looks (at most; a quarter of server_silence_s if shorter)
SILENCE_HEALTH_TIMEOUT_S = 30.0  # SGLang's /health_generate itself gives up after 20 s


class AllServersDown(RuntimeError):
    pass


@dataclass
class ServerStats:
    url: str
    completed: int = 0
    completion_tokens: int = 0
    errors: int = 0
    downs: int = 0
    down_s: float = 0.0
    accept_sum: float = 0.0  # spec_accept_length summed over the requests that reported it
    accept_n: int = 0
    hedges: int = 0  # copies of another server's running requests sent here
    hedge_wins: int = 0  # of those, answered here first (the answer kept is this server's)
    cached_tokens: int = 0  # prompt tokens its prefix cache held, over the answers that said (cached_tokens)
    cache_prompt_tokens: int = 0  # those answers' prompt tokens

    def count_answer(self, result: ChatResult) -> None:
        self.completed += 1
        self.completion_tokens += result.completion_tokens or 0
        if result.spec_accept_length is not None:
            self.accept_sum += result.spec_accept_length
            self.accept_n += 1
        if result.cached_tokens is not None and result.prompt_tokens is not None:
            self.cached_tokens += result.cached_tokens
            self.cache_prompt_tokens += result.prompt_tokens


class ChatClient(Protocol):
    """What dispatch needs of a server's client (``ServerClient``; fakes in unit tests)."""

    url: str

    async def chat(
        self,
        messages,
        sampling,
        model,
        *,
        stream: bool,
        timeout_s: float | None,
        max_tokens: int | None = None,
        seed: int | None = None,
        tools=None,
        on_first_token: Callable[[], None] | None = None,
    ): ...

    async def get(self, path: str, timeout_s: float = 30.0) -> tuple[int | None, str]: ...

    async def close(self) -> None: ...


@dataclass(eq=False)
class Server:
    """One server as dispatch sees it: its client, health and requests in flight."""

    index: int
    client: ChatClient
    deadline: ServerDeadline
    stats: ServerStats
    up: bool = True
    up_event: asyncio.Event = field(default_factory=asyncio.Event)
    down_event: asyncio.Event = field(default_factory=asyncio.Event)
    consecutive_failures: int = 0
    down_since: float | None = None  # loop time
    in_flight: dict[int, Flight] = field(default_factory=dict)
    # Last reply of any kind, or the send that ended an idle spell (loop time): the silence watch measures from here.
    last_answer: float = 0.0

    def __post_init__(self) -> None:
        self.up_event.set()

    @property
    def url(self) -> str:
        return self.client.url


class FleetHealth:
    """Marks servers down and up; ``note`` is told why, in words a person reads in the event log."""

    def __init__(self, config: GenerateConfig, servers: list[Server], note: Callable[[str, str], None]):
        self.config = config
        self.servers = servers
        self._note = note
        self._all_down_since: float | None = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def failed(self, server: Server, error: RequestError) -> None:
        """Count one failed request against ``server``; bench it after ``server_down_after`` in a row."""
        server.stats.errors += 1
        if not error.server_fault:
            return
        server.consecutive_failures += 1
        if server.up and server.consecutive_failures >= self.config.server_down_after:
            self.mark_down(server, f"{server.consecutive_failures} consecutive failures (last: {error})")

    def answered(self, server: Server) -> None:
        server.consecutive_failures = 0

    def mark_down(self, server: Server, why: str) -> None:
        server.up = False
        server.up_event.clear()
        server.down_event.set()
        now = self._now()
        server.down_since = now
        server.stats.downs += 1
        evicted = 0
        for flight in server.in_flight.values():
            if flight.running and flight.scope is not None:
                evicted += 1
            flight.end_early(FlightState.EVICTED, now)
        self._note(
            server.url, f"marked down after {why}; {evicted} in-flight request(s) handed to other servers"
        )

    def mark_up(self, server: Server) -> None:
        now = self._now()
        if server.down_since is not None:
            server.stats.down_s += now - server.down_since
        server.down_since = None
        server.consecutive_failures = 0
        server.last_answer = now
        server.up = True
        server.down_event.clear()
        server.up_event.set()
        self._note(server.url, "healthy again (/health_generate 200): rejoined")

    def all_down_error(self) -> AllServersDown | None:
        """Called while the run waits: notes the moment every server is down, and gives up after the timeout."""
        if any(s.up for s in self.servers):
            self._all_down_since = None
            return None
        now = self._now()
        if self._all_down_since is None:
            self._all_down_since = now
            self._note("fleet", "every server is down: waiting for one to come back (no attempts spent)")
        elif now - self._all_down_since > self.config.all_down_timeout_s:
            return AllServersDown(
                f"every server has been down for {self.config.all_down_timeout_s:.0f} s "
                f"(all_down_timeout_s); finished work is saved — bring the servers back and resume"
            )
        return None

    def close(self) -> None:
        """The session ended: count the down time still running."""
        now = self._now()
        for server in self.servers:
            if server.down_since is not None:
                server.stats.down_s += now - server.down_since
                server.down_since = now

    # ----- tasks, one of each per server -------------------------------------------------------------------
    async def probe_while_down(self, server: Server) -> None:
        config = self.config
        while True:
            await server.down_event.wait()
            delay = config.probe_interval_s
            while not server.up:
                await asyncio.sleep(delay)
                health = await introspect.health(
                    server.client, generate=True, timeout_s=min(30.0, config.request_timeout_s)
                )
                if health.ok:
                    self.mark_up(server)
                else:
                    delay = min(delay * 2, config.probe_max_interval_s)

    async def watch_silence(self, server: Server) -> None:
        """A wedged scheduler answers nothing while /health says 200: after ``server_silence_s`` of silence with
        requests in flight, ask /health_generate (SGLang: 200 on any scheduler output, 503 after 20 s without)."""
        limit = self.config.server_silence_s
        while True:
            await asyncio.sleep(min(SILENCE_POLL_S, limit / 4))
            silent = self._now() - server.last_answer
            if not server.up or not server.in_flight or silent < limit:
                continue
            health = await introspect.health(server.client, generate=True, timeout_s=SILENCE_HEALTH_TIMEOUT_S)
            silent = self._now() - server.last_answer
            if not server.up or silent < limit:  # benched by its failures, or it answered meanwhile
                continue
            in_flight = len(server.in_flight)
            if health.ok:
                server.last_answer = self._now()  # alive, only slow: look again after another silence
                self._note(
                    server.url,
                    f"no answer for {silent:.0f} s with {in_flight} in flight, but /health_generate 200: waiting",
                )
                continue
            self.mark_down(
                server,
                f"{silent:.0f} s without an answer with {in_flight} in flight and /health_generate "
                f"{health.status or 'unanswered'} (server_silence_s {limit:g})",
            )
