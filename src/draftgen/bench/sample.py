"""A seeded uniform sample of prompts from a (possibly huge) prompt file, in one streaming pass."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftgen.prompts.rows import PromptRow, RejectedRow, iter_prompts
from draftgen.sampling_plan import Arm, sample_rows


@dataclass(frozen=True)
class PromptSample:
    rows: tuple[PromptRow, ...]
    path: Path
    rows_read: int  # valid rows seen in the file
    rejected: int  # malformed rows skipped (the generate notebook reports them one by one)

    def planned(self, arms: Sequence[Arm]) -> PromptSample:
        """The sample with each prompt once per planned sample of the sampling plan, a prompt's samples side by
        side (as generate sends them); itself without a plan."""
        if not arms:
            return self
        rows = tuple(sample for row in self.rows for sample in sample_rows(row, arms))
        return dataclasses.replace(self, rows=rows)

    def slice(self, start: int, count: int) -> list[PromptRow]:
        """``count`` rows from position ``start``, wrapping around when the sample is smaller than asked."""
        size = len(self.rows)
        return [self.rows[(start + i) % size] for i in range(count)]


def sample_prompts(
    path: str | Path, count: int, seed: int = 0, category_field: str | None = None
) -> PromptSample:
    """Reservoir-sample ``count`` valid rows (all of them when the file has fewer), in a seeded random order;
    each keeps its category (``category_field``, else the common names: ``draftgen.prompts.rows``)."""
    if count < 1:
        raise ValueError("count must be >= 1")
    rng = random.Random(seed)
    reservoir: list[PromptRow] = []
    seen = 0
    rejected = 0
    for item in iter_prompts(path, category_field=category_field):
        if isinstance(item, RejectedRow):
            rejected += 1
            continue
        seen += 1
        if len(reservoir) < count:
            reservoir.append(item)
        else:
            slot = rng.randrange(seen)
            if slot < count:
                reservoir[slot] = item
    if not reservoir:
        raise ValueError(
            f"prompt file {path} has no usable rows ({rejected} rejected): nothing to benchmark with"
        )
    rng.shuffle(reservoir)
    return PromptSample(rows=tuple(reservoir), path=Path(path), rows_read=seen, rejected=rejected)
