"""A prompt file described before anything is spent on it: one streamed pass, no servers.

What it finds (docs/generate.md, "The prompt audit"): rows read; malformed rows by reason and exact duplicate
conversations, both as the reader decides them (``rows.iter_prompts``, the same decision generate makes); shared
first turns (conversations whose first user turn, case folded and whitespace collapsed, another one opens with);
context-free openers (a first user turn of at most ``OPENER_MAX_CHARS`` characters that only asks to go on:
``OPENER``); near-duplicates (``near_duplicates``, MinHash LSH); answer points per conversation; the category or
source mix (``rows.row_category``); and, given generate's length cap (the tokenizer, ``train_max_length``,
``min_turn_budget``), how each answer point would be sent (``turn_budgets``).

Memory: the reader's hash per id and per conversation, one hash and count per distinct first turn, the
near-duplicate index (about 2 KB per conversation indexed, ``near_limit`` bounds it), a uniform sample of
``token_sample`` conversations for the token counts, and counters. A progress bar follows long files.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.prompts.rows import (
    PromptRow,
    RejectedRow,
    conversation_digest,
    count_rows,
    folded,
    iter_prompts,
    prompt_source_path,
)
from draftgen.training.conversation import answer_points

if TYPE_CHECKING:
    from draftgen.generate.length_cap import LengthCap
    from draftgen.prompts.answer_lengths import AnswerLengths
    from draftgen.prompts.turn_budgets import TurnBudgets

# A context-free opener: the first user turn of a part of a longer conversation, which only asks to go on. Matched
# on the folded text with end punctuation stripped, at most OPENER_MAX_CHARS long (a longer turn says more). Words
# that also open real questions ("more", "next", "resume" the noun) are left out.
OPENER = re.compile(
    r"^(?:(?:please|pls|ok|okay|now|and|so)\s+)*"
    r"(?:continue|go on|keep going|keep writing|carry on|proceed)\b"
)
OPENER_MAX_CHARS = 60
EXAMPLES = 3  # examples kept per finding
CATEGORIES = 200  # distinct categories counted by name; the rest as "(other)"
# The near-duplicate index preflight and the estimate build beside other work: the first 20,000 conversations (about
# 40 MB); `draftgen prompts audit` indexes every one unless told (docs/figures.md, figure 32).
NEAR_LIMIT_BESIDE_A_RUN = 20_000
PROGRESS_FROM_ROWS = 5_000  # a progress bar for files at least this long
PROGRESS_FROM_SAMPLE = 100  # and for counting the tokens of at least this many conversations


def is_opener(text: str) -> bool:
    """Whether a first user turn is a context-free "continue" (``OPENER``, at most ``OPENER_MAX_CHARS``)."""
    text = folded(text).strip(" .!?,;:…")
    return len(text) <= OPENER_MAX_CHARS and OPENER.match(text) is not None


def reason_kind(reason: str) -> str:
    """A rejection reason without its particulars (row positions, quoted values): what rows are grouped by."""
    head = reason.split(":")[0].split("(")[0]
    head = re.sub(r"\s*(['\"]).*?\1", "", head)
    return re.sub(r"\[\d+\]", "[i]", head).strip()


# messages, tools, category
Conversation = tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...] | None, str | None]


@dataclass(frozen=True)
class AuditSettings:
    """What the audit reads and how: generate's own parameters where they decide the same thing."""

    path: Path
    category_field: str | None = None
    keep_duplicates: bool = False  # generate's: the duplicates are found either way, and said to be sent
    turns: str = "all"
    limit: int = 0  # the first N conversations kept (generate's limit); 0: all
    near_limit: int = 0  # conversations the near-duplicate index takes (the first N kept); 0: all
    # conversations whose turns are counted (a uniform sample; 0: all): enough that a few long conversations among
    # many short ones move the turns counted by a few percent at most
    token_sample: int = 5_000
    cap: LengthCap | None = None  # generate's length cap: the tokenizer, train_max_length, min_turn_budget
    max_tokens: int = 4096
    enable_thinking: bool = True
    seed: int = 0  # of the token sample (and of the answers drawn)
    progress: bool = True
    # the earlier answers' lengths as measured (the estimate's, from its benchmark); None: the source's stand in
    answers: AnswerLengths | None = None


