"""The simulated model's log-probabilities, in SGLang 0.5.23's chat shape.

A chat request with ``logprobs: true`` (and ``top_logprobs: k``) gets, per generated token, SGLang's
``ChatCompletionTokenLogprob``: ``{"token", "bytes", "logprob", "top_logprobs": [{"token", "bytes", "logprob"},
...]}`` (k alternatives, most likely first; an empty list without ``top_logprobs``), the stop token included;
whole in ``choices[].logprobs.content``, streamed on the chunk of the step that produced them (``serving_chat.py``,
``_build_token_logprobs_from_raw``). The values are a model of ours, drawn per token from the request's seed and
the token's position: the token's own probability p (0.3 to 1) and the rest falling off by half over the
alternatives, so entropy varies from token to token and request to request; the sizes on the wire (token texts,
bytes, full-precision floats) are real SGLang's, which is what a cost measurement needs (benchmarks/
logprobs_cost.py). The draws are a few multiplications per token, not a seeded ``random.Random``: the entries
still cost this process about 3.5 times its CPU per token at top_logprobs 5 (docs/figures.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftgen.sim.wire import BadRequest

if TYPE_CHECKING:
    from draftgen.sim.tokenizer import SimTokenizer

ALTERNATIVES = 4096  # vocabulary tokens the alternatives are drawn from (the first of the vocabulary)
FALL_OFF = 0.5  # each alternative's probability is this share of the one before it
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(value: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit value from any integer (the per-token draws)."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


@dataclass(frozen=True)
class Piece:
    """A token's text and its UTF-8 bytes, as an entry names it (``token``, ``bytes``)."""

    text: str
    bytes: tuple[int, ...]


def piece(text: str) -> Piece:
    return Piece(text, tuple(text.encode("utf-8")))


@dataclass(frozen=True)
class LogprobModel:
    """The pieces alternatives are drawn from (built once per server from its tokenizer)."""

    pieces: tuple[Piece, ...]

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> LogprobModel:
        return cls(tuple(piece(t) for t in texts))

    def entries(self, seed: int, texts: Sequence[str], start: int, top: int) -> list[dict[str, object]]:
        """The entries of tokens ``start``, ``start + 1``, ... whose texts are ``texts`` (the same on every call for
        the same request and position: a stream's chunks and the whole answer agree)."""
        return [self._entry(seed, start + i, text, top) for i, text in enumerate(texts)]

    def _entry(self, seed: int, position: int, text: str, top: int) -> dict[str, object]:
        draw = _mix((seed * _GOLDEN + position) & _MASK)
        own = 1.0 - 0.7 * ((draw & 0xFFFFFFFF) / 2**32) ** 2  # the token's own probability, 0.3 to 1
        chosen = list(text.encode("utf-8"))
        own_logprob = math.log(own)
        entry: dict[str, object] = {"token": text, "bytes": chosen, "logprob": own_logprob}
        if not top:
            entry["top_logprobs"] = []
            return entry
        alternatives: list[tuple[float, str, list[int]]] = [(own_logprob, text, chosen)]
        probability = (1.0 - own) * (1.0 - FALL_OFF)
        count = len(self.pieces)
        for k in range(top - 1):
            draw = _mix(draw + k + 1)
            alternative = self.pieces[draw % count]
            alternatives.append(
                (math.log(max(probability, 1e-300)), alternative.text, list(alternative.bytes))
            )
            probability *= FALL_OFF
        alternatives.sort(key=lambda a: -a[0])
        entry["top_logprobs"] = [
            {"token": token, "bytes": raw, "logprob": logprob} for logprob, token, raw in alternatives[:top]
        ]
        return entry


def asked_top(body: dict) -> int | None:
    """What a chat request asks for, as SGLang 0.5.23 reads it (``return_logprob=logprobs``,
    ``top_logprobs_num=top_logprobs or 0``): None without ``logprobs``, else the alternatives per token; a
    ``top_logprobs`` that is not a non-negative integer is a 400."""
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 0):
        raise BadRequest(f"top_logprobs must be a non-negative integer, got {top!r}")
    return (top or 0) if body.get("logprobs") else None


class ServerLogprobs:
    """One server's logprobs: its tokenizer names the tokens; the alternatives' model is built on first use."""

    def __init__(self, tokenizer: SimTokenizer) -> None:
        self._tokenizer = tokenizer
        self._model: LogprobModel | None = None

    def choice(self, seed: int, ids: Sequence[int], start: int, top: int) -> dict[str, object]:
        """A choice's ``logprobs`` for the generated ``ids`` from position ``start`` on: ``{"content": [...]}``."""
        tokenizer = self._tokenizer
        if self._model is None:
            texts = (tokenizer.text_of(i) for i in range(min(ALTERNATIVES, tokenizer.vocab_size)))
            self._model = LogprobModel.from_texts([t for t in texts if t])
        return {"content": self._model.entries(seed, [tokenizer.text_of(i) for i in ids], start, top)}
