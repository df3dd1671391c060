"""Prompt tokens per answer point against the trainer's max_length, counted before anything is sent.

Each answer point of a conversation (``training.conversation.answer_points``) is one request; its prompt holds the
conversation so far. Generate fills the earlier answers with the target's own (regenerated) ones; before the run
those do not exist, so the source's own assistant turns stand in for them here (a regenerated answer with thinking
on is often longer: the real prompts are at least this long, usually longer). The estimate gives answers of
measured lengths instead (``answer_lengths``): each earlier answer in text is then an empty one plus the tokens
drawn for it, and since the draws differ from one version of a conversation to the next, every counted conversation
is played ``draws`` times from one rendering of its prompts. Each request is judged by generate's own rule,
``generate.length_cap.LengthCap.limit_of`` and ``TurnLimit.set_aside_by``: set aside (its prompt leaves no room, or
less than the floor ``min_turn_budget``), capped (the room the trainer's max_length leaves is below ``max_tokens``),
or sent with the full ``max_tokens``. As in generate, a conversation's turns after the first one set aside are set
aside with it. With answers of measured lengths, an agentic conversation also ends where the target's answer
diverges from the source's (``DIVERGED``), as often as the benchmark measured (``divergence``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from draftgen.generate.length_cap import BELOW_FLOOR, NO_ROOM, LengthCap, TurnLimit
from draftgen.prompts.answer_lengths import AnswerDraw, AnswerLengths, kept_answer
from draftgen.prompts.divergence import DivergenceDraw
from draftgen.training.conversation import (
    Answer,
    answer_points,
    request_messages,
    source_answers,
    source_reply,
)
from draftgen.training.tools import history_calls

CAPPED = "capped"  # sent with the room the trainer's max_length leaves (below max_tokens)
FULL = "full"  # sent with the full max_tokens
UNCOUNTED = "uncounted"  # the chat template could not render the prompt: generate sends it uncapped
# not sent: an earlier answer, cut at its room, ended before its tool calls (generate ends the conversation there);
# only with answers of measured lengths (the estimate's)
ENDED = "ended"
# not sent: an earlier answer of an agentic conversation diverged from the source's (other calls, a call where the
# source wrote text, text where it called): generate ends the conversation there; drawn with the benchmark's shares
DIVERGED = "diverged"
CLASSES = (NO_ROOM, BELOW_FLOOR, ENDED, DIVERGED, CAPPED, FULL, UNCOUNTED)
NOT_SENT = (NO_ROOM, BELOW_FLOOR, ENDED, DIVERGED)
CLASS_LABELS = {
    NO_ROOM: "set aside: no room (prompt ≥ max_length)",
    BELOW_FLOOR: "set aside: below min_turn_budget",
    ENDED: "not sent: an earlier answer was cut before its tool calls",
    DIVERGED: "not sent: the target's calls were not the source's",
    CAPPED: "capped at max_length − prompt",
    FULL: "full max_tokens",
    UNCOUNTED: "not counted (template error; sent uncapped)",
}
ANSWER_DRAWS = 8  # versions of each counted conversation played with drawn answers (the estimate's)
SOURCE_ANSWERS = "the source's assistant turns stand in for regenerated ones"
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
    # Every count below is over ``draws`` versions of each counted conversation (1 with the source's answers).
    by_class: Mapping[str, int] = field(default_factory=dict)  # CLASSES → answer points
    prompt_tokens: Mapping[str, float] = field(default_factory=dict)  # per counted turn: p50, p90, p99, max
    sent_turns: Mapping[int, int] = field(
        default_factory=dict
    )  # answer points sent per conversation → conversations
    capped_rooms: tuple[int, ...] = ()  # the max_tokens each capped answer point is sent with (its room)
    # each version of each counted conversation, version after version, conversations in the order counted: the
    # room of each turn it sends (inf: the full max_tokens; empty: it sends none)
    conversation_rooms: tuple[tuple[float, ...], ...] = ()
    # ...and the tokens of the tool calls each of those turns answers with (0: in text; counted with answers only)
    conversation_calls: tuple[tuple[int, ...], ...] = ()
    # ...and each counted conversation's category (one per conversation, in the order counted; None: none given)
    conversation_categories: tuple[str | None, ...] = ()
    draws: int = 1
    note: str = SOURCE_ANSWERS_NOTE  # what stood in for the earlier answers
    short_note: str = SOURCE_ANSWERS  # ...in a few words

    @property
    def turns(self) -> int:
        return sum(self.by_class.values())

    def points(self, name: str) -> float:
        """Answer points of a class in one version of the counted conversations (a mean over the draws)."""
        return self.by_class.get(name, 0) / self.draws

    @property
    def set_aside(self) -> int:
        return self.by_class.get(NO_ROOM, 0) + self.by_class.get(BELOW_FLOOR, 0)

    @property
    def sent(self) -> int:
        """Answer points sent: the set-aside ones and those after a conversation ended left out."""
        return self.turns - sum(self.by_class.get(name, 0) for name in NOT_SENT)

    @property
    def sent_per_conversation(self) -> float:
        """Answer points sent per conversation: what the estimate prices."""
        return self.sent / (self.conversations * self.draws) if self.conversations else 0.0

    def share(self, name: str) -> float:
        return self.by_class.get(name, 0) / self.turns if self.turns else 0.0

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
            "draws": self.draws,
            "note": self.note,
        }


class Classified(NamedTuple):
    """One answer point as counted: how it is sent, its prompt tokens, and the tokens of the tool calls it answers
    with (0: it answers in text, or they were not counted)."""

    name: str
    prompt_tokens: int | None
    call_tokens: int = 0


def _source_called(
    messages: Sequence[Mapping[str, Any]], point: int, tools: Sequence[Mapping[str, Any]] | None, turns: str
) -> bool | None:
    """Whether the source's reply at ``point`` called tools, where generate compares the target's answer with it
    (an agentic conversation in mode all, a point the source followed with an assistant message); else None."""
    reply = source_reply(messages, point) if tools and turns == "all" else None
    return None if reply is None else bool(reply.get("tool_calls"))


class _Prompts:
    """One conversation's answer points and their prompts' tokens, each rendered once when first asked for, with
    the earlier answers standing as the source's (``drawn``: those in text as empty ones, their drawn tokens added
    by the caller; those with tool calls as the source's, whose calls' tokens are counted too)."""

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        cap: LengthCap,
        enable_thinking: bool,
        turns: str,
        tools: Sequence[Mapping[str, Any]] | None,
        drawn: bool,
    ):
        self.messages, self.cap, self.thinking, self.turns, self.tools = (
            messages,
            cap,
            enable_thinking,
            turns,
            tools,
        )
        self.points = answer_points(messages, turns)
        self.stand_ins = source_answers(messages, self.points)
        if drawn:
            self.stand_ins = {p: a if a.tool_calls else Answer("") for p, a in self.stand_ins.items()}
        self.drawn = drawn
        self.compared = {p: _source_called(messages, p, tools, turns) for p in self.points}
        self._counts: list[int | None] = []
        self._calls: dict[int, int] = {}

    def prompt(self, turn: int) -> int | None:
        """Prompt tokens of the request at answer point number ``turn`` (None: the template could not render it)."""
        while len(self._counts) <= turn:
            index = len(self._counts)
            earlier = [(p, self.stand_ins[p]) for p in self.points[:index]] if self.turns == "all" else []
            request = request_messages(self.messages, self.points[index], earlier, self.turns)
            try:
                self._counts.append(int(self.cap.count(request, self.thinking, self.tools)))
            except Exception:  # the template's own error or the tokenizer's: generate sends it uncapped
                self._counts.append(None)
        return self._counts[turn]

    def calls(self, turn: int) -> int:
        """Tokens the answer at point number ``turn`` takes in text and tool calls as the template renders them,
        when it answers with calls and answers are drawn (what such a turn writes after its reasoning; ≥ 1), else
        0."""
        answer = self.stand_ins[self.points[turn]]
        if not self.drawn or not answer.tool_calls:
            return 0
        if turn not in self._calls:
            ask = {"role": "user", "content": ""}
            bare = [ask, {"role": "assistant", "content": ""}]
            full = [
                ask,
                {
                    "role": "assistant",
                    "content": answer.content or "",
                    "tool_calls": history_calls(answer.tool_calls),
                },
            ]
            try:
                made = int(self.cap.count(full, self.thinking, self.tools)) - int(
                    self.cap.count(bare, self.thinking, self.tools)
                )
            except Exception:  # the template's own error: priced as a text answer
                made = 0
            self._calls[turn] = max(1, made) if made else 0
        return self._calls[turn]


def classify_turns(
    messages: Sequence[Mapping[str, Any]],
    cap: LengthCap,
    max_tokens: int,
    enable_thinking: bool,
    turns: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[tuple[str, int | None]]:
    """(class, prompt tokens) of each answer point of one conversation (its prompts rendered with its ``tools``, as
    generate sends them), the source's answers standing in for the earlier ones, in order; the points after one set
    aside are not counted (None)."""
    prompts = _Prompts(messages, cap, enable_thinking, turns, tools, drawn=False)
    return [(c.name, c.prompt_tokens) for c in classify(prompts, cap, max_tokens)]


def classify(
    prompts: _Prompts,
    cap: LengthCap,
    max_tokens: int,
    answers: AnswerDraw | None = None,
    diverges: DivergenceDraw | None = None,
) -> list[Classified]:
    """Each answer point of one version of a conversation (``classify_turns``), with ``answers`` (draws of a
    regenerated turn's completion and answer tokens) when its prompts stand the answers in text as empty ones: each
    such answer then adds its drawn answer tokens, cut at its turn's room (``answer_lengths.kept_answer``), to every
    later prompt; one with tool calls writes its reasoning and those calls, and when that is longer than its room
    the conversation ends there (cut before its calls, as generate ends it: the points after it are ENDED). With
    ``diverges`` too (the benchmark's divergence shares, drawn by the kind of the source's reply), a sent answer at a
    point of an agentic conversation the source followed with an assistant message may diverge from the source's:
    the conversation ends there as well (the points after it are DIVERGED)."""
    extra = 0  # drawn answer tokens in the prompt beyond the stand-ins' text
    out: list[Classified] = []
    stopped: str | None = None
    for turn in range(len(prompts.points)):
        if stopped is not None:  # its prompt holds the one set aside (or the conversation ended): not sent
            out.append(Classified(stopped, None))
            continue
        counted = prompts.prompt(turn)
        limit = (
            TurnLimit(prompt_tokens=None, max_tokens=max_tokens, capped=False)
            if counted is None
            else cap.limit_of(counted + extra, max_tokens)
        )
        if limit.set_aside_by is not None:
            stopped = limit.set_aside_by
            out.append(Classified(stopped, limit.prompt_tokens))
            continue
        name = UNCOUNTED if limit.prompt_tokens is None else CAPPED if limit.capped else FULL
        calls = prompts.calls(turn)
        out.append(Classified(name, limit.prompt_tokens, calls))
        if answers is None or prompts.turns != "all":
            continue
        completion, answer = answers()
        if calls:
            stopped = ENDED if completion - answer + calls > limit.max_tokens else None
        elif not prompts.stand_ins[prompts.points[turn]].tool_calls:
            extra += kept_answer(completion, answer, limit.max_tokens)
        source_called = prompts.compared[prompts.points[turn]]
        if stopped is None and diverges is not None and source_called is not None and diverges(source_called):
            stopped = DIVERGED
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
    conversations: Sequence[
        tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None, str | None]
    ],
    cap: LengthCap,
    max_tokens: int,
    enable_thinking: bool,
    turns: str,
    of_conversations: int,
    progress: Any = None,
    answers: AnswerLengths | None = None,
    seed: int = 0,
    draws: int = ANSWER_DRAWS,
) -> TurnBudgets:
    """Count and classify every answer point of ``conversations``, (messages, tools, category) triples
    (``progress``: a tqdm bar to advance, or None). With ``answers`` (the earlier answers' measured lengths, drawn
    with ``seed``) each conversation is played ``draws`` times; else once, the source's answers standing in."""
    draws = draws if answers is not None else 1
    by_class: Counter[str] = Counter()
    sent: Counter[int] = Counter()
    per_turn: list[int] = []
    rooms: list[int] = []
    versions: list[list[tuple[tuple[float, ...], tuple[int, ...]]]] = [[] for _ in range(draws)]
    rng = np.random.default_rng(seed)
    for messages, tools, category in conversations:
        prompts = _Prompts(messages, cap, enable_thinking, turns, tools, drawn=answers is not None)
        draw = answers.drawer(category, rng) if answers is not None else None
        diverges = answers.diverger(rng) if answers is not None else None
        for version in versions:
            classified = classify(prompts, cap, max_tokens, draw, diverges)
            by_class.update(c.name for c in classified)
            sent_here = [c for c in classified if c.name not in NOT_SENT]
            own = tuple(
                float(cap.max_length - c.prompt_tokens)
                if c.name == CAPPED and c.prompt_tokens is not None
                else np.inf
                for c in sent_here
            )
            rooms += [int(room) for room in own if room != np.inf]
            sent[len(own)] += 1
            version.append((own, tuple(c.call_tokens for c in sent_here)))
            per_turn += [c.prompt_tokens for c in classified if c.prompt_tokens is not None]
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
        conversation_rooms=tuple(own for version in versions for own, _ in version),
        conversation_calls=tuple(calls for version in versions for _, calls in version),
        conversation_categories=tuple(category for _, _, category in conversations),
        draws=draws,
        note=answers.note if answers is not None else SOURCE_ANSWERS_NOTE,
        short_note=(
            f"earlier answers as long as measured, a mean over {draws} draws"
            if answers is not None
            else SOURCE_ANSWERS
        ),
    )
