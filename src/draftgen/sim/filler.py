"""The simulator's filler text: the words every simulated completion is made of, drawn from a seed.

``draftgen.sim.textgen`` plans completions from it, ``draftgen.sim.tokenizer`` checks on it that a tokenizer
encodes it unit by unit as it encodes it whole, and ``draftgen.training.local_tokenizer`` trains the tiny tokenizer
on it, so that simulated answers tokenize about as compactly as the simulator counts them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

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
OPENERS = ("Okay,", "Alright,", "Let", "So", "First,", "Hmm,")
_PUNCT = (",", ".", ":", "?")


def filler_words(
    rng: random.Random, count: int, opener: str | None, *, continuing: bool = False
) -> list[str]:
    """``count`` words of filler text, with punctuation and occasional newlines; ``continuing`` text starts with a
    space so it never fuses with the text before it."""
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


def filler_text(seed: int, words: int) -> str:
    """Reasoning-style filler of about ``words`` words, for training a tokenizer on text like the simulator's
    (``draftgen.training.local_tokenizer``): needs no tokenizer itself."""
    rng = random.Random(seed)
    return "".join(filler_words(rng, words, rng.choice(OPENERS)))


def filler_units(words: Sequence[str]) -> list[str]:
    """Filler words grouped so that no tokenizer merge crosses a unit's edge: a newline joins the word before it
    (Qwen-style pre-tokenizers take punctuation + newline as one piece); every unit but the first starts a piece."""
    units: list[str] = []
    for word in words:
        if word == "\n" and units:
            units[-1] += word
        else:
            units.append(word)
    return units
