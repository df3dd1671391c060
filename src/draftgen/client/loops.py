"""The repetition-loop check: finds, as an answer grows, a cycle that repeats verbatim, so its request can be ended.

Qwen3-family models thinking at length can fall into a loop: one stretch of text, repeated until ``max_tokens``. A
looping request holds a batch slot and burns GPU time on tokens no trainer wants. The check reads the answer as it
streams and says, at the first moment the rule holds, where the loop began and how long its cycle is:

    a suffix of the answer has period p (every unit equals the one p before it) for at least
    max(min_repeats · p, min_span) units, with p <= max_period

(``LoopRule``; a unit is a token, or on the text path a pre-token piece, below). Verbatim only: a near-repeat — a
counter that changes each time round, one word different — breaks the run and never triggers.

**The algorithm** (``LoopDetector``), O(1) amortised per unit over a bounded window, so hundreds of streams share one
event loop: every unit's last ``ANCHOR`` units are hashed (a shift-xor hash: each unit's bits leave it ``ANCHOR``
units later) into a fixed table with chains through a ring of recent positions, as LZ77 compressors find matches. When the anchor ending at position t also ended at
t − d (d <= max_period), d becomes a *candidate period*: its run — how many consecutive units up to t equal the unit
d before them — is counted back once, then kept up to date with one comparison per unit, and dropped at the first
mismatch. A candidate that is a multiple of a live one is not taken (the cycle's own period is found first). The
rule holds when a candidate's run + p reaches max(min_repeats · p, min_span) (a countdown per candidate). Memory per stream: a few fixed tables
(tens of kB), whatever the answer's length.

**Text** (``TextLoopCheck``): SGLang's chat stream sends the output ids only after the finish (docs/engines.md), so
a live check reads the text. It is cut into pieces the way Qwen's pre-tokenizer cuts it (a letter run with one
leading space or mark, one digit, a punctuation run, newline runs, spaces), which for prose are about one token
each; the last piece of each delta is held back until the next one, so the pieces do not depend on how the stream
was chunked. Deltas are gathered and checked every ``CHECK_EVERY`` characters. Where the loop ends is then a
character offset in the answer's text.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from itertools import accumulate

REPETITION_LOOP = "repetition_loop"  # the finish reason of an answer the loop check ended (never a server's)
ANCHOR = 8  # units an anchor covers: a candidate period needs at least this many matching units in a row
SHIFT = (
    7  # the anchor hash shifts by this per unit and keeps ANCHOR · SHIFT bits: a unit counts for ANCHOR units
)
HASH_MASK = (1 << (ANCHOR * SHIFT)) - 1
TABLE_BITS = 12  # anchor table slots (2^12): collisions only cost a chain step, never a wrong answer
TABLE_MASK = (1 << TABLE_BITS) - 1
CHAIN = 4  # earlier positions looked at per unit (the nearest first)
MAX_CANDIDATES = 8


@dataclass(frozen=True)
class LoopRule:
    """When a repeated stretch counts as a loop (docs/generate.md, "Repetition loops")."""

    max_period: int = 512  # the longest cycle looked for, in units
    min_repeats: int = 3  # the cycle must be seen this many times in a row (the first time + repeats)...
    min_span: int = 256  # ...and the repeating stretch must be at least this many units long

    def __post_init__(self) -> None:
        if self.max_period < 1 or self.min_repeats < 2 or self.min_span < 1:
            raise ValueError(f"bad loop rule {self}: max_period >= 1, min_repeats >= 2, min_span >= 1")

    def needed(self, period: int) -> int:
        """Units of repeating stretch a cycle of ``period`` units needs before it is a loop."""
        return max(self.min_repeats * period, self.min_span)

    @property
    def window(self) -> int:
        """Units the detector must remember: the longest stretch it measures, plus one period before it."""
        return self.needed(self.max_period) + self.max_period


@dataclass(frozen=True)
class Loop:
    """A loop found: its cycle began at unit ``start`` and has ``period`` units; found after ``found_at`` units."""

    start: int
    period: int
    found_at: int

    @property
    def kept(self) -> int:
        """Units up to the end of the cycle's first repetition: what is stored of the answer."""
        return self.start + 2 * self.period


