"""Prompt tokens per answer point against the trainer's max_length, counted before anything is sent.

Each answer point of a conversation (``training.conversation.answer_points``) is one request; its prompt holds the
conversation so far. Generate fills the earlier answers with the target's own (regenerated) ones; before the run
those do not exist, so the source's own assistant turns stand in for them here (a regenerated answer with thinking
on is often longer: the real prompts are at least this long, usually longer). Each request is judged by generate's
own rule, ``generate.length_cap.LengthCap.limit`` and ``TurnLimit.set_aside_by``: set aside (its prompt leaves no
room, or less than the floor ``min_turn_budget``), capped (the room the trainer's max_length leaves is below
``max_tokens``), or sent with the full ``max_tokens``. As in generate, a conversation's turns after the first one set
aside are set aside with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftgen.generate.length_cap import BELOW_FLOOR, NO_ROOM, LengthCap
from draftgen.training.conversation import Answer, answer_points, request_messages

CAPPED = "capped"  # sent with the room the trainer's max_length leaves (below max_tokens)
FULL = "full"  # sent with the full max_tokens
UNCOUNTED = "uncounted"  # the chat template could not render the prompt: generate sends it uncapped
CLASSES = (NO_ROOM, BELOW_FLOOR, CAPPED, FULL, UNCOUNTED)
CLASS_LABELS = {
    NO_ROOM: "set aside: no room (prompt ≥ max_length)",
    BELOW_FLOOR: "set aside: below min_turn_budget",
    CAPPED: "capped at max_length − prompt",
    FULL: "full max_tokens",
    UNCOUNTED: "not counted (template error; sent uncapped)",
}
SOURCE_ANSWERS_NOTE = (
    "the source's own assistant turns stand in for the regenerated answers of earlier turns (those do not exist "
    "before the run; with thinking on they are often longer, so real prompts are at least this long)"
)


@dataclass(frozen=True)
class TurnBudgets:
    """How the answer points of the counted conversations would be sent, by generate's rule."""

    tokenizer: str
    max_length: int
    min_turn_budget: int
    max_tokens: int
    conversations: int  # conversations counted
    of_conversations: int  # the conversations they were drawn from (uniformly, when fewer were counted)
    by_class: Mapping[str, int] = field(default_factory=dict)  # CLASSES → answer points
    prompt_tokens: Mapping[str, float] = field(default_factory=dict)  # per counted turn: p50, p90, p99, max
    sent_turns: Mapping[int, int] = field(
        default_factory=dict
    )  # answer points sent per conversation → conversations
    capped_rooms: tuple[int, ...] = ()  # the max_tokens each capped answer point is sent with (its room)

    @property
    def turns(self) -> int:
        return sum(self.by_class.values())

    @property
    def set_aside(self) -> int:
        return self.by_class.get(NO_ROOM, 0) + self.by_class.get(BELOW_FLOOR, 0)

    @property
    def sent_per_conversation(self) -> float:
        """Answer points sent per conversation (set-aside ones left out): what the estimate prices."""
        return (self.turns - self.set_aside) / self.conversations if self.conversations else 0.0

    def share(self, name: str) -> float:
        return self.by_class.get(name, 0) / self.turns if self.turns else 0.0

    def rooms(self) -> np.ndarray:
        """Each counted turn that is sent: the tokens it may generate under the trainer's max_length — its room where
        that is below max_tokens, else inf (the full max_tokens, whatever it is)."""
        full = self.by_class.get(FULL, 0) + self.by_class.get(UNCOUNTED, 0)
        return np.concatenate([np.asarray(self.capped_rooms, dtype=float), np.full(full, np.inf)])

    def expected_cuts(self, completion_percentiles: Sequence[float]) -> float:
        """How many capped answer points should end at their cap: the sum over them of the share of completions
        longer than their room, from a completion-length distribution given as its percentiles 0..100 (the
        estimate's, measured at production settings)."""
        if not self.capped_rooms or len(completion_percentiles) < 2:
            return 0.0
        quantiles = np.linspace(0.0, 1.0, len(completion_percentiles))
        below = np.interp(np.asarray(self.capped_rooms, dtype=float), completion_percentiles, quantiles)
        return float(np.sum(1.0 - below))

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokenizer": self.tokenizer,
            "max_length": self.max_length,
            "min_turn_budget": self.min_turn_budget,
            "max_tokens": self.max_tokens,
            "conversations": self.conversations,
            "of_conversations": self.of_conversations,
            "turns": self.turns,
            "by_class": dict(self.by_class),
            "sent_per_conversation": self.sent_per_conversation,
            "prompt_tokens": dict(self.prompt_tokens),
            "sent_turns": {str(k): v for k, v in sorted(self.sent_turns.items())},
            "note": SOURCE_ANSWERS_NOTE,
        }


