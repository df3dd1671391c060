"""The earlier answers a later turn's prompt holds, as long as the target writes them: what the estimate prices with.

Generate fills each earlier answer of a conversation with the target's own (``training.conversation``): its text
after the reasoning, the part a later request carries (the chat template keeps no earlier reasoning). Before the run
those answers do not exist. The prompt audit stands the source's own answers in for them, which is what a reader of
the prompt file wants, but a thinking model's answers are longer than most sources', so its later turns have less
room and more of them are set aside. The estimate therefore prices later turns with answers drawn from what the
benchmark measured: pairs of (completion tokens, answer tokens), from the benchmark's requests of the
conversation's category when it measured at least ``MIN_CATEGORY_REQUESTS`` of them, else from all of them, each cut
at its turn's room as generate cuts it (``kept_answer``). They carry, too, how often the target's answer at an
agentic answer point diverged from the source's (``divergence``, measured by the same benchmark): the estimate ends a
conversation there as often.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from draftgen.prompts.divergence import DivergenceDraw, DivergenceShares

MIN_CATEGORY_REQUESTS = 30  # fewer measured requests of a category: its answers are drawn from all of them
AnswerDraw = Callable[[], tuple[int, int]]  # → (completion tokens, answer tokens) of one regenerated turn


def kept_answer(completion: int, answer: int, room: int) -> int:
    """The answer tokens a later prompt holds of a turn that would generate ``completion`` tokens, the last
    ``answer`` of them after its reasoning, sent with max_tokens ``room``: all of them when it ends within the room,
    else the part of the answer that falls within it (none when the cut comes inside the reasoning)."""
    if completion <= room:
        return answer
    return max(0, answer - (completion - room))


@dataclass(frozen=True)
class AnswerLengths:
    """Regenerated turns as measured: each one's completion tokens and answer tokens, and its prompt category."""

    completion: np.ndarray  # completion tokens per measured request
    answer: np.ndarray  # of them, the tokens after the reasoning
    source: str  # where they were measured, for the notes
    groups: Mapping[str, np.ndarray] = field(default_factory=dict)  # category → its requests' indices
    divergence: DivergenceShares | None = None  # None: the benchmark compared no agentic answer (older ones)

    @classmethod
    def of(
        cls,
        completion: Sequence[int],
        answer: Sequence[int],
        categories: Sequence[str | None],
        source: str,
        divergence: DivergenceShares | None = None,
    ) -> AnswerLengths:
        if not len(completion) or len(completion) != len(answer) or len(answer) != len(categories):
            raise ValueError("answer lengths need one completion, answer and category per measured request")
        by: dict[str, list[int]] = {}
        for index, category in enumerate(categories):
            if category is not None:
                by.setdefault(category, []).append(index)
        return cls(
            completion=np.asarray(completion, dtype=np.int64),
            answer=np.minimum(np.asarray(answer, dtype=np.int64), np.asarray(completion, dtype=np.int64)),
            source=source,
            groups={k: np.asarray(v) for k, v in by.items() if len(v) >= MIN_CATEGORY_REQUESTS},
            divergence=divergence,
        )

    @property
    def note(self) -> str:
        categories = f" (by category for {', '.join(sorted(self.groups))})" if self.groups else ""
        return (
            "each earlier answer in a later turn's prompt is as long as the target's: a draw of a measured "
            f"request's answer tokens from {self.source}{categories}, cut at that turn's room as generate cuts it; "
            "an answer with tool calls stands as the source's, and one cut before its calls ends the conversation"
            + (f"; {self.divergence.note}" if self.divergence is not None else "")
        )

    def drawer(self, category: str | None, rng: np.random.Generator) -> AnswerDraw:
        """Draws for one conversation: from its category's requests when measured enough, else from all."""
        pool = self.groups.get(category) if category is not None else None

        def draw() -> tuple[int, int]:
            index = (
                int(pool[rng.integers(pool.size)])
                if pool is not None
                else int(rng.integers(self.answer.size))
            )
            return int(self.completion[index]), int(self.answer[index])

        return draw

    def diverger(self, rng: np.random.Generator) -> DivergenceDraw | None:
        """Divergence draws for one conversation (``DivergenceShares.drawer``); None when none was measured."""
        return self.divergence.drawer(rng) if self.divergence is not None else None
