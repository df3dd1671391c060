"""validate writes SpecForge's run config with the export: its content without SpecForge (the real-server tier loads
it with SpecForge 0.2.0's own config model: tests_real/test_trainer_config_real.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from test_validate import _config, _planted_corpus

from draftgen.rundir.layout import EXPORT_TRAINER_CONFIG
from draftgen.training.trainers import Trainer
from draftgen.validate.pipeline import finalize_export, validate_generation
from draftgen.validate.trainer_config import specforge_config

EXPORT = Path("/data/run/export")


def _config_of(trainer: Trainer, **files: bool) -> dict | None:
    return specforge_config(
        EXPORT,
        trainer=trainer,
        max_length=4096,
        last_turn_only=True,
        target_model="/models/Qwen3.6-27B",
        prompts=files.get("prompts", True),
        conversations=files.get("conversations", True),
    )


def test_the_pre_tokenized_rows_are_the_data_with_the_trainers_template_and_max_length():
    config = _config_of(Trainer.SPECFORGE_DFLASH_QWEN35)
    assert config is not None
    assert config["data"] == {
        "prompts_path": "/data/run/export/prompts.jsonl",
        "max_length": 4096,
        "chat_template": "qwen3.5",
        "train_only_last_turn": True,
    }
    assert config["model"] == {"target_model_path": "/models/Qwen3.6-27B"}
    assert config["training"] == {"strategy": "dflash"}
    # SpecForge 0.2.0 trains raw or pre-tokenized data online only: the deployment its schema requires for that
    assert config["deployment"]["mode"] == "disaggregated"
    assert config["deployment"]["disaggregated"]["backend"] == "mooncake"
    assert _config_of(Trainer.SPECFORGE_QWEN3_THINKING)["data"]["chat_template"] == "qwen3-thinking"


def test_conversations_are_the_data_only_without_the_pre_tokenized_rows_and_only_for_a_specforge_trainer():
    config = _config_of(Trainer.SPECFORGE_QWEN35, prompts=False)
    assert config is not None and config["data"]["train_data_path"] == "/data/run/export/train.jsonl"
    assert "prompts_path" not in config["data"]  # SpecForge takes exactly one source
    # draftgen's own conventions: SpecForge has no template for them, but reads their pre-tokenized masks as they are
    assert _config_of(Trainer.DRAFTGEN_THINK_IN_PROMPT, prompts=False) is None
    own = _config_of(Trainer.DRAFTGEN_THINK_IN_PROMPT)
    assert own is not None and "chat_template" not in own["data"]
    assert _config_of(Trainer.SPECFORGE_QWEN35, prompts=False, conversations=False) is None


def test_validate_writes_it_into_the_export_pointing_at_the_published_files(
    tmp_path, tokenizer_dir, tokenizer
):
    _planted_corpus(tmp_path / "gen", tokenizer)
    config = _config(
        tmp_path / "gen", tokenizer_dir, tmp_path / "out", max_degenerate_share=0.5, holdout_share=0.3
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    export = finalize_export(result)
    path = export / EXPORT_TRAINER_CONFIG
    text = path.read_text()
    written = yaml.safe_load(text)
    assert Path(written["data"]["prompts_path"]) == (export / "prompts.jsonl").resolve()
    assert Path(written["data"]["prompts_path"]).is_file()  # what it names is there, once published
    assert written["data"]["max_length"] == config.max_length
    assert written["data"]["train_only_last_turn"] is (config.rows == "per_turn")
    assert written["data"]["chat_template"] == "qwen3.5"  # the default trainer, specforge-qwen3.5
    assert Path(written["model"]["target_model_path"]) == Path(tokenizer_dir).resolve()
    # what the schema cannot hold is in the comments: the trainer checked, the other files, the held-out prompts
    assert "# draftgen trainer: specforge-qwen3.5" in text
    assert f"# draftgen conversations: {(export / 'train.jsonl').resolve()}" in text
    held = export / "holdout" / "prompts.jsonl"
    assert held.is_file() and f"# draftgen held-out prompts: {held.resolve()}" in text
    assert json.loads((export / "counts.json").read_text())["held_out"]["prompts"] > 0
