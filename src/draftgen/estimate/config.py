"""The estimate notebook's validated, frozen configuration, and the scenarios it compares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from draftgen.params import NonNegativeFloat, Params, PositiveFloat, PositiveInt
from draftgen.paths import ProjectPath
from draftgen.prompts.rows import SYNTHETIC, check_prompt_source, prompt_source_path
from draftgen.server_settings import SettingsFile


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
        if self.benchmark_dir and not (Path(self.benchmark_dir) / "results.parquet").is_file():
            raise ValueError(f"scenario {self.name!r}: {self.benchmark_dir} holds no results.parquet")
        return self


class EstimateConfig(Params):
    benchmark_dir: ProjectPath = (
        ""  # benchmark run folder (results/requests/occupancy.parquet); "" = newest under outputs/benchmark
    )
    prompts: str = SYNTHETIC  # the full prompt set (.jsonl/.parquet) to count, or "synthetic" (bundled set)
    limit: Annotated[int, Field(ge=0)] = 0  # as in generate: only the first N prompts (0 = all)
    dataset_size: Annotated[int, Field(ge=0)] = 0  # prompts in the set; 0 = count the rows of `prompts`
    turns: Literal["all", "last"] = (
        "all"  # as in generate: all = one request per assistant turn of a conversation
    )
    gpus: Annotated[int, Field(ge=0)] = (
        0  # GPUs (one server each) of the production fleet; 0 = as benchmarked
    )
    concurrency_per_server: PositiveInt = 64  # requests in flight per server in production
    max_tokens: PositiveInt = 4096  # longest completion in production (tokens)
    gpu_hour_usd: NonNegativeFloat = 6.0  # price of one GPU-hour, dollars
    scenarios: list[ScenarioSpec] = Field(default_factory=list)  # other fleets to price side by side
    interval: Annotated[float, Field(gt=0, lt=1)] = 0.9  # coverage of the wall-time interval
    bootstrap: Annotated[int, Field(ge=10)] = 200  # resamples behind the interval
    seed: int = 0  # random draws of the simulation and the bootstrap
    settings: SettingsFile = ""  # settings file (draftgen tune) the servers ran with; recorded in the JSON
    out_dir: ProjectPath = Field(
        "outputs/estimate/interactive", validate_default=True
    )  # estimate.json and plots go here

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
        if path and not (Path(path) / "results.parquet").is_file():
            raise ValueError(
                f"{path} holds no results.parquet: give the folder a benchmark run wrote "
                "(outputs/benchmark/<run>/), or '' for the newest"
            )
        return path

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
