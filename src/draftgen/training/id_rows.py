"""Training rows from the target's own token ids, masked as the trainer masks, and checked against re-tokenizing.

A drafter learns to predict the target's tokens. Re-tokenizing the stored text gives the target's tokens only when
the target emitted the canonical tokenization of its text; a sampled model sometimes does not (a word split in
two), and then a drafter trained on re-tokenized rows learns sequences the target never produced. Where the server
returned its ids (SGLang's ``sglext``, vLLM's ``token_ids``), a row is built from them:

    input_ids = the server's prompt ids + the turn's output ids (+ the template's own text after the end-of-turn
                token, e.g. the "\\n" after ``<|im_end|>``; + that token itself when a server leaves the stop token out;
                nothing for a turn cut by max_tokens: it trains exactly as generated)

and masked by the trainer's rule applied to ids: from the end of each assistant header (``<|im_start|>assistant\\n
<think>\\n`` for SpecForge's qwen3.5 template) through the end-of-turn string, the last span only for a row per
turn, cut at ``max_length``. The header and end-of-turn strings are made of the tokenizer's added tokens and short
fragments between them, so their ids are the same wherever they appear: the rule on ids is the rule on text. One
exception, seen on vLLM with thinking off: the header's last fragment can merge with the text after it (``<think>``
``\n`` + ``\n</think>`` is tokenized ``<think>`` ``\n\n`` ``</think>``). The trainer counts the header's end as the
tokens of the text before it tokenized on its own, so its span begins one token after the merged one; the rule on
ids finds such a header by its other tokens followed by any token that begins with the last fragment's text, and
begins the span at the same place.

``compare`` says where the re-tokenized row (the trainer's own rendering of the text) first differs from the
server's; ``ids_problem`` says why a server's ids cannot be this tokenizer's (an id outside its vocabulary, no
assistant header where the template puts one, output ids that do not decode to the stored answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from draftgen.client.records import STOPPED
from draftgen.training.trainers import SpanTrainer

PROBE_CONVERSATION = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


@dataclass(frozen=True)
class IdsLayout:
    """The trainer's markers in one tokenizer's ids."""

    header: tuple[int, ...]  # the trainer's assistant header
    end_of_turn: tuple[int, ...]  # the trainer's end-of-turn string (token and what follows it)
    eot_id: int  # the end-of-turn token itself
    tail: tuple[int, ...]  # what the template renders after a conversation's final end-of-turn token
    vocab_size: int
    # tokens that begin with the header's last fragment and go on (e.g. "\n\n" for a header ending in "\n"): a header
    # whose last fragment merged with the text after it ends in one of them
    header_merges: frozenset[int] = frozenset()


def _ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def ids_layout(tokenizer: Any, rules: SpanTrainer, end_of_turn_token: str = "<|im_end|>") -> IdsLayout:
    """The layout of ``rules`` in ``tokenizer``: its header and end-of-turn ids, and the template's tail."""
    eot_id = tokenizer.convert_tokens_to_ids(end_of_turn_token)
    rendered = tokenizer.apply_chat_template(PROBE_CONVERSATION, tokenize=False)
    tail = rendered.rsplit(end_of_turn_token, 1)[1] if end_of_turn_token in rendered else ""
    header = _ids(tokenizer, rules.assistant_header)
    vocab_size = max(len(tokenizer), max(tokenizer.get_added_vocab().values(), default=0) + 1)
    return IdsLayout(
        header=header,
        end_of_turn=_ids(tokenizer, rules.end_of_turn),
        eot_id=int(eot_id),
        tail=_ids(tokenizer, tail) if tail else (),
        vocab_size=vocab_size,
        header_merges=_merges(tokenizer, header[-1], vocab_size) if header else frozenset(),
    )


def _merges(tokenizer: Any, last: int, vocab_size: int) -> frozenset[int]:
    """Every token whose text begins with token ``last``'s text and is longer (added tokens never merge)."""
    backend = tokenizer.backend_tokenizer
    fragment = backend.decode([last], skip_special_tokens=False)
    added = set(tokenizer.get_added_vocab().values())
    if not fragment or last in added:
        return frozenset()
    candidates = [i for i in range(vocab_size) if i not in added]
    texts = backend.decode_batch([[i] for i in candidates], skip_special_tokens=False)
    return frozenset(
        i
        for i, text in zip(candidates, texts, strict=True)
        if len(text) > len(fragment) and text.startswith(fragment)
    )


