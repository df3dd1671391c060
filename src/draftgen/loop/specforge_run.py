"""One SpecForge training run: its run config (SpecForge 0.2.0's typed ``specforge train`` config, offline DFlash),
the command, and what its log says its own evaluator measured.

The config's facts were read from SpecForge's released package (``specforge/config/schema.py``): offline features
(``data.hidden_states_path``, ``data.eval_hidden_states_path`` with ``training.eval_interval``), one process, DDP
rather than FSDP (``training.fsdp_sharding: NO_SHARD``; FSDP refuses a CPU), the strategy ``dflash``.
"""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgen.loop.config import LoopConfig
from draftgen.rundir import write_text

LOG_TAIL = 30
# SpecForge's console logger prints each logged step as ``step N: {python dict}``.
STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")


class SpecForgeRunError(RuntimeError):
    """``specforge train`` failed: the message names the run, its log and the log's last lines."""


def steps_for(rows: int, epochs: int, batch_size: int = 1) -> int:
    return math.ceil(rows / batch_size) * epochs


def run_config(
    config: LoopConfig, *, train: Path, evaluate: Path, rows: int, seed: int, out: Path, run_id: str
) -> dict[str, Any]:
    """The run config of one arm and seed: trained on ``train``'s features, evaluated once, at the end, on
    ``evaluate``'s (no best-checkpoint choice on the eval set: it is the held-out verdict)."""
    steps = steps_for(rows, config.epochs)
    return {
        "model": {
            "target_model_path": str(config.target),
            "torch_dtype": config.dtype,
            "draft_num_hidden_layers": config.draft_layers,
            "draft_block_size": config.block_size,
        },
        "data": {
            "hidden_states_path": str(train),
            "eval_hidden_states_path": str(evaluate),
            "max_length": config.train_max_length,
            "dataloader_num_workers": 0,
            "cache_dir": str(out / "cache"),
        },
        "training": {
            "strategy": "dflash",
            "num_epochs": config.epochs,
            "batch_size": 1,
            "learning_rate": config.learning_rate,
            "attention_backend": config.attention_backend,
            "fsdp_sharding": "NO_SHARD",
            "num_anchors": config.num_anchors,
            "eval_interval": steps,
            "log_interval": max(1, steps // 10),
            "seed": seed,
        },
        "run_id": run_id,
        "output_dir": str(out),
    }


@dataclass(frozen=True)
class TrainRun:
    run_id: str
    folder: Path
    checkpoint: Path  # the last step's checkpoint folder (training_state.pt)
    eval_metrics: dict[str, float]  # SpecForge's own evaluator at the last step (eval/avg_acc, ...)
    train_metrics: list[dict[str, Any]]  # each logged training step
    seconds: float


def logged_steps(log: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for line in log.splitlines():
        match = STEP_LINE.match(line.strip())
        if match:
            try:
                out.append((int(match.group(1)), ast.literal_eval(match.group(2))))
            except (ValueError, SyntaxError):
                continue
    return out


def train(
    config: LoopConfig, run_config_: dict[str, Any], *, command: Sequence[str] | None = None
) -> TrainRun:
    """Write the run config, run ``specforge train -c`` on it (its output to ``train.log`` beside), and read back the
    last checkpoint and what SpecForge's evaluator printed."""
    import time

    import yaml

    out = Path(run_config_["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    run_id = run_config_["run_id"]
    path = out / "specforge.yaml"
    write_text(path, yaml.safe_dump(run_config_, sort_keys=False))
    log_path = out / "train.log"
    argv = [*(command or [config.specforge]), "train", "-c", str(path)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if config.threads:
        env["OMP_NUM_THREADS"] = str(config.threads)
    started = time.monotonic()
    with log_path.open("wb") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        try:
            done = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        except FileNotFoundError:
            raise SpecForgeRunError(
                f"{argv[0]!r} not found: install SpecForge 0.2.0 (docs/loop.md) or give its path as specforge"
            ) from None
    seconds = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    if done.returncode != 0:
        tail = "\n".join(text.splitlines()[-LOG_TAIL:])
        raise SpecForgeRunError(
            f"specforge train {run_id} exited {done.returncode} (log {log_path}):\n{tail}"
        )
    steps = logged_steps(text)
    evals = [m for _, m in steps if any(k.startswith("eval/") for k in m)]
    latest = out / f"{run_id}-latest"
    if not evals or not (latest / "training_state.pt").is_file():
        raise SpecForgeRunError(
            f"specforge train {run_id} left no evaluation or no last checkpoint (log {log_path})"
        )
    return TrainRun(
        run_id=run_id,
        folder=out,
        checkpoint=latest.resolve(),
        eval_metrics={k: float(v) for k, v in evals[-1].items() if isinstance(v, (int, float))},
        train_metrics=[{"step": s, **m} for s, m in steps if not any(k.startswith("eval/") for k in m)],
        seconds=seconds,
    )


def load_run_config(path: Path, overrides: Sequence[str] = ()) -> Any:
    """SpecForge's own typed Config of a written run config (its loader, its checks)."""
    from specforge.config import load_config

    return load_config(str(path), list(overrides))


def typed(run_config_: dict[str, Any]) -> Any:
    """SpecForge's own typed Config of a run config dict (its checks)."""
    from specforge.config import Config

    return Config.model_validate(run_config_)
