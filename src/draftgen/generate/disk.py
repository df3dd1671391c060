"""Room for the output: how many bytes a run will write to ``out_dir``, against what its filesystem has free.

Projected bytes = prompts to do × (completion tokens per row × ``BYTES_PER_TOKEN`` + the prompt's own bytes +
``ROW_OVERHEAD_BYTES``). Tokens per row are the estimate's mean completion length when an estimate is given,
else ``max_tokens`` (every completion at its limit: an upper bound). ``BYTES_PER_TOKEN`` is deliberately high:
shards are zstd parquet, and measured shards hold 1.6–1.8 bytes per completion token (English prose at ~4
characters a token, compressed 2.6×; the simulator's text), up to 3 in shards of under 100 rows; CJK text (~3
UTF-8 bytes a character, compressing less) lands near 2.3. Prompts
are counted at their size in the prompt file (uncompressed JSONL: an over-count).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftgen.display.humanize import human_bytes
from draftgen.rundir import free_bytes

BYTES_PER_TOKEN = 2.5
ROW_OVERHEAD_BYTES = 200  # id, finish reason, counts, server, timings, response id


@dataclass(frozen=True)
class SpaceNeed:
    prompts: int  # rows still to write
    tokens_per_row: float
    tokens_source: (
        str  # "the estimate's mean completion length" or "max_tokens (every completion at its limit)"
    )
    prompt_bytes_per_row: float
    needed_bytes: int
    free_bytes: int
    out_dir: str

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.free_bytes

    def detail(self) -> str:
        need = (
            f"~{human_bytes(self.needed_bytes)} for {self.prompts:,} prompts "
            f"({self.tokens_per_row:,.0f} completion tokens a row from {self.tokens_source}, "
            f"× {BYTES_PER_TOKEN:g} B, + {self.prompt_bytes_per_row:,.0f} B of prompt + {ROW_OVERHEAD_BYTES} B)"
        )
        free = f"{human_bytes(self.free_bytes)} free on the filesystem of {self.out_dir}"
        if self.fits:
            return f"{need}; {free}"
        return (
            f"{need}, but only {free}: free {human_bytes(self.needed_bytes - self.free_bytes)} or choose another "
            "out_dir (a run that fills the disk stops cleanly and resumes, but better not to start one)"
        )


def prompt_bytes_per_row(prompt_path: Path, rows: int) -> float:
    """Mean bytes a prompt row takes in its file (0 when the file or the count is unknown)."""
    try:
        return prompt_path.stat().st_size / rows if rows else 0.0
    except OSError:
        return 0.0


def space_need(
    out_dir: str,
    prompts: int,
    max_tokens: int,
    mean_completion_tokens: float | None,
    prompt_bytes: float,
) -> SpaceNeed:
    """What writing ``prompts`` more rows to ``out_dir`` needs, and what its filesystem has."""
    if mean_completion_tokens:
        tokens, source = (
            float(min(mean_completion_tokens, max_tokens)),
            "the estimate's mean completion length",
        )
    else:
        tokens, source = float(max_tokens), "max_tokens (no estimate: every completion at its limit)"
    per_row = tokens * BYTES_PER_TOKEN + prompt_bytes + ROW_OVERHEAD_BYTES
    return SpaceNeed(
        prompts=prompts,
        tokens_per_row=tokens,
        tokens_source=source,
        prompt_bytes_per_row=prompt_bytes,
        needed_bytes=int(prompts * per_row),
        free_bytes=free_bytes(out_dir),
        out_dir=out_dir,
    )
