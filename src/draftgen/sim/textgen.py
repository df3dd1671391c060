"""Deterministic Qwen3-style completions and the simulator's documented tokenization.

Simulated tokenization (what ``prompt_tokens`` and ``completion_tokens`` count):
  * each chat-template special marker (``<|im_start|>``, ``<|im_end|>``, ``<think>``, ``</think>``) is one token;
  * every other piece of text splits into tokens by ``TOKEN_PATTERN``: a newline, or optional spaces followed by
    at most 8 non-space characters, or a run of spaces.
Generated text is built from such tokens, so ``count_text_tokens(reasoning) + count_text_tokens(answer)`` plus
the markers equals ``completion_tokens`` exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

TOKEN_PATTERN = re.compile(r"\n|[^\S\n]*[^\s]{1,8}|[^\S\n]+")
SPECIAL_PATTERN = re.compile(r"(<\|im_start\|>|<\|im_end\|>|<think>|</think>)")
THINK_END = "</think>"
EOS_TOKEN_ID = 151645  # Qwen's <|im_end|>, reported as matched_stop like SGLang does

_WORDS = (
    "the",
    "so",
    "we",
    "need",
    "to",
    "check",
    "this",
    "value",
    "first",
    "then",
    "compute",
    "sum",
    "of",
    "each",
    "term",
    "and",
    "which",
    "gives",
    "us",
    "result",
    "wait",
    "let",
    "me",
    "verify",
    "again",
    "case",
    "if",
    "it",
    "is",
    "equal",
    "when",
    "number",
    "list",
    "function",
    "returns",
    "loop",
    "over",
    "index",
    "string",
    "answer",
    "because",
    "since",
    "hence",
    "step",
    "two",
    "three",
    "four",
    "half",
    "twice",
    "hmm",
    "actually",
    "maybe",
    "consider",
    "edge",
    "input",
    "output",
    "test",
    "works",
    "fine",
    "good",
    "right",
)
_OPENERS = ("Okay,", "Alright,", "Let", "So", "First,", "Hmm,")
_PUNCT = (",", ".", ":", "?")


def count_text_tokens(text: str | None) -> int:
    if not text:
        return 0
    return sum(
        1 if SPECIAL_PATTERN.fullmatch(piece) else len(TOKEN_PATTERN.findall(piece))
        for piece in SPECIAL_PATTERN.split(text)
        if piece
    )


def render_chat_prompt(messages: Sequence[dict], enable_thinking: bool) -> str:
    """Qwen3.5/3.6-style ChatML prompt with the generation prompt, as the server would tokenize it."""
    parts = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    parts.append("<think>\n" if enable_thinking else "<think>\n\n</think>\n\n")
    return "".join(parts)


def request_seed(payload: object, seed: int | None) -> int:
    """Same prompt (and seed) → same completion, on every server: retries and resumes stay comparable.

    A client ``seed`` changes the draw but never makes different prompts share one completion.
    """
    blob = json.dumps([payload, seed], sort_keys=True, ensure_ascii=False, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")


def _lognormal_length(rng: random.Random, median: int, sigma: float) -> int:
    return max(1, round(math.exp(rng.gauss(math.log(median), sigma))))


@dataclass(frozen=True)
class CompletionPlan:
    """Everything a request will emit: token strings (EOS excluded), where thinking ends, and the finish."""

    tokens: tuple[str, ...]
    think_end_index: int | None  # index of the "</think>" token in tokens, None if thinking is off or cut
    finish_type: str  # "stop" or "length"
    counts_eos: bool  # the EOS token is generated (counted in completion_tokens) but not shown

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens) + (1 if self.counts_eos else 0)

    def split_range(self, start: int, end: int, *, separate: bool = True) -> tuple[str, str]:
        """(reasoning, answer) text of tokens[start:end], split at "</think>" as a reasoning parser would.

        With ``separate`` false (or thinking off) everything is answer text, "</think>" included.
        """
        pieces = self.tokens[start:end]
        if self.think_end_index is None or not separate:
            return "", "".join(pieces)
        cut = self.think_end_index
        reasoning = "".join(self.tokens[start : min(end, cut)]) if start < cut else ""
        answer = "".join(self.tokens[max(start, cut + 1) : end]) if end > cut + 1 else ""
        return reasoning, answer


def _words(rng: random.Random, count: int, opener: str | None, *, continuing: bool = False) -> list[str]:
    """``count`` tokens of filler text; each is exactly one token under TOKEN_PATTERN (at most 8 non-space
    characters), and ``continuing`` text starts with a space so it never fuses with the text before it."""
    out: list[str] = []
    since_newline = 0
    while len(out) < count:
        if not out and opener:
            out.append(opener)
            continue
        if since_newline > 24 and rng.random() < 0.08:
            out.append("\n")
            since_newline = 0
            continue
        word = rng.choice(_WORDS)
        if rng.random() < 0.12 and len(word) < 8:
            word += rng.choice(_PUNCT)
        needs_space = (out and out[-1] != "\n") or (not out and continuing)
        out.append((" " if needs_space else "") + word)
        since_newline += 1
    return out[:count]


def plan_completion(
    seed: int,
    *,
    max_tokens: int,
    enable_thinking: bool,
    reasoning_median: int,
    answer_median: int,
    sigma: float,
    empty_answer: bool = False,
    ignore_eos: bool = False,
) -> CompletionPlan:
    """Deterministic completion for one request: long-tailed lengths, truncated at ``max_tokens``."""
    rng = random.Random(seed)
    if empty_answer:
        # The 6-token failure: "\n</think>\n\nOK." + EOS after a "<think>\n" generation prompt.
        body = ["\n", THINK_END, "\n", "\n", "OK."] if enable_thinking else ["OK."]
        think_end: int | None = 1 if enable_thinking else None
    else:
        answer = _words(rng, _lognormal_length(rng, answer_median, sigma), None)
        if enable_thinking:
            reasoning = _words(rng, _lognormal_length(rng, reasoning_median, sigma), rng.choice(_OPENERS))
            body = [*reasoning, "\n", THINK_END, "\n", "\n", *answer]
            think_end = len(reasoning) + 1
        else:
            body = answer
            think_end = None
        if ignore_eos:
            while len(body) < max_tokens:
                body.extend(_words(rng, 64, None, continuing=True))
    if not ignore_eos and len(body) + 1 <= max_tokens:
        return CompletionPlan(tuple(body), think_end, "stop", counts_eos=True)
    # A length cut (with ignore_eos, max_tokens is the only way to end). A cut before "</think>" leaves
    # think_end_index past the end, so everything emitted is reasoning.
    return CompletionPlan(tuple(body[:max_tokens]), think_end, "length", counts_eos=False)


def acceptance_probability(mean: float, draft_tokens: int) -> float:
    """Per-draft acceptance probability p with 1 + p + ... + p^(k-1) = mean (chain acceptance, k draft tokens)."""
    if draft_tokens <= 1 or mean <= 1.0:
        return 0.0
    if mean >= draft_tokens:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**i for i in range(draft_tokens)) < mean:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def plan_acceptance(
    seed: int, total_tokens: int, p: float, draft_tokens: int, per_step_cap: int
) -> list[int]:
    """Tokens gained at each verify step until ``total_tokens``: 1 + the run of accepted drafts, capped."""
    return plan_acceptance_by_position(seed, total_tokens, (p,) * max(0, draft_tokens - 1), per_step_cap)


def plan_acceptance_by_position(
    seed: int, total_tokens: int, probs: Sequence[float], per_step_cap: int
) -> list[int]:
    """Like ``plan_acceptance`` with a conditional acceptance per draft position: draft i is accepted with
    probability ``probs[i-1]`` only if draft i-1 was (a chain, or the tree's accepted path)."""
    rng = random.Random(seed ^ 0x5EED)
    depth = len(probs)
    draws: list[int] = []
    remaining = total_tokens
    while remaining > 0:
        gained = 1
        while gained <= depth and rng.random() < probs[gained - 1]:
            gained += 1
        gained = min(gained, per_step_cap, remaining)
        draws.append(gained)
        remaining -= gained
    return draws
