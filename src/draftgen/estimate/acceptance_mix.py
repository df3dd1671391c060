"""The rate at the acceptance of the set's own mix of prompts, not the benchmark's.

With MTP a server's decode step costs the same whatever its drafts accept, so its tokens/s is proportional to the
tokens a verify step yields (the acceptance length), and that depends on what is asked: code and arithmetic accept
more than prose. The benchmark asks each sampled row once; generate with ``turns: all`` asks a multi-turn or agentic
row once per answer point, so those categories weigh more in the run's tokens than in the benchmark's (on the
bundled set: long chats 4% of the benchmark's tokens, 15% of the run's). The rate curve, fitted at the benchmark's
mix, is scaled by the set's tokens per verify step over the benchmark's: each category's measured steps per token,
weighted by the tokens the set will generate in it (the prompt audit's requests of that category, each as long as
the category's measured completions cut at the turn's room).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from draftgen.prompts.audit import PromptAudit

NO_CATEGORY = "(none)"  # the prompt audit's name for rows without one
# Fewer measured requests of a category: it takes the pooled acceptance. Far fewer than lengths need
# (answer_lengths.MIN_CATEGORY_REQUESTS): each request's acceptance is already a mean over hundreds of verify steps.
MIN_CATEGORY_REQUESTS = 8


@dataclass(frozen=True)
class AcceptanceMix:
    """Tokens per verify step at the benchmark's mix and at the set's, and the categories measured apart."""

    benchmark: float
    set: float
    apart: tuple[str, ...]  # categories with their own measured acceptance (the rest: the pooled one)

    @property
    def factor(self) -> float:
        """What the benchmark's rate curve is multiplied by."""
        return self.set / self.benchmark

    @property
    def note(self) -> str:
        return (
            f"rate at the set's mix of prompts: {self.set:.3f} tokens per verify step against the benchmark's "
            f"{self.benchmark:.3f} (generate asks a conversation once per answer point, the benchmark once), so the "
            f"benchmark's curve is scaled by {self.factor:.3f}; acceptance measured apart for "
            f"{', '.join(self.apart) or 'no category'} (fewer than {MIN_CATEGORY_REQUESTS} requests: pooled)"
        )


def _clipped_means(lengths: np.ndarray, rooms: np.ndarray) -> np.ndarray:
    """For each room, the mean of ``lengths`` each cut at it."""
    ordered = np.sort(lengths)
    below = np.concatenate([[0.0], np.cumsum(ordered)])
    at = np.searchsorted(ordered, rooms, side="right")
    return (below[at] + (ordered.size - at) * np.where(np.isfinite(rooms), rooms, 0.0)) / ordered.size


def set_rooms(audit: PromptAudit) -> dict[str, list[float]]:
    """Every request the set sends, as its turn's room (inf: the full max_tokens), by category: the audit's counted
    conversations as it sent them, else each answer point of each category uncapped."""
    budgets = audit.budgets
    if budgets is not None and budgets.conversation_categories and budgets.conversation_rooms:
        counted = len(budgets.conversation_categories)
        rooms: dict[str, list[float]] = {}
        for index, own in enumerate(budgets.conversation_rooms):
            category = budgets.conversation_categories[index % counted] or NO_CATEGORY
            rooms.setdefault(category, []).extend(own)
        return rooms
    return {category: [np.inf] * points for category, points in audit.category_points.items()}


def acceptance_mix(requests: pl.DataFrame, rooms: Mapping[str, Sequence[float]]) -> AcceptanceMix | None:
    """The set's tokens per verify step (its requests' ``rooms`` by category: ``set_rooms``) against the
    benchmark's, from the benchmark's answered requests with a verify count; None when it has none (a server without
    speculative decoding, or one that does not report it) or the set sends nothing."""
    needed = {"ok", "category", "completion_tokens", "spec_verify_ct"}
    if not needed <= set(requests.columns):
        return None
    measured = requests.filter(
        pl.col("ok")
        & (pl.col("spec_verify_ct").fill_null(0) > 0)
        & (pl.col("completion_tokens").fill_null(0) > 0)
    ).with_columns(pl.col("category").fill_null(NO_CATEGORY))
    if measured.is_empty():
        return None
    tokens = measured["completion_tokens"].to_numpy().astype(float)
    steps = measured["spec_verify_ct"].to_numpy().astype(float)
    pooled = steps.sum() / tokens.sum()  # verify steps per token
    by_category = measured.group_by("category").agg(
        pl.len().alias("n"), pl.col("completion_tokens"), "spec_verify_ct"
    )
    apart = {
        row["category"]: (np.asarray(row["completion_tokens"], dtype=float), sum(row["spec_verify_ct"]))
        for row in by_category.iter_rows(named=True)
        if row["n"] >= MIN_CATEGORY_REQUESTS
    }
    set_tokens = set_steps = 0.0
    for category, turns in rooms.items():
        lengths, category_steps = apart.get(category, (tokens, None))
        made = float(_clipped_means(lengths, np.asarray(turns, dtype=float)).sum())
        per_token = pooled if category_steps is None else category_steps / lengths.sum()
        set_tokens += made
        set_steps += made * per_token
    if set_tokens <= 0:
        return None
    return AcceptanceMix(benchmark=1.0 / pooled, set=set_tokens / set_steps, apart=tuple(sorted(apart)))
