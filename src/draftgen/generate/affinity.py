"""Prefix affinity: which server a piece of work should wait for, so that the prefix a server already holds is used.

SGLang keeps what it prefilled in its prefix (radix) cache, one cache per server. Turn k+1 of a conversation
carries turn k's prompt, and a sampling plan sends one prompt several times: sent to the server that prefilled the
earlier request, the new one prefills only what is new. Dispatch is pull-based (whichever server frees a slot
takes the next work): a prompt's samples then meet on one server about one time in seven, and a conversation's
next turn, though usually taken by the worker its answer freed, moves whenever a retry came due first.

The rule (docs/generate.md, "Prefix affinity"): a conversation's next turn, and a prompt's later sample, have a
*home*, the server that served the previous one (the turn's answer; the first sample, once it has streamed a token
there when the run streams). Work with a home waits in that server's lane of the queue
(``draftgen.generate.work.WorkQueue``), which a free worker of that server takes before anything else. Any other
server's worker takes it once it has been ready to go home for ``hold_s`` (then it counts as any work under way,
before fresh prompts), or at once when that worker would otherwise have nothing to do: the preference is bounded
and never leaves a slot idle. A home that is down (benched) or slow (its median per-request rate below the hedger's
slow ratio × the fleet's, ``hedge.RateBook``) is no home: its work is open to every server at once.

This module decides; the queue keeps the lanes and the dispatcher sends.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftgen.generate.hedge import HedgePolicy, RateBook
from draftgen.generate.work import Home, Work

if TYPE_CHECKING:
    from draftgen.generate.config import GenerateConfig
    from draftgen.generate.fleet_health import Server

SAMPLE_HOMES = 1024  # prompts whose first sample is remembered (the latest: the reader queues a prompt's samples together)
SLOW_EVERY_S = 2.0  # how often the set of slow servers is read again from the rate book


@dataclass(frozen=True)
class AffinitySettings:
    hold_s: float  # how long work waits for its home's free slot before any server takes it; 0: no affinity
    slow_ratio: float  # a server slower than this × the fleet's median per-request rate is no home (0: never)
    wait_for_prefill: bool = True  # streamed: a later sample waits for its first to stream a token at home

    @property
    def enabled(self) -> bool:
        return self.hold_s > 0


class PrefixAffinity:
    """Homes of work under way, and whether a server may still be one."""

    def __init__(self, settings: AffinitySettings, servers: Sequence[Server], rates: RateBook) -> None:
        self.settings = settings
        self._servers = {s.url: s for s in servers}
        self._rates = rates
        # prompt id → (the server its first sample went to, that sample)
        self._sample_homes: OrderedDict[str, tuple[str, Work]] = OrderedDict()
        self._slow: set[str] = set()
        self._slow_read_at: float | None = None

    @property
    def hold_s(self) -> float:
        return self.settings.hold_s

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def home(self, work: Work) -> Home | None:
        """Where ``work`` should wait, or None: no affinity, or its home cannot take it now. A later sample waits
        for its prompt's first sample to stream a token on that server, when the run streams (its prefill is
        done then; a sample admitted with the first in one prefill step would find nothing cached)."""
        if not self.settings.enabled:
            return None
        if work.prefer is not None:  # a conversation's next turn: the previous one is answered, prefilled
            return Home(work.prefer) if self.can_host(work.prefer) else None
        prompt = work.conversation.prompt
        if work.conversation.turn or work.attempts or prompt.prompt_id is None:
            return None
        first = self._sample_homes.get(prompt.prompt_id)  # a later sample of a prompt already sent
        if first is None or first[1] is work or not self.can_host(first[0]):
            return None
        return Home(first[0], first[1] if self.settings.wait_for_prefill else None)

    def taken(self, work: Work, url: str) -> None:
        """A worker of ``url`` took ``work``: a prompt's first sample makes ``url`` its other samples' home."""
        prompt = work.conversation.prompt
        if not self.settings.enabled or prompt.prompt_id is None or work.conversation.turn or work.attempts:
            return
        homes = self._sample_homes
        earlier = homes.get(prompt.prompt_id)
        if earlier is None or not self.can_host(earlier[0]):
            homes[prompt.prompt_id] = (url, work)
        homes.move_to_end(prompt.prompt_id)
        while len(homes) > SAMPLE_HOMES:
            homes.popitem(last=False)

    def can_host(self, url: str) -> bool:
        """Up, and not slow."""
        server = self._servers.get(url)
        return server is not None and server.up and url not in self._slow_servers()

    def _slow_servers(self) -> set[str]:
        ratio = self.settings.slow_ratio
        if ratio <= 0:
            return set()
        now = self._now()
        if self._slow_read_at is None or now - self._slow_read_at >= SLOW_EVERY_S:
            up = [url for url, server in self._servers.items() if server.up]
            self._slow = self._rates.slow_servers(up, HedgePolicy(ratio))
            self._slow_read_at = now
        return self._slow


def prefix_affinity(
    config: GenerateConfig, servers: Sequence[Server], rates: RateBook
) -> PrefixAffinity | None:
    """The run's affinity (None with ``affinity_hold_s`` 0: the queue is then the plain pull-based one)."""
    settings = AffinitySettings(config.affinity_hold_s, config.hedge_slow_ratio, config.stream)
    return PrefixAffinity(settings, servers, rates) if settings.enabled else None
