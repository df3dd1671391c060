"""The benchmark notebook's validated, frozen configuration."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from draftgen.params import (
    CategoryField,
    FleetParams,
    NotebookCell,
    PositiveInt,
    ProjectPath,
    SamplingParams,
    TunedSettings,
    Turns,
    WarmupRequests,
    param,
)
from draftgen.prompts.rows import SYNTHETIC, check_prompt_source, prompt_source_path
from draftgen.sampling_plan import SamplingPlan, arm_sampling

DEFAULT_CONCURRENCIES = [1, 8, 16, 32, 48, 64, 96, 128]
MIN_LEVEL_REQUESTS = 8  # fewest requests a level sends when sized by rounds
WARMUP_MAX_TOKENS = (
    128  # warm-up requests are short: they only wake the server (graphs, caches), never measured
)


class BenchmarkConfig(FleetParams, SamplingParams):
    parameters_cell = NotebookCell(
        ("fleet", "servers model api_key_env request_timeout_s"),
        (
            "prompts and sampling (production settings)",
            "prompts category_field turns max_tokens temperature top_p top_k min_p enable_thinking sampling_plan",
        ),
        (
            "levels",
            "concurrencies num_prompts rounds warmup_requests parallel_servers knee_fraction seed out_dir "
            "settings resume",
        ),
        help={
            "servers": "base URLs, one SGLang server per GPU",
            "request_timeout_s": "one request's time limit (s); a timed-out request counts as failed",
            "warmup_requests": "short requests per server before the first level (not measured)",
            "turns": 'as in generate: "all" asks each agentic row at one answer point its source answered, as '
            "generate asks it, and records whether the target's answer diverged (the estimate prices that); "
            '"last" sends every row whole',
            "sampling_plan": "generate's plan: each level sends the plan's mix (each sampled prompt once per "
            "planned sample, each sample with its arm's sampling), so each arm is measured ([]: one request per "
            "prompt, the settings above)",
        },
    )

    prompts: str = param(
        SYNTHETIC,
        'a .jsonl/.parquet sample of YOUR prompts (lengths depend on them), or "synthetic" (the bundled set)',
    )
    category_field: CategoryField
    turns: Turns
    sampling_plan: SamplingPlan
    num_prompts: PositiveInt = param(
        128,
        "requests per server at each level unless rounds is set (2x the concurrency or more keeps a steady phase)",
    )
    rounds: Annotated[float, Field(ge=0)] = param(
        0.0, "> 0: each level sends ceil(rounds x concurrency) requests (at least 8) instead of num_prompts"
    )
    concurrencies: list[PositiveInt] = param(
        default_factory=lambda: list(DEFAULT_CONCURRENCIES),
        help="requests in flight per server, one level each",
        min_length=1,
    )
    warmup_requests: WarmupRequests
    parallel_servers: bool = param(
        True, "benchmark every server at once (one GPU each); False: one after another"
    )
    knee_fraction: Annotated[float, Field(gt=0, le=1)] = param(
        0.95, "the knee: least concurrency reaching this share of the best tok/s"
    )
    seed: int = param(0, "which prompts are sampled from the file")
    out_dir: ProjectPath = param(
        "outputs/benchmark/interactive",
        "results.parquet, requests.parquet and plots go here (draftgen run sets its run folder)",
        validate_default=True,
    )
    settings: TunedSettings
    resume: bool = param(
        False,
        "reuse levels an interrupted run saved in out_dir/levels/ (same servers, prompts, sampling; "
        "draftgen run --resume sets it)",
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

    def arm_sampling(self, arm: str | None) -> SamplingParams:
        """What a request of ``arm`` is sampled with (None, or no plan: the settings above)."""
        plan = {a.name: a for a in self.sampling_plan}
        return arm_sampling(self.sampling, plan.get(arm) if arm is not None else None)

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