class LoopDetector:
    """Feed it units (ints: token ids, or hashes of text pieces) in order; ``feed`` returns the ``Loop`` once the rule
    holds (and keeps returning it after)."""

    __slots__ = ("_cands", "_hash", "_hashes", "_head", "_mask", "_prev", "_ring", "found", "n", "rule")

    def __init__(self, rule: LoopRule | None = None):
        self.rule = rule or LoopRule()
        size = 1 << max(self.rule.window + ANCHOR, 64).bit_length()
        self._mask = size - 1
        self._ring = [0] * size  # the last units
        self._hashes = [0] * size  # the anchor hash ending at each recent position
        self._prev = [-1] * size  # the previous position whose anchor fell in the same table slot
        self._head = [-1] * (1 << TABLE_BITS)  # the latest position per table slot
        # candidate period -> units its run still needs before the rule holds (a countdown: one subtraction a unit)
        self._cands: dict[int, int] = {}
        self._hash = 0
        self.n = 0  # units seen
        self.found: Loop | None = None

    def feed(self, units: list[int]) -> Loop | None:
        if self.found is not None:
            return self.found
        ring, hashes, prev, head, cands = self._ring, self._hashes, self._prev, self._head, self._cands
        mask, max_period = self._mask, self.rule.max_period
        t, h = self.n, self._hash
        for unit in units:
            ring[t & mask] = unit
            if cands:
                for p, left in list(cands.items()):
                    if ring[(t - p) & mask] != unit:
                        del cands[p]
                    elif left > 1:
                        cands[p] = left - 1
                    else:
                        return self._found(t, p)
            # the anchor: a shift-xor hash of the last ANCHOR units (each unit's bits leave after ANCHOR shifts)
            h = ((h << SHIFT) ^ unit) & HASH_MASK
            slot = (h ^ (h >> 29)) & TABLE_MASK
            q = head[slot]
            head[slot] = t
            prev[t & mask] = q
            hashes[t & mask] = h
            steps = 0
            while q >= 0 and t - q <= max_period and steps < CHAIN:
                if hashes[q & mask] == h:
                    d = t - q
                    if d not in cands and len(cands) < MAX_CANDIDATES and all(d % c for c in cands):
                        self._candidate(t, d)
                        if self.found is not None:
                            return self.found
                q = prev[q & mask]
                steps += 1
            t += 1
        self.n, self._hash = t, h
        return None

    def _candidate(self, t: int, d: int) -> None:
        """Take period ``d`` as a candidate if the units up to ``t`` have repeated at that distance for a while:
        its run is counted back once (within the window), then kept by ``feed``."""
        ring, mask = self._ring, self._mask
        limit = min(t - d + 1, len(ring) - d - 1)
        run = 0
        while run < limit and ring[(t - run) & mask] == ring[(t - run - d) & mask]:
            run += 1
        if run < ANCHOR:
            return  # the anchors matched by chance (a hash collision), or only just
        left = self.rule.needed(d) - d - run
        if left <= 0:
            self._found(t, d)
        else:
            self._cands[d] = left

    def _found(self, t: int, period: int) -> Loop:
        """The rule holds at ``t`` for ``period``: its stretch is exactly the rule's length (the first moment it
        holds), unless the candidate was taken late and its run counted back was longer."""
        ring, mask = self._ring, self._mask
        limit = min(t - period + 1, len(ring) - period - 1)
        run = self.rule.needed(period) - period
        while run < limit and ring[(t - run) & mask] == ring[(t - run - period) & mask]:
            run += 1
        self.n = t + 1
        self.found = Loop(start=t - run - period + 1, period=period, found_at=t + 1)
        return self.found


