"""The share of prompt tokens the servers' prefix caches served, per server and per turn index.

SGLang started with ``--enable-cache-report`` (``draftgen serve`` starts it so) says in every answer's usage how many
of the prompt's tokens its radix cache held (``usage.prompt_tokens_details.cached_tokens``); generate stores it per
turn (``turn_cached_tokens``, beside ``turn_server`` and ``turn_prompt_tokens``). A turn whose server said nothing (an
engine without the report, a server started without the flag, a turn the loop check ended live: no usage came) is
left out of both sums, so the share is over the turns that were measured, and ``turns`` says how many.

One reading for every view: generate's report and validate's dataset card build their tables with ``cache_tables``
from the shards; a running session tallies its stored conversations per turn index with ``CacheTally`` for
progress.json (``draftgen status`` adds each server's live counters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

COLUMNS = ("turn_server", "turn_prompt_tokens", "turn_cached_tokens")


def share(cached: int, prompt: int) -> float | None:
    """Cached ÷ prompt tokens; None when nothing was measured."""
    return cached / prompt if prompt else None


def measured_turns(shards: pl.LazyFrame) -> pl.LazyFrame:
    """One row per stored turn whose server reported its cached tokens: server, turn index, prompt and cached
    tokens (``shards`` in the stored row's schema; older shards, without the columns, give no rows)."""
    return (
        shards.select(*COLUMNS)
        .filter(pl.col("turn_cached_tokens").is_not_null())
        .with_columns(pl.int_ranges(pl.col("turn_cached_tokens").list.len()).alias("turn"))
        .explode("turn", *COLUMNS)
        .filter(pl.col("turn_cached_tokens").is_not_null() & pl.col("turn_prompt_tokens").is_not_null())
        .rename(
            {"turn_server": "server", "turn_prompt_tokens": "prompt_tokens", "turn_cached_tokens": "cached"}
        )
    )


def _by(turns: pl.LazyFrame, key: str) -> pl.DataFrame:
    return (
        turns.group_by(key)
        .agg(
            pl.len().alias("turns"),
            pl.col("prompt_tokens").sum(),
            pl.col("cached").sum().alias("cached_tokens"),
        )
        .with_columns((pl.col("cached_tokens") / pl.col("prompt_tokens")).round(4).alias("cached_share"))
        .sort(key)
        .collect()
    )


def cache_tables(shards: pl.LazyFrame) -> dict[str, pl.DataFrame]:
    """``{"server": ..., "turn": ...}``: turns, prompt tokens, cached tokens and their share, per server and per
    turn index (0: a conversation's first answer), over the turns that reported it; both empty when none did."""
    turns = measured_turns(shards)
    return {"server": _by(turns, "server"), "turn": _by(turns, "turn")}


class CacheTally:
    """Prompt and cached tokens per turn index, over the stored conversations whose turns reported them."""

    def __init__(self) -> None:
        self._by_turn: list[list[int]] = []

    def add_row(self, row: Mapping[str, Any]) -> None:
        prompts: Sequence[int | None] = row.get("turn_prompt_tokens") or ()
        cached: Sequence[int | None] = row.get("turn_cached_tokens") or ()
        for turn, (prompt, hit) in enumerate(zip(prompts, cached, strict=False)):
            if prompt is None or hit is None:
                continue
            while len(self._by_turn) <= turn:
                self._by_turn.append([0, 0])
            self._by_turn[turn][0] += prompt
            self._by_turn[turn][1] += hit

    def by_turn(self) -> tuple[tuple[int, int], ...]:
        """(prompt tokens, cached tokens) per turn index."""
        return tuple((prompt, hit) for prompt, hit in self._by_turn)