@dataclass(frozen=True)
class PromptAudit:
    """What a prompt file holds and what generate will make of it."""

    path: str
    rows: int  # rows read (valid and rejected), within the limit
    conversations: int  # valid, distinct conversations: what is sent (duplicates aside)
    rejected: dict[str, int]  # malformed rows by reason kind (exact duplicates are counted apart)
    duplicates: int  # exact duplicate conversations (the same turns as an earlier row, another id)
    keep_duplicates: bool
    shared_first_turns: (
        int  # conversations whose folded first user turn another one opens with (openers aside)
    )
    shared_groups: int  # distinct first turns shared that way
    openers: int  # conversations opening with a context-free "continue"
    near_duplicates: int  # conversations nearly duplicating an earlier one (near_duplicates.SIMILARITY)
    near_indexed: int  # conversations the near-duplicate index took
    turns_mode: str
    turns: dict[int, int]  # answer points per conversation → conversations
    categories: dict[str, int]  # category (or source) → conversations; "(none)" without one
    # category → answer points (requests generate would make of them, nothing set aside); same keys
    category_points: dict[str, int] = field(default_factory=dict)
    examples: dict[str, tuple[str, ...]] = field(default_factory=dict)  # finding → a few, with row numbers
    budgets: TurnBudgets | None = None
    seconds: float = 0.0

    @property
    def rejected_rows(self) -> int:
        return sum(self.rejected.values())

    @property
    def rejected_rate(self) -> float:
        """Malformed rows over rows read, duplicates aside: what generate's max_rejected_rate judges."""
        return self.rejected_rows / self.rows if self.rows else 0.0

    @property
    def sent(self) -> int:
        """Conversations generate will send: the distinct ones, and the duplicates when they are kept."""
        return self.conversations + (self.duplicates if self.keep_duplicates else 0)

    @property
    def answer_points(self) -> int:
        return sum(points * count for points, count in self.turns.items())

    def share(self, count: int) -> float:
        """``count`` over the valid conversations (the distinct ones and their duplicates)."""
        valid = self.conversations + self.duplicates
        return count / valid if valid else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rows": self.rows,
            "conversations": self.conversations,
            "sent": self.sent,
            "rejected": dict(self.rejected),
            "duplicates": self.duplicates,
            "keep_duplicates": self.keep_duplicates,
            "shared_first_turns": self.shared_first_turns,
            "shared_groups": self.shared_groups,
            "openers": self.openers,
            "near_duplicates": self.near_duplicates,
            "near_indexed": self.near_indexed,
            "turns_mode": self.turns_mode,
            "turns": {str(k): v for k, v in sorted(self.turns.items())},
            "categories": dict(self.categories),
            "category_points": dict(self.category_points),
            "examples": {k: list(v) for k, v in self.examples.items()},
            "budgets": self.budgets.as_dict() if self.budgets else None,
            "seconds": self.seconds,
        }


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Tally:
    """The pass's running counts; everything it holds is a hash, a counter or a bounded sample."""

    def __init__(self, settings: AuditSettings):
        self.settings = settings
        self.rows = self.conversations = self.duplicates = self.openers = self.near = 0
        self.rejected: Counter[str] = Counter()
        self.first_turns: dict[int, int] = {}  # digest of the folded first user turn → conversations
        self.turns: Counter[int] = Counter()
        self.categories: Counter[str] = Counter()
        self.category_points: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.sample: list[Conversation] = []  # (messages, tools, category) of the counted conversations
        self.sampler = random.Random(settings.seed)
        self.near_index: Any = None
        self.near_rows: list[int] = []  # the index's conversation number → its row
        self.near_seen = 0  # conversations given to the index (the indexed ones and their near-duplicates)

    def example(self, finding: str, text: str) -> None:
        kept = self.examples.setdefault(finding, [])
        if len(kept) < EXAMPLES:
            kept.append(text)

    def rejected_row(self, item: RejectedRow) -> None:
        if item.duplicate:
            self.duplicates += 1
            self.example("duplicates", f"row {item.row} (id {item.id}): {item.reason}")
        else:
            self.rejected[reason_kind(item.reason)] += 1
            self.example("rejected", f"row {item.row}: {item.reason}")

    def conversation(self, item: PromptRow) -> None:
        self.conversations += 1
        messages = item.messages
        points = len(answer_points(messages, self.settings.turns))
        self.turns[points] += 1
        category = item.category or "(none)"
        if category not in self.categories and len(self.categories) >= CATEGORIES:
            category = "(other)"
        self.categories[category] += 1
        self.category_points[category] += points
        first = next((m["content"] for m in messages if m["role"] == "user"), None)
        if first is not None and is_opener(first):
            self.openers += 1
            self.example("openers", f"row {item.row} (id {item.id}): {_short(first)!r}")
        elif first is not None:
            key = int.from_bytes(conversation_digest(folded(first)), "little")
            seen = self.first_turns.get(key, 0) + 1
            self.first_turns[key] = seen
            if seen == 2:
                self.example("shared_first_turns", f"row {item.row} (id {item.id}): {_short(first)!r}")
        self._near(item)
        self._sample((messages, item.tools, item.category))

    def _near(self, item: PromptRow) -> None:
        limit = self.settings.near_limit
        if limit and self.near_seen >= limit:
            return
        if self.near_index is None:
            from draftgen.prompts.near_duplicates import NearDuplicateIndex

            self.near_index = NearDuplicateIndex()
        match = self.near_index.add(folded(m["content"]) for m in item.messages)
        self.near_seen += 1
        if match is None:
            self.near_rows.append(item.row)  # its number in the index is its place here
        else:
            self.near += 1
            earlier, similarity = match
            self.example(
                "near_duplicates",
                f"row {item.row} (id {item.id}) ≈ row {self.near_rows[earlier]} (similarity {similarity:.2f})",
            )

    def _sample(self, conversation: Conversation) -> None:
        """Reservoir sampling: every conversation has the same chance to be counted, in one pass."""
        if self.settings.cap is None:
            return
        size = self.settings.token_sample
        if not size or len(self.sample) < size:
            self.sample.append(conversation)
            return
        slot = self.sampler.randrange(self.conversations)
        if slot < size:
            self.sample[slot] = conversation


