"""One readiness probe of a server, classified into SGLang's start-up stages (docs/engines.md).

- refused: nothing listens on the port yet (SGLang opens it only after the weights are loaded)
- warming: the port answers but the health endpoint says 503 (warm-up request not run yet)
- ready:   200 from the health endpoint (``/health_generate`` runs a real 1-token generation)
- silent:  connected, but no answer within the probe timeout (a busy or stuck server)
- error:   any other HTTP status
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import aiohttp


class Stage(enum.Enum):
    STARTING = "starting"
    REFUSED = "refused"
    WARMING = "503"
    SILENT = "no answer"
    ERROR = "http error"
    READY = "ready"
    EXITED = "exited"
    BACKOFF = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    Stage.STARTING: "process started, not probed yet",
    Stage.REFUSED: "connection refused: loading weights, port not open yet",
    Stage.WARMING: "HTTP 503: port open, warm-up not finished",
    Stage.SILENT: "connected but no answer within the probe timeout",
    Stage.ERROR: "unexpected HTTP status",
    Stage.READY: "HTTP 200: generates tokens",
    Stage.EXITED: "process exited",
    Stage.BACKOFF: "waiting before a restart",
    Stage.FAILED: "down for good (no restarts left)",
    Stage.STOPPED: "stopped by draftgen serve",
}


@dataclass(frozen=True)
class ProbeResult:
    stage: Stage
    detail: str = ""  # e.g. the HTTP status for Stage.ERROR


async def probe(session: aiohttp.ClientSession, url: str, timeout_s: float) -> ProbeResult:
    """GET ``url`` once and say which start-up stage the answer means. Never raises for network trouble."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            await response.read()
            if response.status == 200:
                return ProbeResult(Stage.READY)
            if response.status == 503:
                return ProbeResult(Stage.WARMING)
            return ProbeResult(Stage.ERROR, f"HTTP {response.status}")
    except aiohttp.ClientConnectorError:
        return ProbeResult(Stage.REFUSED)
    except TimeoutError:
        return ProbeResult(Stage.SILENT, f"no answer in {timeout_s:g}s")
    except aiohttp.ClientError as exc:
        # The server closed the connection mid-answer (often: it is going down).
        return ProbeResult(Stage.ERROR, type(exc).__name__)
