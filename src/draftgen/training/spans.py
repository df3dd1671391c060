"""Loss masks of a span trainer (SpecForge's ThinkingParser), token for token, at batch-tokenization speed.

What such a trainer does per conversation (draftgen.training.trainers.SpanTrainer):

1. render the whole conversation through the chat template (no generation prompt, thinking on);
2. ``input_ids`` = the text tokenized (no special tokens added), cut to ``max_length``;
3. scanning left to right, each assistant header starts a span that ends after the next end-of-turn string, or
   at the end of the text when none follows (where a regex ``$`` matches: before a final newline, else at the
   very end); the next header is searched after that span;
4. a span's token positions are the token counts of the text *before* each of its two character boundaries,
   tokenized on their own (then capped at ``len(input_ids)``); tokens in [start, end) are supervised;
5. every occurrence of an ignore string is unmasked again, positioned the same way.

Step 4 is the expensive one when done literally (two extra tokenizations of a growing prefix per turn). Here it is
exact and cheap: the tokenizer splits text on its added tokens (``<|im_start|>``, ``<think>``, ...) before
anything else, and tokenizes the pieces between them independently. So the token count of ``text[:c]`` is the
number of full-text tokens up to the last added token ending at or before ``c``, plus the token count of the
short fragment from there to ``c`` (``"\\n"`` after ``<think>``, ``"assistant\\n"`` after ``<|im_start|>``).
The added tokens are located in the text (leftmost, longest first) and checked against the ids: a sample where they
do not line up, or where an added token straddles a boundary, is counted the literal way instead.

When the fragment's own tokens are not the full text's tokens at that place (the full text merges characters
across the boundary, as in an empty think block: ``<think>`` ``\\n\\n`` ``</think>``), the trainer's positions
no longer follow the text: the sample is marked ``boundary`` (validate flags it ``template_mismatch``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from draftgen.training.trainers import SpanTrainer


@dataclass(frozen=True)
class SpanMasks:
    """Per sample: full token count, the trainer's input_ids and loss_mask, and what looked wrong."""

    n_tokens: np.ndarray  # tokens of the rendered conversation before the max_length cut
    input_ids: list[list[int]]  # cut to max_length
    loss_masks: list[np.ndarray]  # int8, one per sample, len == len(input_ids[i])
    problems: list[str | None]


def find_spans(text: str, spec: SpanTrainer) -> list[tuple[int, int, bool]]:
    """(start, end, closed) character spans the trainer supervises; closed is False when no end-of-turn ends it."""
    spans = []
    header, end_of_turn = spec.assistant_header, spec.end_of_turn
    position = 0
    # where a regex "$" first matches: before a trailing newline, else at the very end
    text_end = len(text) - 1 if text.endswith("\n") else len(text)
    while True:
        found = text.find(header, position)
        if found < 0:
            return spans
        start = found + len(header)
        stop = text.find(end_of_turn, start)
        if 0 <= stop and stop + len(end_of_turn) <= len(text) and stop <= text_end:
            end, closed = stop + len(end_of_turn), True
        else:
            end, closed = max(start, text_end), False
        spans.append((start, end, closed))
        position = end


def find_ignored(text: str, spec: SpanTrainer) -> list[tuple[int, int]]:
    """(start, end) of every non-overlapping occurrence of each ignore string, string by string."""
    out = []
    for needle in spec.ignore_strings:
        position = text.find(needle)
        while position >= 0 and needle:
            out.append((position, position + len(needle)))
            position = text.find(needle, position + len(needle))
    return out