def audit_prompts(settings: AuditSettings) -> PromptAudit:
    """Read the prompt file once (streamed) and describe it; PromptFileError if the file is unusable."""
    from draftgen.display.progressbar import bar_stream, tqdm

    started = time.perf_counter()
    path = prompt_source_path(str(settings.path))
    total = count_rows(path)
    tally = _Tally(settings)
    show = settings.progress and total >= PROGRESS_FROM_ROWS
    with tqdm(total=total, desc="audit", unit="row", disable=not show, file=bar_stream()) as bar:
        for item in iter_prompts(path, category_field=settings.category_field, keep_duplicates=False):
            tally.rows += 1
            bar.update(1)
            if isinstance(item, RejectedRow):
                tally.rejected_row(item)
                continue
            if settings.limit and tally.conversations >= settings.limit:
                tally.rows -= 1  # not within the limit: generate stops before it
                break
            tally.conversation(item)
    budgets = _budgets(settings, tally)
    shared = [count for count in tally.first_turns.values() if count > 1]
    return PromptAudit(
        path=str(path),
        rows=tally.rows,
        conversations=tally.conversations,
        rejected=dict(tally.rejected.most_common()),
        duplicates=tally.duplicates,
        keep_duplicates=settings.keep_duplicates,
        shared_first_turns=sum(shared),
        shared_groups=len(shared),
        openers=tally.openers,
        near_duplicates=tally.near,
        near_indexed=tally.near_seen,
        turns_mode=settings.turns,
        turns=dict(sorted(tally.turns.items())),
        categories=dict(tally.categories.most_common()),
        category_points=dict(tally.category_points),
        examples={k: tuple(v) for k, v in tally.examples.items()},
        budgets=budgets,
        seconds=time.perf_counter() - started,
    )


def _budgets(settings: AuditSettings, tally: _Tally) -> TurnBudgets | None:
    if settings.cap is None:
        return None
    from draftgen.display.progressbar import bar_stream, tqdm
    from draftgen.prompts.turn_budgets import turn_budgets

    show = settings.progress and len(tally.sample) >= PROGRESS_FROM_SAMPLE
    with tqdm(
        total=len(tally.sample), desc="prompt tokens", unit="conv", disable=not show, file=bar_stream()
    ) as bar:
        return turn_budgets(
            tally.sample,
            settings.cap,
            settings.max_tokens,
            settings.enable_thinking,
            settings.turns,
            of_conversations=tally.conversations,
            progress=bar,
            answers=settings.answers,
            seed=settings.seed,
        )