def _source_answers(messages: Sequence[Mapping[str, Any]], points: Sequence[int]) -> dict[int, Answer]:
    """For each answer point, the source's assistant text and tool calls after it (what stands in for the
    regenerated answer: with the source's calls, its tool results follow as they will when the target asks the same)."""
    answers = {}
    for point in points:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for message in messages[point + 1 :]:
            if message["role"] != "assistant":
                break
            texts.append(str(message["content"] or ""))
            calls += list(message.get("tool_calls") or ())
        answers[point] = Answer("\n\n".join(texts), tuple(calls))
    return answers


def classify_turns(
    messages: Sequence[Mapping[str, Any]],
    cap: LengthCap,
    max_tokens: int,
    enable_thinking: bool,
    turns: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[tuple[str, int | None]]:
    """(class, prompt tokens) of each answer point of one conversation (its prompts rendered with its ``tools``, as
    generate sends them), in order; the points after one set aside are not counted (None)."""
    points = answer_points(messages, turns)
    stand_ins = _source_answers(messages, points)
    earlier: list[tuple[int, str | None]] = []
    out: list[tuple[str, int | None]] = []
    set_aside: str | None = None
    for point in points:
        if (
            set_aside is not None
        ):  # its prompt holds the one set aside: not counted, as generate does not send it
            out.append((set_aside, None))
            continue
        request = request_messages(messages, point, earlier, turns)
        limit = cap.limit(request, max_tokens, enable_thinking, tools)
        if limit.prompt_tokens is None:
            out.append((UNCOUNTED, None))
        elif limit.set_aside_by is not None:
            set_aside = limit.set_aside_by
            out.append((set_aside, limit.prompt_tokens))
        else:
            out.append((CAPPED if limit.capped else FULL, limit.prompt_tokens))
        if turns == "all":
            earlier.append((point, stand_ins[point]))
    return out


def _quantiles(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values, dtype=np.int64)
    return {
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
        "max": float(array.max()),
    }


def turn_budgets(
    conversations: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None]],
    cap: LengthCap,
    max_tokens: int,
    enable_thinking: bool,
    turns: str,
    of_conversations: int,
    progress: Any = None,
) -> TurnBudgets:
    """Count and classify every answer point of ``conversations``, (messages, tools) pairs (``progress``: a tqdm
    bar to advance, or None)."""
    by_class: Counter[str] = Counter()
    sent: Counter[int] = Counter()
    per_turn: list[int] = []
    rooms: list[int] = []
    for messages, tools in conversations:
        classified = classify_turns(messages, cap, max_tokens, enable_thinking, turns, tools)
        by_class.update(name for name, _ in classified)
        rooms += [
            cap.max_length - tokens for name, tokens in classified if name == CAPPED and tokens is not None
        ]
        sent[sum(name not in (NO_ROOM, BELOW_FLOOR) for name, _ in classified)] += 1
        per_turn += [tokens for _, tokens in classified if tokens is not None]
        if progress is not None:
            progress.update(1)
    return TurnBudgets(
        tokenizer=cap.tokenizer,
        max_length=cap.max_length,
        min_turn_budget=cap.min_budget,
        max_tokens=max_tokens,
        conversations=len(conversations),
        of_conversations=of_conversations,
        by_class={name: by_class[name] for name in CLASSES if by_class[name]},
        prompt_tokens=_quantiles(per_turn),
        sent_turns=dict(sorted(sent.items())),
        capped_rooms=tuple(rooms),
    )
