"""Deterministic Qwen3-style completions, planned in the served tokenizer's own tokens.

A completion is filler text with the right structure (reasoning, ``</think>``, answer) and long-tailed lengths in
tokens of the server's tokenizer (``draftgen.sim.tokenizer.SimTokenizer``): its ids are the canonical encoding of
its text, so ``completion_tokens`` is the number of ids, a stream's chunks are cut at token boundaries and the
ids the server reports decode to exactly the text it sends. The ``noncanonical_ids`` fault spells one token as
smaller vocabulary tokens instead: the same text, ids that re-encoding the text does not give back. The
``loop_rate`` fault makes a completion fall into a repetition loop: from a point drawn over it, one cycle of fresh
filler repeats verbatim (ids and text alike) until ``max_tokens``, as a looping Qwen3 does; the plan records where
the loop began and its period (ground truth for the client's loop check). A completion planned with tool calls
(``draftgen.sim.toolcalls``) ends, after its reasoning and an answer of a few words or none, in the calls' text; the
whole text is then encoded at once, and the plan says where the calls begin (``call_start``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from draftgen.sim.filler import OPENERS, filler_units, filler_words
from draftgen.sim.tokenizer import THINK_END, SimTokenizer
from draftgen.sim.toolcalls import SimCall, call_text


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
    """Everything a request will emit: its ids and each one's text (EOS excluded), where thinking ends, the finish."""

    ids: tuple[int, ...]
    tokens: tuple[str, ...]  # the text of each id (what a stream shows when that token is produced)
    think_end_index: int | None  # index of "</think>" in ids; past the end when cut before it; None if off
    finish_type: str  # "stop" or "length"
    counts_eos: (
        bool  # the EOS token is generated (counted in completion_tokens, reported in the ids) but not shown
    )
    eos_id: int
    noncanonical: bool = False  # one token spelled as smaller ones (the noncanonical_ids fault)
    loop_start: int | None = None  # the loop_rate fault: the id index where the repeated cycle first begins
    loop_period: int | None = None  # ...and the cycle's length in ids (None: no loop)
    calls: tuple[SimCall, ...] = ()  # the tool calls its text ends in, whole (a cut before their end: none)
    call_start: int | None = None  # the index of the id where the first call's <tool_call> begins

    @property
    def completion_tokens(self) -> int:
        return len(self.ids) + (1 if self.counts_eos else 0)

    def output_ids(self, emitted: int) -> list[int]:
        """The ids of the first ``emitted`` generated tokens, the EOS included once generated (as SGLang sends)."""
        ids = list(self.ids[:emitted])
        if self.counts_eos and emitted > len(self.ids):
            ids.append(self.eos_id)
        return ids

    def reasoning_tokens(self, emitted: int) -> int:
        """SGLang's ``reasoning_tokens``: the generated tokens up to and including ``</think>`` (all of them while
        thinking has not ended; 0 with thinking off)."""
        if self.think_end_index is None:
            return 0
        return min(emitted, self.think_end_index + 1, len(self.ids))

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


FILLER_CHUNK = 12  # words drawn at a time: fixed, so a shorter filler is always a prefix of a longer one
ANSWER_BEFORE_CALLS = 16  # at most this many tokens of answer before a completion's tool calls


def _filler(
    rng: random.Random, tokenizer: SimTokenizer, tokens: int, opener: str | None
) -> tuple[list[str], int]:
    """(units, their token count): filler of about ``tokens`` tokens of ``tokenizer`` (the first unit that reaches
    it ends it). Drawn from ``rng`` in fixed chunks, so asking for fewer tokens gives a prefix of the same units."""
    units: list[str] = []
    count = 0
    while count < tokens:
        first = not units
        for unit in filler_units(
            filler_words(rng, FILLER_CHUNK, opener if first else None, continuing=not first)
        ):
            units.append(unit)
            count += len(tokenizer.encode_unit(unit))
            if count >= tokens:
                break
    return units, count


def _cycle(rng: random.Random, tokenizer: SimTokenizer, tokens: int) -> tuple[list[str], int]:
    """One loop cycle: filler units that continue the text before them (each starts a piece, so the cycle repeated
    tokenizes as the cycle's ids repeated), of about ``tokens`` tokens; (units, their token count)."""
    units: list[str] = []
    count = 0
    while count < tokens:
        for unit in filler_units(filler_words(rng, FILLER_CHUNK, None, continuing=True)):
            if unit.startswith("\n"):
                continue
            units.append(unit)
            count += len(tokenizer.encode_unit(unit))
            if count >= tokens:
                break
    return units, count


def _fall_into_loop(
    rng: random.Random, tokenizer: SimTokenizer, units: list[str], budget: int, max_period: int
) -> tuple[list[str], int, int]:
    """``units`` cut at a unit edge drawn uniformly over their first ``budget`` tokens, then one cycle of a period
    drawn log-uniformly in 1..``max_period`` tokens, repeated past ``budget``; (units, loop start, period)."""
    period = max(1, min(max_period, round(math.exp(rng.uniform(0.0, math.log(max_period))))))
    counts = [len(tokenizer.encode_unit(unit)) for unit in units]
    at = rng.randrange(max(1, min(sum(counts), budget - 1)))
    start, keep = 0, 0
    while keep < len(units) and start + counts[keep] <= at:
        start += counts[keep]
        keep += 1
    cycle, length = _cycle(rng, tokenizer, period)
    repeats = (budget - start) // length + 2
    return units[:keep] + cycle * repeats, start, length


