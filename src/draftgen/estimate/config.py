"""The estimate notebook's validated, frozen configuration, and the scenarios it compares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from draftgen.params import (
    Bootstrap,
    CategoryField,
    ConcurrencyPerServer,
    GpuHourUsd,
    Interval,
    KeepDuplicates,
    Limit,
    MaxTokens,
    MinTurnBudget,
    NonNegativeFloat,
    NotebookCell,
    Params,
    PositiveFloat,
    PositiveInt,
    ProjectPath,
    TrainMaxLength,
    TunedSettings,
    Turns,
    param,
)
from draftgen.prompts.rows import SYNTHETIC, check_prompt_source, prompt_source_path
from draftgen.rundir.layout import BENCH_RESULTS
from draftgen.sampling_plan import SamplingPlan


class ScenarioSpec(Params):
    """One fleet to price: measured (a benchmark folder) or assumed (a per-GPU throughput you type in)."""

    name: str = Field(min_length=1)
    gpus: PositiveInt  # one server per GPU
    concurrency_per_server: PositiveInt | None = None  # default: the estimate's concurrency_per_server
    gpu_hour_usd: NonNegativeFloat | None = None  # default: the estimate's gpu_hour_usd
    benchmark_dir: ProjectPath | None = (
        None  # a benchmark run folder of THIS hardware; default: the estimate's benchmark
    )
    tok_s_per_gpu: PositiveFloat | None = (
        None  # assumed full-batch output tok/s per GPU (hardware not benchmarked)
    )
    max_running_requests: PositiveInt | None = (
        None  # batch cap of an assumed fleet (default: the benchmark's)
    )
    num_prompts: PositiveInt | None = None  # requests this scenario prices (default: the estimate's set)

    @model_validator(mode="after")
    def _one_source(self) -> ScenarioSpec:
        if self.benchmark_dir and self.tok_s_per_gpu:
            raise ValueError(
                f"scenario {self.name!r}: give benchmark_dir (measured) or tok_s_per_gpu (assumed), not both"
            )
        if self.benchmark_dir and not (Path(self.benchmark_dir) / BENCH_RESULTS).is_file():
            raise ValueError(f"scenario {self.name!r}: {self.benchmark_dir} holds no results.parquet")
        return self


class ArmAssumption(Params):
    """What the estimate assumes of a sampling-plan arm the benchmark did not measure (docs/benchmark.md)."""

    arm: str = Field(min_length=1)  # the arm's name in sampling_plan
    length_factor: PositiveFloat | None = None  # its completion lengths as a multiple of the benchmark's
    accept_length: Annotated[float, Field(ge=1)] | None = (
        None  # its acceptance length (tokens per verify step)
    )

    @model_validator(mode="after")
    def _something(self) -> ArmAssumption:
        if self.length_factor is None and self.accept_length is None:
            raise ValueError(f"arm {self.arm!r}: assume length_factor, accept_length or both")
        return self


# The fleet the last plan priced (docs/benchmark.md): compared by default, at an assumed per-GPU rate.
OLD_PLAN_FLEET = {
    "name": "4x RTX PRO 6000, no MTP (assumed 400 tok/s per GPU)",
    "gpus": 4,
    "tok_s_per_gpu": 400.0,
    "max_running_requests": 64,
    "gpu_hour_usd": 1.8,
}


class EstimateConfig(Params):
    parameters_cell = NotebookCell(
        ("inputs", "benchmark_dir prompts limit dataset_size turns category_field keep_duplicates tokenizer"),
        (
            "the sampling plan (as in generate) and what to assume of arms the benchmark did not measure",
            "sampling_plan arm_assumptions",
        ),
        (
            "the production fleet",
            "gpus concurrency_per_server max_tokens train_max_length min_turn_budget gpu_hour_usd",
        ),
        (
            "other fleets to compare: name, gpus, and either benchmark_dir (measured) or tok_s_per_gpu (assumed)",
            "scenarios",
        ),
        ("the interval", "interval bootstrap seed settings out_dir"),
        help={
            "turns": 'as in generate: "all" counts one request per assistant turn of each conversation; "last" one '
            "per prompt",
            "train_max_length": "the trainer's max_length: what share of the generated tokens falls past it "
            "(0: not checked)",
            "interval": "coverage of the wall-time interval",
            "sampling_plan": "generate's plan: requests per prompt and each arm's lengths and acceptance, from the "
            "benchmark's requests of that arm (benchmark with the same plan) or arm_assumptions ([]: one answer "
            "per prompt)",
        },
    )

    benchmark_dir: ProjectPath = param(
        "",
        'benchmark run folder (outputs/benchmark/RUN: results/requests/occupancy.parquet); "": the newest one',
    )
    prompts: str = param(
        SYNTHETIC, 'the full prompt file to count (.jsonl/.parquet), or "synthetic" (the bundled set)'
    )
    limit: Limit
    dataset_size: Annotated[int, Field(ge=0)] = param(
        0,
        "prompts in the set; 0: the conversations of `prompts` generate will send (its prompt audit)",
    )
    turns: Turns
    category_field: CategoryField
    keep_duplicates: KeepDuplicates
    tokenizer: ProjectPath = param(
        "",
        "the target model's folder, as generate's: each turn's prompt is counted and the turns generate would set "
        'aside under train_max_length and min_turn_budget are not priced ("": every turn priced)',
    )
    sampling_plan: SamplingPlan
    arm_assumptions: list[ArmAssumption] = param(
        default_factory=list,
        help="per arm the benchmark did not measure: {arm, length_factor (x the benchmark's lengths; thinking off "
        "is far shorter), accept_length}",
    )
    gpus: Annotated[int, Field(ge=0)] = param(0, "GPUs, one server each; 0: as many as the benchmark had")
    concurrency_per_server: ConcurrencyPerServer
    max_tokens: MaxTokens
    train_max_length: TrainMaxLength
    min_turn_budget: MinTurnBudget
    gpu_hour_usd: GpuHourUsd
    scenarios: list[ScenarioSpec] = param(
        default_factory=lambda: [dict(OLD_PLAN_FLEET)],
        help="optional keys: concurrency_per_server, gpu_hour_usd, max_running_requests",
        validate_default=True,
    )
    interval: Interval
    bootstrap: Bootstrap
    seed: int = param(0, "random draws of the simulation and the bootstrap")
    settings: TunedSettings
    out_dir: ProjectPath = param(
        "outputs/estimate/interactive",
        "estimate.json and plots go here (draftgen run sets its run folder)",
        validate_default=True,
    )

    @field_validator("prompts")
    @classmethod
    def _prompt_file(cls, path: str) -> str:
        return check_prompt_source(path, allow_empty=True)
        if not Path(path).is_file():
            raise ValueError(
                f"prompt file {path} does not exist (or set dataset_size and leave prompts as is)"
            )
        return path

    @field_validator("benchmark_dir")
    @classmethod
    def _benchmark(cls, path: str) -> str:
        if path and not (Path(path) / BENCH_RESULTS).is_file():
            raise ValueError(
                f"{path} holds no results.parquet: give the folder a benchmark run wrote "
                "(outputs/benchmark/<run>/), or '' for the newest"
            )
        return path

    @model_validator(mode="after")
    def _assumed_arms_are_planned(self) -> EstimateConfig:
        planned = {arm.name for arm in self.sampling_plan}
        unknown = [a.arm for a in self.arm_assumptions if a.arm not in planned]
        if unknown:
            raise ValueError(
                f"arm_assumptions name arms that are not in sampling_plan: {', '.join(unknown)} "
                f"(its arms: {', '.join(sorted(planned)) or 'none'})"
            )
        return self

    @field_validator("scenarios")
    @classmethod
    def _unique_names(cls, scenarios: list[ScenarioSpec]) -> list[ScenarioSpec]:
        names = [s.name for s in scenarios]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"scenario names used twice: {', '.join(duplicates)}")
        return scenarios

    @property
    def prompt_path(self) -> Path:
        return prompt_source_path(self.prompts)
