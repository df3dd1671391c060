"""What the generate benchmarks share: a generate config aimed at a simulated fleet, and one preflighted run."""

from __future__ import annotations

import asyncio
from pathlib import Path

from draftgen.generate import GenerateConfig, RunResult, generate, preflight
from draftgen.params import build_config
from draftgen.sim import SimFleet

MODEL = "Qwen/Qwen3.6-27B"


def sim_generate_config(fleet: SimFleet, prompts: Path, out_dir: Path, **settings: object) -> GenerateConfig:
    """Production defaults except what a benchmark must not trip on: no canary, truncation allowed."""
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": MODEL,
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "max_truncated_rate": 1.0,
        "canary": False,
    }
    values.update(settings)
    return build_config(GenerateConfig, values)


def run_generate(config: GenerateConfig, *, progress: bool = True) -> RunResult:
    async def run() -> RunResult:
        plan = await preflight(config)
        return await generate(config, plan, progress=progress)

    return asyncio.run(run())