def _noncanonical(
    rng: random.Random, tokenizer: SimTokenizer, ids: list[int], within: int
) -> list[int] | None:
    """``ids`` with one token among the first ``within`` spelled as smaller vocabulary tokens (same text)."""
    candidates = [i for i in range(min(within, len(ids))) if tokenizer.split(ids[i]) is not None]
    if not candidates:
        return None
    at = rng.choice(candidates)
    return ids[:at] + list(tokenizer.split(ids[at]) or ()) + ids[at + 1 :]


def plan_completion(
    seed: int,
    tokenizer: SimTokenizer,
    *,
    max_tokens: int,
    enable_thinking: bool,
    reasoning_median: int,
    answer_median: int,
    sigma: float,
    empty_answer: bool = False,
    ignore_eos: bool = False,
    noncanonical: bool = False,
    loop_rate: float = 0.0,
    loop_max_period: int = 256,
    calls: Sequence[SimCall] = (),
    answer_before_calls: bool = False,
) -> CompletionPlan:
    """Deterministic completion for one request: long-tailed lengths in tokens, truncated at ``max_tokens``.

    Whether it loops is drawn from the request's own seed (its fourth stream), so the same prompt loops on every
    server, attempt and run: a run with the loop check and one without answer the same prompts the same way.
    ``calls``: the tool calls the answer ends in (after a few words of answer when ``answer_before_calls``); a
    completion that loops, or is cut before the calls' end, makes none."""
    # Lengths, reasoning words, answer words and the fault's choice each have their own stream, and only the
    # first max_tokens + 1 tokens are ever drawn (one more decides stop or length): a request costs what it
    # shows, and a smaller max_tokens cuts the very same completion.
    rng = random.Random(seed)
    words_r, words_a, fault = (random.Random((seed << 2) | k) for k in (1, 2, 3))
    budget = max_tokens + 1
    looping = random.Random(seed << 2) if loop_rate and not empty_answer else None
    loops = looping is not None and looping.random() < loop_rate
    calling = bool(calls) and not loops and not empty_answer and not ignore_eos
    if empty_answer:
        # The short failure: "\n</think>\n\nOK." + EOS after a "<think>\n" generation prompt.
        units = ["\n", THINK_END, "\n\n", "OK."] if enable_thinking else ["OK."]
    else:
        answer_length = _lognormal_length(rng, answer_median, sigma)
        reasoning_length = _lognormal_length(rng, reasoning_median, sigma)
        opener = rng.choice(OPENERS)
        units: list[str] = []
        spent, answering = 0, not enable_thinking
        if enable_thinking:
            units, spent = _filler(words_r, tokenizer, min(reasoning_length, budget), opener)
            # Thinking ends within the budget (or the unit that reached it also completed the reasoning):
            # "\n</think>\n\n" and the answer follow, exactly as they would with a larger max_tokens.
            answering = spent >= reasoning_length
            if answering:
                units = [*units[:-1], units[-1] + "\n", THINK_END, "\n\n"]
                spent = sum(len(tokenizer.encode_unit(u)) for u in units)
        if answering:
            wanted = max(answer_length, budget) if ignore_eos else answer_length
            if calling:
                wanted = min(answer_length, ANSWER_BEFORE_CALLS) if answer_before_calls else 0
            if wanted:
                units += _filler(words_a, tokenizer, max(1, min(wanted, budget - spent)), None)[0]
        calling = calling and answering
    loop_start = loop_period = None
    if looping is not None and loops:
        units, loop_start, loop_period = _fall_into_loop(looping, tokenizer, units, budget, loop_max_period)
    call_char = None
    if calling:
        prefix = "".join(units)
        text = call_text(calls, after_answer=bool(prefix.split(THINK_END)[-1].strip()))
        call_char = len(prefix) + text.index("<tool_call>")
        ids = tokenizer.encode(prefix + text)  # the calls' text merges with nothing: encoded whole, canonical
    else:
        ids = tokenizer.encode_units(units)
    split = _noncanonical(fault, tokenizer, ids, max_tokens) if noncanonical else None
    if split is not None:
        ids = split
    if enable_thinking:  # past the end when thinking was cut before "</think>"
        think_end: int | None = (
            ids.index(tokenizer.think_end_id) if tokenizer.think_end_id in ids else len(ids) + 1
        )
    else:
        think_end = None
    stops = not ignore_eos and len(ids) + 1 <= max_tokens
    if not stops:
        # A length cut (with ignore_eos, max_tokens is the only way to end). A cut before "</think>" leaves
        # think_end_index past the end, so everything emitted is reasoning; a cut inside the calls leaves their
        # text unfinished: no call is made.
        ids = ids[:max_tokens]
    tokens = tuple(tokenizer.piece(i) for i in ids)
    call_start = _token_at(tokens, call_char) if call_char is not None and stops else None
    return CompletionPlan(
        ids=tuple(ids),
        tokens=tokens,
        think_end_index=think_end,
        finish_type="stop" if stops else "length",
        counts_eos=stops,
        eos_id=tokenizer.eos_id,
        noncanonical=split is not None,
        loop_start=loop_start if loop_start is not None and loop_start < len(ids) else None,
        loop_period=loop_period if loop_start is not None and loop_start < len(ids) else None,
        calls=tuple(calls) if call_start is not None else (),
        call_start=call_start,
    )


def _token_at(tokens: Sequence[str], char: int) -> int | None:
    """The index of the token that begins at character ``char`` of their text (None: none does)."""
    position = 0
    for index, piece in enumerate(tokens):
        if position == char:
            return index
        position += len(piece)
    return None


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
