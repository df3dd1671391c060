"""Corpus-wide repeats found from 64-bit hashes, the texts re-read only for the rows whose hash repeats.

A million ids held as strings, with the hash table that finds their repeats, cost ~100 bytes each; as a UInt64
hash beside the row's place (shard number, row: 16 bytes) and found by sorting a copy of the hashes, ~24. A hash
that repeats is only a candidate: the ids themselves are then compared, so a collision never flags a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from draftgen.validate.reader import read_shard

HASH_SEED = 20240611


def place_columns(number: int) -> list[pl.Expr]:
    """The row's place in the corpus: its shard's number (corpus order) and its row in that shard."""
    return [
        pl.lit(number, dtype=pl.UInt32).alias("shard"),
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"),
    ]


def id_hashes(shards: Sequence[Path]) -> pl.DataFrame:
    """id_hash, shard, row of every stored row, reading the ``id`` column one shard at a time."""
    parts = [
        read_shard(path, ["id"]).select(pl.col("id").hash(HASH_SEED).alias("id_hash"), *place_columns(n))
        for n, path in enumerate(shards)
    ]
    schema = {"id_hash": pl.UInt64, "shard": pl.UInt32, "row": pl.UInt32}
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


def repeated(hashes: pl.Series, at_least: int = 2) -> pl.Series:
    """The hash values held by ``at_least`` rows or more (nulls ignored): by sorting and counting runs."""
    runs = hashes.drop_nulls().sort().rle().struct.unnest()
    return runs.filter(pl.col("len") >= at_least)["value"]


def candidate_ids(corpus: pl.DataFrame, shards: Sequence[Path]) -> pl.DataFrame:
    """shard, row and the id itself of every row whose ``id_hash`` repeats, in corpus order (re-read from just
    the shards holding one)."""
    rows = corpus.filter(pl.col("id_hash").is_in(repeated(corpus["id_hash"]).implode())).sort("shard", "row")
    found = [
        group.select("shard", "row").with_columns(
            read_shard(shards[number], ["id"])["id"].gather(group["row"]).alias("id")
        )
        for (number,), group in rows.group_by("shard", maintain_order=True)
    ]
    schema = {"shard": pl.UInt32, "row": pl.UInt32, "id": pl.String}
    return pl.concat(found) if found else pl.DataFrame(schema=schema)
