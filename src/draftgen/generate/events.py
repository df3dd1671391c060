"""What dispatch tells the rest of the run: an answer kept, a conversation failed for good, a note for the log.

The dispatcher decides and sends; it never writes a file or judges an answer. Whoever runs it (``RunSession``;
a recorder in unit tests) takes these events to the store, the garbage guard, the progress bar and the event
log. A sink that must stop the run (the guard tripping) raises ``StopRun``: the dispatcher halts with it.
"""

from __future__ import annotations

from typing import Any, Protocol

from draftgen.client.errors import RequestError
from draftgen.client.records import ChatResult


class StopRun(RuntimeError):
    """Raised by an events sink to halt the run; finished work is kept."""


class DispatchEvents(Protocol):
    def kept(
        self,
        server: str,
        label: str,
        result: ChatResult,
        row: dict[str, Any] | None,
        thinking: bool | None = None,
        budget_by: str = "max_tokens",
    ) -> None:
        """A turn's answer was kept (``label``: its prompt id, and turn when there are several); ``row`` is the
        conversation's stored row when that was its last turn; ``thinking``: whether it was asked to think (None: as
        the run); ``budget_by``: which limit set its max_tokens (draftgen.generate.length_cap)."""

    def failed(self, server: str | None, label: str, row: dict[str, Any], error: RequestError) -> None:
        """A turn failed its last attempt: ``row`` goes to failed.parquet."""

    def set_aside(
        self,
        label: str,
        reason: str,
        row: dict[str, Any] | None,
        rejected: dict[str, Any] | None,
        why: str = "max_length",
    ) -> None:
        """A turn's prompt left it no room under the trainer's max_length, or less than min_turn_budget (``why``:
        length_cap.NO_ROOM or BELOW_FLOOR), and it was not sent: ``row`` is its conversation's stored row up to the
        turn before, or, when it was the first turn, ``rejected`` is the prompt's rejected.parquet row."""

    def note(self, server: str, what: str) -> None:
        """Something a person watching the run should read (a server benched, a deadline learned)."""