def _header_starts(ids: np.ndarray, layout: IdsLayout) -> np.ndarray:
    """Start positions of the assistant header, as written or with its last fragment merged into the next text."""
    exact = _starts(ids, layout.header)
    if len(layout.header) < 2 or not layout.header_merges:
        return exact
    stem = _starts(ids, layout.header[:-1])
    after = stem + len(layout.header) - 1
    stem, after = stem[after < ids.size], after[after < ids.size]
    merged = stem[np.isin(ids[after], np.fromiter(layout.header_merges, dtype=np.int64))]
    return np.union1d(exact, merged)


def join_turn(
    prompt_ids: Sequence[int], output_ids: Sequence[int], finish_reason: str | None, layout: IdsLayout
) -> list[int]:
    """The row the trainer sees for one generated turn: prompt + output, a finished turn closed as the template
    closes a turn. A turn that did not stop (cut by max_tokens) is exactly prompt + output: the end-of-turn token
    and the template's text after it are not the model's, and it never wrote them."""
    ids = [*prompt_ids, *output_ids]
    if finish_reason not in STOPPED:
        return ids
    if not output_ids or output_ids[-1] != layout.eot_id:
        ids.append(layout.eot_id)  # a server that reports ids without the stop token
    ids.extend(layout.tail)
    return ids


def _starts(ids: np.ndarray, needle: tuple[int, ...]) -> np.ndarray:
    """Start positions of ``needle`` in ``ids`` (overlapping ones included), in order."""
    width = len(needle)
    if width == 0 or ids.size < width:
        return np.zeros(0, dtype=np.int64)
    hits = np.flatnonzero(ids == needle[0])
    hits = hits[hits <= ids.size - width]
    for offset in range(1, width):
        hits = hits[ids[hits + offset] == needle[offset]]
    return hits


def span_mask(
    ids: Sequence[int], layout: IdsLayout, *, last_only: bool, max_length: int | None
) -> np.ndarray:
    """The trainer's loss mask on ``ids``: each assistant header's end through the next end-of-turn string
    (inclusive; to the end when none follows), the next header searched after that span; cut at ``max_length``."""
    array = np.asarray(ids, dtype=np.int64)
    mask = np.zeros(array.size, dtype=np.int8)
    headers = _header_starts(array, layout)
    closers = _starts(array, layout.end_of_turn)
    spans: list[tuple[int, int]] = []
    position = 0
    for start in headers:
        if start < position:
            continue
        begin = int(start) + len(layout.header)
        later = closers[closers >= begin]
        end = int(later[0]) + len(layout.end_of_turn) if later.size else array.size
        spans.append((begin, end))
        position = end
    for begin, end in spans[-1:] if last_only else spans:
        mask[begin:end] = 1
    return mask[:max_length] if max_length is not None else mask


def compare(server: Sequence[int], retokenized: Sequence[int]) -> int | None:
    """The first position where the two rows differ (a shorter row differs where it ends), or None."""
    a = np.asarray(server, dtype=np.int64)
    b = np.asarray(retokenized, dtype=np.int64)
    size = min(a.size, b.size)
    differing = np.flatnonzero(a[:size] != b[:size])
    if differing.size:
        return int(differing[0])
    return None if a.size == b.size else size


def describe_difference(tokenizer: Any, server: Sequence[int], retokenized: Sequence[int], at: int) -> str:
    """ "at token 812: server 1173 ' the' vs re-tokenized 279 ' t'" — both tokens shown, ids and text."""

    def shown(ids: Sequence[int]) -> str:
        if at >= len(ids):
            return "(end)"
        token = int(ids[at])
        return f"{token} {tokenizer.decode([token])!r}"

    return f"at token {at}: server {shown(server)} vs re-tokenized {shown(retokenized)}"


def ids_problem(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    layout: IdsLayout,
    decoded_output: str,
    reasoning: str | None,
    content: str | None,
) -> str | None:
    """Why these ids cannot be this tokenizer's rendering of this turn, or None when they fit."""
    largest = max(max(prompt_ids, default=0), max(output_ids, default=0))
    if largest >= layout.vocab_size:
        return (
            f"foreign: id {largest} is outside this tokenizer's {layout.vocab_size:,}-token vocabulary "
            "(the server's tokenizer is another one)"
        )
    whole = np.asarray([*prompt_ids, *output_ids], dtype=np.int64)
    if not _header_starts(whole, layout).size and layout.header:
        return "foreign: the trainer's assistant header is nowhere in the server's ids (another tokenizer or template)"
    position = 0
    for part in (reasoning, content):
        piece = (part or "").strip()
        if not piece:
            continue
        found = decoded_output.find(piece, position)
        if found < 0:
            return "text: the output ids do not decode to the stored answer"
        position = found + len(piece)
    return None
