"""The conversations a run sends, as the estimate's fleet simulation plays them (``model.estimate_wall``).

generate sends a conversation's turns one after another, each once the one before it is answered, and its next turn
goes back to the server that answered the last (docs/generate.md, "Prefix affinity"): a conversation holds one slot
for all its turns, so a long one finishing late is the drain of a multi-turn run. Each turn is sent with the room the
trainer's max_length leaves after its prompt (``prompts.turn_budgets``), so a long conversation's later turns are
short; a turn that answers with tool calls writes its reasoning and the calls rather than a text answer. The mean of
a turn's clipped length over every turn is computed exactly (``_ClipTable``: sorted rooms and running sums).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Conversations:
    """The conversations a run sends, as the fleet simulation plays them: a slot runs one conversation's turns one
    after another, as generate sends them, each turn's completion clipped at its room (the tokens the trainer's
    max_length leaves after its prompt, which shrinks turn by turn; inf: the full max_tokens). A turn that answers
    with tool calls writes its reasoning and those calls (``calls``: their tokens), not a text answer.
    ``ordered``: they are the whole set in generate's order (else a uniform sample, drawn at random)."""

    rooms: np.ndarray  # every turn's room, conversation after conversation
    turns: np.ndarray  # each conversation's turns (≥ 1)
    weights: np.ndarray  # each conversation's probability
    calls: np.ndarray | None = None  # every turn's tool-call tokens (0: a text answer); None: all in text
    ordered: bool = False
    # ordered: where each version of the whole set begins in ``turns`` (the versions the prompt audit drew)
    versions: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))

    @classmethod
    def of(
        cls,
        rooms: Sequence[Sequence[float]],
        calls: Sequence[Sequence[int]] = (),
        ordered: bool = False,
        draws: int = 1,
    ) -> Conversations:
        """Conversations given by their turns' rooms (and call tokens), each as likely: the prompt audit's, ``draws``
        versions of its counted conversations one after another (a conversation that sends nothing: no rooms)."""
        if calls and [len(c) for c in calls] != [len(r) for r in rooms]:
            raise ValueError("give one call count per turn of every conversation, or none")
        if draws < 1 or len(rooms) % draws:
            raise ValueError(f"{len(rooms)} conversations are not {draws} versions of one set")
        size = len(rooms) // draws
        sending = [i for i, r in enumerate(rooms) if len(r)]
        if not sending:
            raise ValueError("no conversation sends a turn")
        turns = np.fromiter((len(rooms[i]) for i in sending), dtype=np.int64, count=len(sending))
        flat_calls = np.concatenate([np.asarray(calls[i], dtype=float) for i in sending]) if calls else None
        return cls(
            rooms=np.concatenate([np.asarray(rooms[i], dtype=float) for i in sending]),
            turns=turns,
            weights=np.full(turns.size, 1.0 / turns.size),
            calls=flat_calls if flat_calls is not None and flat_calls.any() else None,
            ordered=ordered,
            versions=np.searchsorted(np.asarray(sending), np.arange(draws) * size),
        )

    @classmethod
    def uncapped(cls, counts: Mapping[int, int]) -> Conversations:
        """Conversations of ``k`` turns, ``counts[k]`` of them, every turn with the full max_tokens."""
        kept = {k: n for k, n in counts.items() if k > 0 and n > 0}
        if not kept:
            raise ValueError("every conversation needs at least one turn")
        turns = np.fromiter(kept, dtype=np.int64)
        weights = np.fromiter(kept.values(), dtype=float)
        return cls(rooms=np.full(int(turns.sum()), np.inf), turns=turns, weights=weights / weights.sum())

    @property
    def trivial(self) -> bool:
        """One turn each with the full max_tokens, in text: independent requests, nothing to model."""
        return bool((self.turns == 1).all() and np.isinf(self.rooms).all() and self.calls is None)

    @cached_property
    def mean_turns(self) -> float:
        return float(np.dot(self.turns, self.weights))

    @cached_property
    def _firsts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.turns)[:-1]])

    @cached_property
    def _clip_tables(self) -> tuple[_ClipTable | None, _ClipTable | None]:
        """(text turns, call turns), each as a table of its rooms (a call turn's less its calls: min(v + c, room) =
        min(v, room − c) + c) that clips any draw in one search."""
        shares = np.repeat(self.weights, self.turns)
        shares = shares / shares.sum()
        calls = np.zeros(self.rooms.size) if self.calls is None else self.calls
        called = calls > 0
        return tuple(  # type: ignore[return-value]
            _ClipTable.of(
                self.rooms[mask] - calls[mask], shares[mask], float(np.dot(calls[mask], shares[mask]))
            )
            if mask.any()
            else None
            for mask in (~called, called)
        )

    def mean_work(
        self,
        work: np.ndarray,
        tokens: np.ndarray,
        weights: np.ndarray | None = None,
        answers: np.ndarray | None = None,
    ) -> float:
        """The mean work of one turn, exactly: each draw (``tokens``, its ``work`` in proportion; a call turn writes
        ``tokens − answers`` and its calls) clipped at each turn's room, every turn weighted alike within its
        conversation's probability."""
        draw_weights = np.full(work.size, 1.0 / work.size) if weights is None else weights
        text, called = self._clip_tables
        total = np.zeros(tokens.size)
        if text is not None:
            total += text.sums(tokens)
        if called is not None:
            total += called.sums(tokens if answers is None else tokens - answers)
        return float(np.dot(total * work_ratio(work, tokens), draw_weights))

    def draw(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``count`` conversations (ordered: the last ``count`` of one version of the set, drawn at random, in order;
        else drawn by their probability): every turn's room and call tokens in order, and each one's turns."""
        if self.ordered:
            version = int(rng.integers(self.versions.size))
            start = int(self.versions[version])
            end = int(self.versions[version + 1]) if version + 1 < self.versions.size else self.turns.size
            picks = start + (np.arange(count) - count) % (end - start)
        else:
            picks = rng.choice(self.turns.size, size=count, replace=True, p=self.weights)
        counts = self.turns[picks]
        offsets = np.repeat(self._firsts[picks] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        index = offsets + np.arange(int(counts.sum()))
        calls = np.zeros(index.size) if self.calls is None else self.calls[index]
        return self.rooms[index], calls, counts

    def play(
        self,
        rng: np.random.Generator,
        count: int,
        tokens: np.ndarray,
        answers: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        ratio: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``count`` conversations (``draw``), each turn a draw of ``tokens`` (by ``weights``) clipped at its room (a
        call turn writes the draw's tokens less its ``answers``, and its calls), in work units by the draw's ``ratio``:
        every turn's work, and each conversation's sum (the job one slot runs)."""
        rooms, calls, counts = self.draw(rng, count)
        picks = rng.choice(tokens.size, size=rooms.size, replace=True, p=weights)
        reasoning = tokens if answers is None else tokens - answers
        written = np.where(calls > 0, reasoning[picks] + calls, tokens[picks])
        lengths = np.minimum(written, rooms) * (1.0 if ratio is None else ratio[picks])
        return lengths, np.add.reduceat(lengths, np.concatenate([[0], np.cumsum(counts)[:-1]]))


@dataclass(frozen=True)
class _ClipTable:
    """Rooms sorted with their running sums: Σ share · min(v, room) + added for any v in one binary search."""

    rooms: np.ndarray
    below_sum: np.ndarray  # Σ share · room over the rooms before each position (inf rooms never count)
    below_share: np.ndarray  # Σ share over the same
    added: float  # Σ share · what every turn adds (its calls)

    @classmethod
    def of(cls, rooms: np.ndarray, shares: np.ndarray, added: float) -> _ClipTable:
        order = np.argsort(rooms)
        rooms, shares = rooms[order], shares[order]
        return cls(
            rooms=rooms,
            below_sum=np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(rooms), rooms * shares, 0.0))]),
            below_share=np.concatenate([[0.0], np.cumsum(shares)]),
            added=added,
        )

    def sums(self, values: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.rooms, values, side="left")  # the rooms smaller than each value clip it
        return self.below_sum[at] + (self.below_share[-1] - self.below_share[at]) * values + self.added


def work_ratio(work: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Work per token of each draw (1 where it has no tokens)."""
    return np.divide(work, tokens, out=np.ones_like(work, dtype=float), where=tokens > 0)