# Qwen's pre-tokenizer, in Python's re: a letter run with one leading non-letter (a space, a mark), one digit, a run of
# punctuation (and the newlines after it), newline runs, spaces before a space or the end, other spaces.
PIECES = re.compile(r"(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BATCH = 1024  # pieces handed to the detector at a time, well under its window
CHECK_EVERY = 256  # characters of text gathered before a check (about 60 pieces)
FIELD_SWITCH = -1  # the unit fed between the reasoning and the answer: a loop never spans the two


@dataclass(frozen=True)
class TextLoop:
    """A loop found in an answer's text: the unit figures (pieces) and where it lies in the text.

    Character offsets count over the reasoning followed by the answer (``reasoning_chars`` of them are reasoning)."""

    start: int  # pieces before the cycle's first occurrence
    period: int  # pieces per cycle
    kept: int  # pieces up to the end of the first repetition
    received: int  # pieces read when it was found
    start_char: int
    kept_chars: int
    received_chars: int


class TextLoopCheck:
    """The loop check over an answer's text as it arrives: reasoning deltas, then answer deltas.

    Deltas are gathered and checked every ``every`` characters (and at the end or a switch of field): one regex pass
    and one detector call per batch instead of per delta, at the price of finding a loop up to that many characters
    later (where it is cut does not change)."""

    __slots__ = (
        "_batches",
        "_carry",
        "_every",
        "_field",
        "_offset",
        "_pending",
        "_pending_chars",
        "detector",
        "found",
    )

    def __init__(self, rule: LoopRule | None = None, every: int = CHECK_EVERY):
        self.detector = LoopDetector(rule)
        self._every = every
        self._pending: list[str] = []
        self._pending_chars = 0
        self._carry = ""  # the last piece, held back: the next delta may continue it
        self._offset = 0  # characters checked (before the carry)
        self._batches: deque[tuple[int, list[int]]] = deque()  # recent (first unit, each unit's end offset)
        self._field: str | None = None
        self.found: TextLoop | None = None

    def feed(self, text: str, field: str = "content") -> TextLoop | None:
        """One delta of ``field`` ("reasoning" or "content"); the loop once found."""
        if self.found is not None or not text:
            return self.found
        if field != self._field:
            if self._field is not None:
                self._check(final=True)
                if self.found is None:
                    self._push([FIELD_SWITCH], [0])  # the switch: one unit of no text
            self._field = field
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._pending_chars >= self._every:
            self._check(final=False)
        return self.found

    def finish(self) -> TextLoop | None:
        """The answer is whole (or its field ends): what is pending, its last piece included, is checked."""
        if self.found is None:
            self._check(final=True)
        return self.found

    def _check(self, *, final: bool) -> None:
        pieces = PIECES.findall(self._carry + "".join(self._pending))
        self._pending.clear()
        self._pending_chars = 0
        self._carry = "" if final or not pieces else pieces.pop()
        for at in range(
            0, len(pieces), BATCH
        ):  # a whole answer at once: in batches, so the window keeps offsets
            batch = pieces[at : at + BATCH]
            self._push(list(map(hash, batch)), list(map(len, batch)))
            if self.found is not None:
                return

    def _push(self, units: list[int], lengths: list[int]) -> None:
        detector, batches = self.detector, self._batches
        ends = list(accumulate(lengths, initial=self._offset))[1:]
        self._offset = ends[-1]
        batches.append((detector.n, ends))
        while batches[0][0] + len(batches[0][1]) < detector.n - detector.rule.window - BATCH:
            batches.popleft()
        loop = detector.feed(units)
        if loop is not None:
            self.found = TextLoop(
                start=loop.start,
                period=loop.period,
                kept=loop.kept,
                received=loop.found_at,
                start_char=self._end_of(loop.start - 1),
                kept_chars=self._end_of(loop.kept - 1),
                received_chars=self._end_of(loop.found_at - 1),
            )

    def _end_of(self, unit: int) -> int:
        """The character offset where ``unit`` ends (0 before the first)."""
        if unit < 0:
            return 0
        for first, ends in reversed(self._batches):
            if first <= unit:
                return ends[unit - first]
        raise AssertionError(f"unit {unit} is older than the window: a draftgen bug")
