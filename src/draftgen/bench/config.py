"""The benchmark notebook's validated, frozen configuration."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from draftgen.params import FleetParams, PositiveInt, SamplingParams
from draftgen.paths import ProjectPath
from draftgen.prompts.rows import SYNTHETIC, check_prompt_source, prompt_source_path
from draftgen.server_settings import SettingsFile

DEFAULT_CONCURRENCIES = [1, 8, 16, 32, 48, 64, 96, 128]
MIN_LEVEL_REQUESTS = 8  # fewest requests a level sends when sized by rounds
WARMUP_MAX_TOKENS = (
    128  # warm-up requests are short: they only wake the server (graphs, caches), never measured
)


class BenchmarkConfig(FleetParams, SamplingParams):
    prompts: str = SYNTHETIC  # .jsonl/.parquet sample of the real prompts, or "synthetic" (the bundled set)
    num_prompts: PositiveInt = 128  # requests per server at each concurrency level (unless `rounds` is set)
    rounds: Annotated[float, Field(ge=0)] = (
        0.0  # > 0: a level sends ceil(rounds x concurrency) requests (>= 8)
    )
    concurrencies: list[PositiveInt] = Field(
        default_factory=lambda: list(DEFAULT_CONCURRENCIES), min_length=1
    )
    warmup_requests: Annotated[int, Field(ge=0)] = 4  # per server, before the first level; not measured
    parallel_servers: bool = True  # benchmark all servers at once (one GPU each, independent)
    knee_fraction: Annotated[float, Field(gt=0, le=1)] = 0.95  # knee: least concurrency reaching this share
    seed: int = 0  # which prompts are sampled from the file
    out_dir: ProjectPath = Field(
        "outputs/benchmark/interactive", validate_default=True
    )  # results.parquet, requests.parquet and plots go here
    settings: SettingsFile = ""  # settings file (draftgen tune) the servers ran with; recorded in the JSON
    resume: bool = (
        False  # reuse levels an interrupted run left in out_dir/levels/ (same servers, prompts, sampling)
    )

    @field_validator("concurrencies")
    @classmethod
    def _distinct(cls, levels: list[int]) -> list[int]:
        duplicates = sorted({c for c in levels if levels.count(c) > 1})
        if duplicates:
            raise ValueError(f"concurrency levels listed more than once: {duplicates}")
        return sorted(levels)

    @field_validator("prompts")
    @classmethod
    def _prompt_file(cls, path: str) -> str:
        return check_prompt_source(path, allow_empty=True)

    @property
    def prompt_path(self) -> Path:
        return prompt_source_path(self.prompts)

    def level_requests(self, concurrency: int) -> int:
        """Requests sent at one level: ``num_prompts``, or ``rounds`` waves of the level's concurrency.

        Rounds keep a concurrency-1 level from costing as much as a whole batch level: 128 sequential
        4K-token completions take about half an hour on one B200.
        """
        if self.rounds > 0:
            return max(MIN_LEVEL_REQUESTS, math.ceil(self.rounds * concurrency))
        return self.num_prompts

    def prompts_needed(self) -> int:
        """Distinct prompts wanted: every server × level gets its own slice while the sample lasts."""
        return len(self.servers) * sum(self.level_requests(c) for c in self.concurrencies)
