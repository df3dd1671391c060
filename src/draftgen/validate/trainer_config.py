"""The trainer's config, written with the export: a SpecForge 0.2.0 DFlash run config that reads the export's files.

`specforge train -c export/specforge.yaml` reads it as it is (its ``Config`` validates it unchanged: the schema's
facts were read from SpecForge 0.2.0's released package, ``specforge/config/schema.py``; the real-server tier loads
it with that package). It holds what the export decides, and the least the schema asks besides:

* ``data``: the pre-tokenized ``prompts.jsonl`` as ``prompts_path`` (its masks are the ones validate built and
  checked), else the conversations of ``train.jsonl`` as ``train_data_path`` (a SpecForge trainer only: SpecForge
  masks them again with ``chat_template``); SpecForge takes exactly one source. ``max_length`` is validate's (the
  rows are cut there already), ``chat_template`` the trainer's SpecForge template, ``train_only_last_turn`` true for
  rows per turn (each row supervises its last turn only, as validate masked it).
* ``model.target_model_path``: the folder validate read the tokenizer and chat template from, which on the GPU node
  is the target model's folder; ``training.strategy``: dflash.
* ``deployment``: SpecForge 0.2.0 trains from raw or pre-tokenized data only online, with its capture servers and
  Mooncake (``deployment.mode: disaggregated``, backend mooncake); their addresses are the training cluster's, so
  only the required fields are written and the header says what to add.

The held-out prompts and the trainer validate reproduced are named in the header's comments: the schema forbids
keys it does not know, and SpecForge 0.2.0 has no evaluation source for online data (``data.eval_data_path`` must
stay empty).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from draftgen.rundir import write_text
from draftgen.rundir.layout import EXPORT_CONVERSATIONS, EXPORT_HOLDOUT, EXPORT_PROMPTS, EXPORT_TRAINER_CONFIG
from draftgen.training.trainers import SpanTrainer, Trainer, trainer_spec

SPECFORGE_VERSION = "0.2.0"
STRATEGY = "dflash"
CONTROL_DIR = "./output/control"  # under SpecForge's default output_dir


def specforge_config(
    export: Path,
    *,
    trainer: Trainer,
    max_length: int | None,
    last_turn_only: bool,
    target_model: str,
    prompts: bool,
    conversations: bool,
) -> dict[str, Any] | None:
    """The run config (as SpecForge's YAML holds it) for an export at ``export`` (its final, absolute folder) that
    holds ``prompts.jsonl`` and/or ``train.jsonl``; None when it holds nothing SpecForge reads as validate checked."""
    spec = trainer_spec(trainer)
    template = spec.specforge_template if isinstance(spec, SpanTrainer) else ""
    if prompts:
        source = {"prompts_path": str(export / EXPORT_PROMPTS)}
    elif conversations and template:
        source = {"train_data_path": str(export / EXPORT_CONVERSATIONS)}
    else:
        return None
    data: dict[str, Any] = dict(source)
    if max_length:  # None (train_max_length 0: no cut): SpecForge's own default applies
        data["max_length"] = max_length
    if template:
        data["chat_template"] = template
    data["train_only_last_turn"] = last_turn_only
    return {
        "model": {"target_model_path": target_model},
        "data": data,
        "training": {"strategy": STRATEGY},
        "deployment": {
            "mode": "disaggregated",
            "disaggregated": {"control_dir": CONTROL_DIR, "backend": "mooncake"},
        },
    }


def header(
    export: Path, trainer: Trainer, *, conversations: bool, holdout: bool, served_model: str | None
) -> str:
    """The comments above the config: what it is, what to add before training, and what the schema cannot hold."""
    lines = [
        f"SpecForge {SPECFORGE_VERSION} run config for DFlash training on this export, written by draftgen validate.",
        "`specforge train -c specforge.yaml` reads it as it is. Before training, add your capture servers and",
        "Mooncake under deployment.disaggregated (server_urls, mooncake_metadata_server,",
        "mooncake_master_server_addr), and the trainer's GPUs under deployment.trainer; if the target's weights",
        "are not in model.target_model_path, point it there. Paths are absolute: if the export moves, override",
        "them (specforge train -c specforge.yaml data.prompts_path=NEW/prompts.jsonl).",
        f"draftgen trainer: {trainer.value} (the loss masks validate built and checked)",
    ]
    if served_model:
        lines.append(f"draftgen target model (as served): {served_model}")
    if conversations:
        lines.append(
            f"draftgen conversations: {export / EXPORT_CONVERSATIONS} (data.train_data_path with chat_template, "
            "instead of prompts_path; without the turns cut by max_tokens)"
        )
    if holdout:
        lines.append(
            f"draftgen held-out prompts: {export / EXPORT_HOLDOUT / EXPORT_PROMPTS} (prompt rows, in no training "
            "file; SpecForge 0.2.0 has no eval source for online data)"
        )
    return "".join(f"# {line}\n" for line in lines)


def write_trainer_config(
    folder: Path,
    export: Path,
    *,
    trainer: Trainer,
    max_length: int | None,
    last_turn_only: bool,
    target_model: str,
    prompts: bool,
    conversations: bool,
    holdout: bool,
    served_model: str | None,
) -> Path | None:
    """Write ``specforge.yaml`` into ``folder`` (the staged export), its paths those of ``export`` (where it is
    published); nothing when the export holds nothing SpecForge reads."""
    config = specforge_config(
        export,
        trainer=trainer,
        max_length=max_length,
        last_turn_only=last_turn_only,
        target_model=target_model,
        prompts=prompts,
        conversations=conversations,
    )
    if config is None:
        return None
    text = header(
        export, trainer, conversations=conversations and prompts, holdout=holdout, served_model=served_model
    )
    return write_text(Path(folder) / EXPORT_TRAINER_CONFIG, text + yaml.safe_dump(config, sort_keys=False))