class AddedTokenIndex:
    """The tokenizer's added tokens: their ids, and a pattern finding them in text the way the tokenizer does."""

    def __init__(self, tokenizer: Any):
        vocab: dict[str, int] = tokenizer.get_added_vocab()
        # Tokens that absorb neighbouring spaces, match whole words only, or match after normalization are not
        # where their text is: then every boundary is counted the literal way.
        self.plain = all(
            not (token.lstrip or token.rstrip or token.single_word or token.normalized)
            for token in tokenizer.added_tokens_decoder.values()
        )
        strings = sorted((s for s in vocab if s), key=len, reverse=True)
        self.ids_of = vocab
        self.pattern = re.compile("|".join(re.escape(s) for s in strings)) if strings else None
        size = max([len(tokenizer), *vocab.values()]) + 1
        self.is_added = np.zeros(size, dtype=bool)
        self.is_added[list(vocab.values())] = True

    def locate(self, text: str, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(char starts, char ends, token positions) of the added tokens, or None when text and ids disagree."""
        if not self.plain:
            return None
        if self.pattern is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        array = np.asarray(ids, dtype=np.int64)
        positions = np.flatnonzero(self.is_added[array]) if array.size else np.zeros(0, dtype=np.int64)
        matches = list(self.pattern.finditer(text))
        if len(matches) != positions.size:
            return None
        if matches and not np.array_equal(array[positions], [self.ids_of[m.group()] for m in matches]):
            return None
        starts = np.fromiter((m.start() for m in matches), dtype=np.int64, count=len(matches))
        ends = np.fromiter((m.end() for m in matches), dtype=np.int64, count=len(matches))
        return starts, ends, positions


def _encode(backend: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch  # parallel, in Rust
    return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]


@dataclass
class _Boundary:
    sample: int
    char: int
    base: int  # full-text tokens before the fragment
    fragment: str  # text from the last added token's end to the boundary
    count: int = -1  # tokens of text[:char] on its own (filled in)


def span_masks(
    tokenizer: Any,
    texts: Sequence[str],
    errors: Sequence[str | None],
    spec: SpanTrainer,
    max_length: int,
    *,
    flag_boundaries: bool = True,
    last_only: bool = False,
) -> SpanMasks:
    """The trainer's input_ids and loss_mask for a batch of rendered conversations.

    ``errors``: what is already known to be wrong per sample (a template error renders as ""); it stays the
    sample's first problem, and the mask is still the trainer's. ``flag_boundaries`` False: a boundary the full
    text merges across is not reported (a corpus generated with thinking off has the template's empty think block
    in every sample: the trainer starts one token later, on text the server sent, which is expected).
    ``last_only``: only the last assistant span is supervised (SpecForge's ``train_only_last_turn``: one row per
    generated turn, its history context only).
    """
    backend = tokenizer.backend_tokenizer
    index = AddedTokenIndex(tokenizer)
    full_ids = _encode(backend, list(texts))
    problems: list[str | None] = list(errors)
    spans: list[list[tuple[int, int, bool]]] = []
    ignored: list[list[tuple[int, int]]] = []
    boundaries: list[_Boundary] = []
    # boundaries of samples whose added tokens did not line up with the ids: counted by encoding the prefix
    literal: list[_Boundary] = []
    for i, text in enumerate(texts):
        sample_spans = find_spans(text, spec)  # "" when the template raised: no spans
        if last_only:
            sample_spans = sample_spans[-1:]
        sample_ignored = find_ignored(text, spec)
        spans.append(sample_spans)
        ignored.append(sample_ignored)
        chars = sorted(
            {c for span in sample_spans for c in span[:2]} | {c for s in sample_ignored for c in s}
        )
        if not chars:
            continue
        located = index.locate(text, full_ids[i])
        for char in chars:
            if located is not None:
                starts, ends, positions = located
                # added tokens ending at or before char
                before = int(np.searchsorted(ends, char, side="right"))
                straddles = before < starts.size and starts[before] < char
                if not straddles:
                    base = int(positions[before - 1]) + 1 if before else 0
                    begin = int(ends[before - 1]) if before else 0
                    boundaries.append(_Boundary(i, char, base, text[begin:char]))
                    continue
            literal.append(_Boundary(i, char, 0, text[:char]))
    fragment_ids = _encode(backend, [b.fragment for b in boundaries])
    for boundary, ids in zip(boundaries, fragment_ids, strict=True):
        boundary.count = boundary.base + len(ids)
        full = full_ids[boundary.sample]
        merged = full[boundary.base : boundary.count] != ids
        if merged and flag_boundaries and problems[boundary.sample] is None:
            problems[boundary.sample] = (
                f"boundary: the text before character {boundary.char} tokenizes differently on its own "
                "(the full conversation merges characters across it)"
            )
    for boundary, ids in zip(literal, _encode(backend, [b.fragment for b in literal]), strict=True):
        boundary.count = len(ids)
    counts: dict[tuple[int, int], int] = {(b.sample, b.char): b.count for b in (*boundaries, *literal)}

    n_tokens = np.fromiter((len(ids) for ids in full_ids), dtype=np.int64, count=len(full_ids))
    input_ids = [ids[:max_length] for ids in full_ids]
    masks = []
    for i, ids in enumerate(input_ids):
        mask = np.zeros(len(ids), dtype=np.int8)
        for start, end, _ in spans[i]:
            mask[min(counts[i, start], len(ids)) : min(counts[i, end], len(ids))] = 1
        for start, end in ignored[i]:
            mask[min(counts[i, start], len(ids)) : min(counts[i, end], len(ids))] = 0
        masks.append(mask)
        if problems[i] is None:
            if not spans[i]:
                problems[i] = (
                    f"no assistant span: the header {spec.assistant_header!r} is not in the conversation"
                )
            elif not spans[i][-1][2]:
                problems[i] = f"no end-of-turn: the last assistant span has no {spec.end_of_turn!r}"
    return SpanMasks(n_tokens=n_tokens, input_ids=input_ids, loss_masks=masks, problems=problems)
