"""The stages ``draftgen serve`` shows for each process: what its health probe says while it starts
(``introspect.StartupStage``: refused, 503, no answer, http error, ready) and what the supervisor itself knows of the
process (``ProcessStage``: started, exited, waiting to restart, failed for good, stopped)."""

from __future__ import annotations

import enum

from draftgen.client.introspect import StartupStage


class ProcessStage(enum.Enum):
    STARTING = "starting"
    EXITED = "exited"
    BACKOFF = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    ProcessStage.STARTING: "process started, not probed yet",
    ProcessStage.EXITED: "process exited",
    ProcessStage.BACKOFF: "waiting before a restart",
    ProcessStage.FAILED: "down for good (no restarts left)",
    ProcessStage.STOPPED: "stopped by draftgen serve",
}

Stage = StartupStage | ProcessStage
