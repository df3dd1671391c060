"""The per-sample records, written to ``samples.parquet`` as each batch is validated, never held whole.

A million training rows' records take ~330 bytes each in memory (ids, folder and shard names, previews, flags), so
validate writes each batch's records as one part file under ``samples.parts/`` and, at the end, streams the parts
into one ``samples.parquet`` (polars' streaming engine, in row groups of ``ROW_GROUP`` rows). Counts, the yield, the
report's tables and plots read that file lazily, projecting the few columns each needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from draftgen.rundir import replace_file, write_parquet
from draftgen.rundir.layout import VALIDATE_RECORD_PARTS as PARTS
from draftgen.rundir.layout import record_part_name

# The streaming sink holds a row group in memory until it is full: its default (~250K rows, ~90 MB of records)
# would make the combining step grow with the corpus. 16K rows: ~6 MB, and few row groups in the footer.
ROW_GROUP = 16_384


def _fixed_schema(records: pl.DataFrame) -> pl.DataFrame:
    """A batch whose text column (finish_reason, a preview) is null throughout holds it as Null: cast to String,
    so every part has the same schema and the parts concatenate as one file."""
    null = [name for name, dtype in records.schema.items() if dtype == pl.Null]
    return records.with_columns(pl.col(null).cast(pl.String)) if null else records


class RecordsWriter:
    """Appends each batch's records as a part file; ``close`` combines them into ``path`` and removes the parts."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.parts = self.path.parent / PARTS
        if self.parts.exists():  # a run that stopped half-way left its parts
            shutil.rmtree(self.parts)
        self.parts.mkdir(parents=True)
        self._written = 0
        self._schema: pl.Schema | None = None

    def write(self, records: pl.DataFrame) -> None:
        records = _fixed_schema(records)
        if self._schema is None:
            self._schema = records.schema
        elif records.schema != self._schema:
            records = records.cast(
                dict(self._schema)
            )  # e.g. an integer column inferred narrower in one batch
        write_parquet(self.parts / record_part_name(self._written), records)
        self._written += 1

    def close(self) -> Path:
        """Stream the parts into one file in batch order (an empty frame when there were no rows)."""
        if self._written:
            parts = [self.parts / record_part_name(n) for n in range(self._written)]
            lazy = pl.scan_parquet(parts)
            replace_file(
                self.path,
                lambda temporary: lazy.sink_parquet(temporary, engine="streaming", row_group_size=ROW_GROUP),
            )
        else:
            write_parquet(self.path, pl.DataFrame())
        shutil.rmtree(self.parts)
        return self.path
