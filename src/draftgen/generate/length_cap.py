"""The trainer's max_length as a cap on every request: nothing is generated past what the trainer keeps.

A training row is one turn's prompt followed by its answer, cut at the trainer's ``max_length``. A turn whose prompt
holds P tokens can therefore train at most ``max_length − P`` of its tokens, and every token generated past that is
paid for and cut. So each turn is sent with ``max_tokens = min(max_tokens, max_length − P)``, and a turn whose
prompt alone reaches ``max_length`` (nothing could train) is not sent at all. A turn stopped by this cap ends
``finish_reason: length`` and trains as generated, like any turn cut by ``max_tokens``.

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
# (messages, enable_thinking, tool schemas or None) → prompt tokens
PromptCounter = Callable[[Sequence[Mapping[str, Any]], bool, Sequence[Mapping[str, Any]] | None], int]


@dataclass(frozen=True)
class TurnLimit:
    """What one turn may generate: its prompt's length and the max_tokens it is sent with (≤ 0: nothing trains)."""

    prompt_tokens: int | None  # None: the tokenizer could not render this prompt (sent uncapped)
    max_tokens: int
    capped: bool  # max_tokens is the trainer's limit, not the run's

    @property
    def trains_nothing(self) -> bool:
        return self.max_tokens <= 0

    def reason(self, max_length: int) -> str:
        return (
            f"{SET_ASIDE}: its prompt is {self.prompt_tokens or 0:,} tokens, train_max_length {max_length:,}, so nothing "
            "generated after it could train"
        )


@dataclass(frozen=True)
class LengthCap:
    """``max_tokens = min(max_tokens, max_length − prompt tokens)``, the prompt counted by ``count``."""

    max_length: int
    count: PromptCounter
    tokenizer: str = ""  # where the counter's tokenizer came from (for messages)

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
        room = self.max_length - prompt
        return TurnLimit(prompt_tokens=prompt, max_tokens=min(max_tokens, room), capped=room < max_tokens)


def tokenizer_counter(folder: str | Path) -> PromptCounter:
    """Counts a request's prompt with the tokenizer folder's chat template, as SGLang renders a chat request."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"tokenizer {folder}: cannot load it ({exc}); give the target model's folder (tokenizer.json and its "
            "chat template), or tokenizer: '' to send max_tokens uncapped"
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {folder} has no chat template: the prompt cannot be rendered as the server does"
        )

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
