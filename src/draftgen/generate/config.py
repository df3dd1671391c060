"""GenerateConfig: every parameter of generate.ipynb, validated and frozen before any request is sent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from draftgen.params import FleetParams, NonNegativeFloat, PositiveFloat, PositiveInt, SamplingParams
from draftgen.paths import ProjectPath
from draftgen.prompts.rows import check_prompt_source, prompt_source_path

Rate = Annotated[float, Field(ge=0, le=1)]

# Parameters that change what a completion looks like: a resumed run must use the same ones.
FINGERPRINT_FIELDS = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "enable_thinking",
    "turns",
)
# Fingerprint fields added after runs were made, with the value those runs used: left out of the hash when
# equal to it, so an older run resumes with that value (and only that value) without force.
FINGERPRINT_SINCE = {"turns": "last"}


def parse_shard(value: str | list[int] | None) -> tuple[int, int] | None:
    """``"i/n"`` or ``[i, n]`` → (i, n) with 0 <= i < n; ``""``/None → no sharding. ValueError says what is wrong."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        index_text, sep, count_text = value.partition("/")
        if not sep or not index_text.strip().isdigit() or not count_text.strip().isdigit():
            raise ValueError(f'{value!r} is not "index/count" like "0/4"')
        index, count = int(index_text), int(count_text)
    elif isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
        index, count = value
    else:
        raise ValueError(f'{value!r} is not "index/count" or [index, count]')
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ValueError(f"index must be in 0..{count - 1}, got {index}")
    return index, count


class GenerateConfig(FleetParams, SamplingParams):
    """Parameters of one generation run (shared names: docs/design.md; defaults: the production settings)."""

    prompts: str = Field(min_length=1)  # .jsonl / .parquet path, or "synthetic" for the bundled set
    out_dir: ProjectPath = Field(min_length=1)  # run folder: shards/, manifest.json, failed/rejected.parquet
    turns: Literal["all", "last"] = "all"  # all: every assistant turn made by the model; last: the final one
    concurrency_per_server: PositiveInt = 64  # requests kept in flight per server
    batch_save_size: PositiveInt = 500  # rows per parquet shard
    limit: Annotated[int, Field(ge=0)] = 0  # first N valid prompts (0 = all)
    shard: str | list[int] = ""  # "i/n": this process takes prompts whose id hashes to i of n
    stream: bool = False  # stream responses (adds TTFT; costs client CPU)
    max_attempts: PositiveInt = 5  # tries per prompt before it goes to failed.parquet
    backoff_base_s: PositiveFloat = 1.0  # first retry waits up to this (full jitter, doubling)
    backoff_max_s: PositiveFloat = 60.0  # cap on one retry wait
    hang_factor: NonNegativeFloat = (
        3.0  # presume hung after factor x (max_tokens at the server's slow rate); 0: off
    )
    hang_min_s: PositiveFloat = 300.0  # never presume a request hung sooner than this
    server_silence_s: NonNegativeFloat = (
        120.0  # in-flight requests but no answer this long: check /health_generate
    )
    server_down_after: PositiveInt = 5  # consecutive connection/5xx/timeout failures that mark a server down
    probe_interval_s: PositiveFloat = 2.0  # first /health_generate probe delay of a down server (doubles)
    probe_max_interval_s: PositiveFloat = 60.0  # cap on the probe delay
    all_down_timeout_s: PositiveFloat = 3600.0  # halt (work saved) when every server stays down this long
    guard_window: PositiveInt = 200  # recent results the garbage guard looks at
    guard_min_results: PositiveInt = 100  # results needed before the guard may halt
    max_empty_answer_rate: Rate = 0.05  # halt above this share of empty answers (finished, not truncated)
    max_empty_reasoning_rate: Rate = 0.05  # halt above this share of empty reasoning (thinking on)
    max_truncated_rate: Rate = 0.5  # halt above this share of finish_reason "length"
    max_failed_rate: Rate = 0.2  # halt above this share of prompts failing after every attempt
    max_rejected_rate: Rate = 0.01  # abort before starting when more prompt rows than this are malformed
    wait_for_servers_s: NonNegativeFloat = 0.0  # keep polling /health this long for servers still loading
    canary: bool = True  # one full request per server before the run (reasoning and answer must be non-empty)
    estimate: ProjectPath = ""  # path to estimate.json from estimate.ipynb: planned vs actual at the end
    force: bool = False  # resume even if model/sampling parameters differ from the stored run
    progress_interval_s: NonNegativeFloat = 1.0  # seconds between progress-bar refreshes
    acceptance_interval_s: NonNegativeFloat = 60.0  # scrape each worker's /metrics this often (0: never)
    status_interval_s: PositiveFloat = 5.0  # seconds between progress.json writes (draftgen status, monitor)
    hedge_slow_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.7  # at the tail, copy requests running on a
    # server whose median per-request rate is below this x the fleet's to an idle server (0: never)

    @field_validator("shard")
    @classmethod
    def _shard(cls, value: str | list[int]) -> str | list[int]:
        parse_shard(value)
        return value

    @field_validator("estimate")
    @classmethod
    def _estimate(cls, value: str) -> str:
        if value and not Path(value).is_file():
            raise ValueError(
                f"estimate file {value} does not exist (write it with estimate.ipynb, or set '')"
            )
        return value

    _prompts = field_validator("prompts")(check_prompt_source)

    @model_validator(mode="after")
    def _consistent(self) -> GenerateConfig:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_base_s ({self.backoff_base_s})"
            )
        if self.probe_max_interval_s < self.probe_interval_s:
            raise ValueError(
                f"probe_max_interval_s ({self.probe_max_interval_s}) must be >= probe_interval_s "
                f"({self.probe_interval_s})"
            )
        if self.guard_min_results > self.guard_window:
            raise ValueError(
                f"guard_min_results ({self.guard_min_results}) must be <= guard_window ({self.guard_window})"
            )
        return self

    # ----- derived values --------------------------------------------------------------------------------
    @property
    def prompt_path(self) -> Path:
        return prompt_source_path(self.prompts)

    @property
    def shard_spec(self) -> tuple[int, int] | None:
        return parse_shard(self.shard)

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = {name: getattr(self, name) for name in FINGERPRINT_FIELDS}
        shard = self.shard_spec
        fields["shard"] = list(shard) if shard else None
        return fields

    def fingerprint(self) -> str:
        """Stable hash of the parameters that decide the data (model, sampling, shard)."""
        fields = {
            name: value
            for name, value in self.fingerprint_fields().items()
            if name not in FINGERPRINT_SINCE or value != FINGERPRINT_SINCE[name]
        }
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
