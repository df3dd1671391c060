"""``draftgen loop``'s parameters as one frozen, validated config."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from draftgen.params import Params, PositiveInt, ProjectPath, TrainerName, param

Seeds = Annotated[list[int], Field(min_length=1)]


class LoopConfig(Params):
    """What the loop trains on, the drafter it trains, and how (docs/loop.md)."""

    export_dir: ProjectPath = param(
        ...,
        "validate's run folder (or its export/): export/prompts.jsonl is arm (a), export/holdout/eval.jsonl the "
        "held-out answers every arm is evaluated on",
        notebook="outputs/validate/pilot",
    )
    prompts: ProjectPath = param(
        ...,
        "the prompt file generate answered, with its own answers (the source's assistant turns): arm (b)",
        notebook="/data/pilot.jsonl",
    )
    target: ProjectPath = param(
        ..., "the target model's folder (HF: config, weights, tokenizer)", notebook="/dev/shm/Qwen3.6-27B"
    )
    trainer: TrainerName
    train_max_length: PositiveInt = param(
        4096, "the trainer's max_length: arm (b)'s rows are cut here, as (a)'s were"
    )
    seeds: Seeds = param(default_factory=lambda: [0, 1, 2], help="one training run per arm and seed")
    epochs: PositiveInt = param(2, "passes over an arm's rows")
    learning_rate: float = param(6e-4, "SpecForge's training.learning_rate (its DFlash recipe's)", gt=0)
    draft_layers: PositiveInt = param(1, "the DFlash drafter's decoder layers (SpecForge derives the rest)")
    block_size: Annotated[int, Field(ge=2)] = param(16, "DFlash block size: draft positions per block + 1")
    num_anchors: PositiveInt = param(
        512, "anchor blocks per training sample (SpecForge's training.num_anchors)"
    )
    attention_backend: Literal["sdpa", "eager", "flex_attention"] = param(
        "sdpa", "SpecForge's training.attention_backend (sdpa runs on a CPU; flex_attention needs a GPU)"
    )
    device: Literal["cpu", "cuda"] = param("cpu", "where the target computes the features and the eval runs")
    dtype: Literal["bfloat16", "float32"] = param("bfloat16", "the target's and the drafter's dtype")
    threads: Annotated[int, Field(ge=0)] = param(
        0,
        "CPU threads torch uses here and in specforge train (0: torch's default); on a busy machine 1 beats 2 "
        "(docs/loop.md)",
    )
    limit: Annotated[int, Field(ge=0)] = param(0, "train on the first N rows of each arm (0: all)")
    matched_arm: bool = param(
        False,
        "also train (a) with each row trained only on as many tokens as its (b) row: the target's answers at the "
        "source answers' volume, so a gap between (a) and (b) can be told apart from how much each holds",
    )
    specforge: str = param("specforge", "the specforge command (a path, or a name on PATH)")
    out_dir: ProjectPath = param(..., "where the run goes", notebook="outputs/loop/pilot")

    @model_validator(mode="after")
    def _distinct_seeds(self) -> LoopConfig:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: each seed once, got {self.seeds}")
        return self
