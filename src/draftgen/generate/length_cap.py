"""The trainer's max_length as a cap on every request: nothing is generated past what the trainer keeps.

A training row is one turn's prompt followed by its answer, cut at the trainer's ``max_length``. A turn whose prompt
holds P tokens can therefore train at most ``max_length − P`` of its tokens, and every token generated past that is
paid for and cut. So each turn is sent with ``max_tokens = min(max_tokens, max_length − P)``, and a turn whose
prompt alone reaches ``max_length`` (nothing could train) is not sent at all. A turn stopped by this cap ends
``finish_reason: length`` and trains as generated; it is "cut at max_length", an expected cut the garbage guard and
validate's gate never count against the run (only cuts by ``max_tokens`` mean the budget was too small).

A turn left with a little room costs far more than it gives: its whole prompt is prefilled, and the trainer reads a
``max_length``-token row, to supervise a few hundred tokens. Below the run's floor (``min_turn_budget``) such a turn
is set aside like one with no room at all; the conversation's earlier turns still train.

P is counted before the request is sent, with the target's own tokenizer and chat template, rendered as the server
renders it (the same messages, ``add_generation_prompt``, the request's ``enable_thinking``): the server's own count
arrives only with its answer, too late to cap that answer. The dispatcher compares the two on every answer and
notes the first turn where they differ (a tokenizer folder that is not the served model's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SET_ASIDE = "set aside at the trainer's max_length"  # how a set-aside prompt's rejected.parquet reason begins
# Which limit set a turn's max_tokens (the stored row's ``turn_budget_by``): the run's (or its arm's) max_tokens, or
# the room the trainer's max_length left after the prompt. A turn cut at the latter is an expected cut.
BY_MAX_TOKENS = "max_tokens"
BY_MAX_LENGTH = "max_length"
# Why a turn was set aside, not sent (the stored row's ``turns_set_aside_by``, the manifest's counts).
NO_ROOM = "max_length"  # its prompt alone reached max_length: nothing could train
BELOW_FLOOR = "min_turn_budget"  # some room, below the run's floor
# (messages, enable_thinking, tool schemas or None) → prompt tokens
PromptCounter = Callable[[Sequence[Mapping[str, Any]], bool, Sequence[Mapping[str, Any]] | None], int]


def set_aside_kind(reason: str) -> str | None:
    """Why a rejected.parquet row was set aside (NO_ROOM, BELOW_FLOOR), read from its reason (``TurnLimit.reason``
    writes it); None for any other rejection."""
    if not reason.startswith(SET_ASIDE):
        return None
    return BELOW_FLOOR if BELOW_FLOOR in reason else NO_ROOM


@dataclass(frozen=True)
class TurnLimit:
    """What one turn may generate: its prompt's length and the max_tokens it is sent with (≤ 0: nothing trains)."""

    prompt_tokens: int | None  # None: the tokenizer could not render this prompt (sent uncapped)
    max_tokens: int
    capped: bool  # max_tokens is the trainer's limit, not the run's
    floor: int = (
        0  # the fewest tokens a capped turn may be sent with (the run's min_turn_budget, ≤ its max_tokens)
    )

    @property
    def trains_nothing(self) -> bool:
        return self.max_tokens <= 0

    @property
    def budget_by(self) -> str:
        """Which limit set this turn's max_tokens: BY_MAX_LENGTH (the trainer's room) or BY_MAX_TOKENS (the run's)."""
        return BY_MAX_LENGTH if self.capped else BY_MAX_TOKENS

    @property
    def set_aside_by(self) -> str | None:
        """Why the turn is not sent (NO_ROOM, BELOW_FLOOR), or None: it is sent."""
        if self.trains_nothing:
            return NO_ROOM
        if self.capped and self.max_tokens < self.floor:
            return BELOW_FLOOR
        return None

    def reason(self, max_length: int) -> str:
        prompt = f"its prompt is {self.prompt_tokens or 0:,} tokens, train_max_length {max_length:,}"
        if self.set_aside_by == BELOW_FLOOR:
            return (
                f"{SET_ASIDE}: {prompt}, so at most {self.max_tokens:,} generated tokens could train, fewer than "
                f"min_turn_budget {self.floor:,}"
            )
        return f"{SET_ASIDE}: {prompt}, so nothing generated after it could train"


@dataclass(frozen=True)
class LengthCap:
    """``max_tokens = min(max_tokens, max_length − prompt tokens)``, the prompt counted by ``count``; a capped turn
    with less room than ``min_budget`` (or than its max_tokens, if smaller) is set aside."""

    max_length: int
    count: PromptCounter
    tokenizer: str = ""  # where the counter's tokenizer came from (for messages)
    min_budget: int = 0

    def limit(
        self,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        enable_thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> TurnLimit:
        """The turn's max_tokens (the prompt rendered with the conversation's ``tools``, as the server renders it);
        a prompt the chat template cannot render goes uncapped (the server judges it)."""
        try:
            prompt = int(self.count(messages, enable_thinking, tools))
        except (
            Exception
        ):  # the template's own error (raise_exception) or the tokenizer's: not the run's to stop
            return TurnLimit(prompt_tokens=None, max_tokens=max_tokens, capped=False)
        return self.limit_of(prompt, max_tokens)

    def limit_of(self, prompt: int, max_tokens: int) -> TurnLimit:
        """The turn's max_tokens for a prompt of ``prompt`` tokens, already counted."""
        room = self.max_length - prompt
        return TurnLimit(
            prompt_tokens=prompt,
            max_tokens=min(max_tokens, room),
            capped=room < max_tokens,
            floor=min(self.min_budget, max_tokens),
        )


def tokenizer_counter(folder: str | Path) -> PromptCounter:
    """Counts a request's prompt with the tokenizer folder's chat template, as SGLang renders a chat request."""
    from draftgen.training.masks import load_tokenizer  # transformers: only where a tokenizer is given

    return prompt_counter(load_tokenizer(folder))


def prompt_counter(tokenizer: Any) -> PromptCounter:
    """Counts a request's prompt with a loaded tokenizer's chat template, as SGLang renders a chat request."""

    def count(
        messages: Sequence[Mapping[str, Any]],
        enable_thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count
