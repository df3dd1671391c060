"""How often the target's answer at an agentic answer point ends the conversation, as the benchmark measured it.

Generate ends an agentic conversation at the first answer the source's next messages do not follow from
(``training.conversation.follow_up``), and sends none of its later answer points. The benchmark asks each agentic
row at one answer point the source followed with an assistant message and records whether the target's answer there
``diverged`` (``bench.answer_point``). The estimate draws a divergence at each such point with the share measured
for its kind: where the source called tools, and where it answered in text (the target rarely diverges from a text
answer, often from a call). A kind measured fewer than ``MIN_KIND_REQUESTS`` times takes the share of both kinds
pooled; none measured, no divergence is drawn. A request cut at max_tokens is left out of both counts: the estimate
prices an answer cut before its calls from the drawn lengths already (``turn_budgets.ENDED``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_KIND_REQUESTS = 10  # fewer compared requests of a kind: its share is that of both kinds pooled
DivergenceDraw = Callable[[bool], bool]  # source called at the point → the target's answer diverged


@dataclass(frozen=True)
class DivergenceShares:
    """Compared requests of each kind of answer point, and how many of them diverged."""

    called_diverged: int
    called: int  # compared where the source's reply called tools
    text_diverged: int
    text: int  # compared where the source's reply was text
    source: str  # where they were measured, for the note

    @classmethod
    def of(cls, source_called: Sequence[bool], diverged: Sequence[bool], source: str) -> DivergenceShares:
        if len(source_called) != len(diverged):
            raise ValueError("divergence shares need one kind and one outcome per compared request")
        called = [d for c, d in zip(source_called, diverged, strict=True) if c]
        text = [d for c, d in zip(source_called, diverged, strict=True) if not c]
        return cls(sum(called), len(called), sum(text), len(text), source)

    @property
    def compared(self) -> int:
        return self.called + self.text

    def share(self, source_called: bool) -> float:
        """The share of answers that diverge at a point of this kind (the pooled share when it was measured too
        rarely; 0 when nothing was compared)."""
        diverged, compared = (
            (self.called_diverged, self.called) if source_called else (self.text_diverged, self.text)
        )
        if compared < MIN_KIND_REQUESTS:
            diverged, compared = self.called_diverged + self.text_diverged, self.compared
        return diverged / compared if compared else 0.0

    @property
    def note(self) -> str:
        if not self.compared:
            return "no agentic answer was compared with the source's, so no conversation is ended by a divergence"
        pooled = min(self.called, self.text) < MIN_KIND_REQUESTS
        return (
            f"an agentic conversation ends at an answer that diverges from the source's, as {self.source} measured: "
            f"{self.share(True):.1%} where the source called tools ({self.called_diverged} of {self.called}), "
            f"{self.share(False):.1%} where it answered in text ({self.text_diverged} of {self.text})"
            + (
                f"; a kind compared fewer than {MIN_KIND_REQUESTS} times takes both kinds' share"
                if pooled
                else ""
            )
        )

    def drawer(self, rng: np.random.Generator) -> DivergenceDraw:
        """Draws for one conversation, from ``rng`` (a kind whose share is 0 draws nothing, so a benchmark that
        measured no divergence leaves every other draw as it was)."""

        def diverges(source_called: bool) -> bool:
            share = self.share(source_called)
            return share > 0 and bool(rng.random() < share)

        return diverges
