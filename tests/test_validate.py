"""validate: every planted defect flagged, clean samples untouched, the export's shape, the gate, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from validate_helpers import clean_rows, planted_rows, row, write_generation

from draftgen.params import ParameterError, build_config
from draftgen.training.local_tokenizer import build_tiny_tokenizer
from draftgen.training.masks import TokenizerLoadError, load_tokenizer
from draftgen.training.trainers import Trainer
from draftgen.validate import report
from draftgen.validate.config import FLAGS, ValidateConfig
from draftgen.validate.pipeline import (
    ValidationGateError,
    finalize_export,
    gate_message,
    require_fit_to_train,
    validate_generation,
)
from draftgen.validate.reader import GenerationDataError


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tiny")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return load_tokenizer(tokenizer_dir)


def _config(generation: Path, tokenizer_dir: Path, out: Path, **overrides) -> ValidateConfig:
    values = {
        "generation_dir": str(generation),
        "tokenizer": str(tokenizer_dir),
        "out_dir": str(out),
        "max_length": 512,
        "duplicate_answer_min_prompts": 3,
        **overrides,
    }
    return build_config(ValidateConfig, values)


def _planted_corpus(folder: Path) -> tuple[list[dict], list[tuple[dict, str]]]:
    clean = clean_rows(40)
    planted = planted_rows()
    repeat = row(
        clean[3]["id"], reasoning="a second answer for an id", content="Stored twice by a bad resume."
    )
    planted.append((repeat, "duplicate_id"))
    rows = clean[:20] + [r for r, _ in planted] + clean[20:]
    write_generation(folder, rows, shard_size=16)
    return clean, planted


@pytest.mark.parametrize("trainer", [t.value for t in Trainer])
def test_every_planted_defect_is_caught_and_clean_samples_raise_no_flag(
    tmp_path, tokenizer_dir, tokenizer, trainer
):
    clean, planted = _planted_corpus(tmp_path / "gen")
    config = _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out", trainer=trainer)
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    records = result.records
    assert records.height == len(clean) + len(planted)
    assert {flag for _, flag in planted} == set(FLAGS), "the planted corpus must hold every flag kind"
    clean_ids = {r["id"] for r in clean}
    first_occurrences = records.filter(pl.col("id").is_in(clean_ids) & pl.col("id").is_first_distinct())
    assert first_occurrences.height == len(clean)
    assert first_occurrences.filter(pl.col("flags").list.len() > 0).height == 0, first_occurrences.filter(
        pl.col("flags").list.len() > 0
    ).select("id", "flags", "mismatch")
    for sample, flag in planted:
        flagged = records.filter((pl.col("id") == sample["id"]) & pl.col(flag))
        assert flagged.height >= 1, f"{sample['id']} should raise {flag}"
    assert result.counts["out"] == len(clean)
    assert result.counts["dropped"] == len(planted)


def test_the_six_token_sample_is_tiny_and_spikes_in_the_histogram(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(30) + [row(f"six-{i}", reasoning="", content="OK.") for i in range(60)]
    write_generation(tmp_path / "gen", rows)
    config = _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out", duplicate_answer_min_prompts=100)
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    six = result.records.filter(pl.col("id").str.starts_with("six-"))
    assert six["tiny_mask"].all() and six["empty_reasoning"].all()
    (value, count), *_ = report.spikes(result.records["mask_sum"].to_numpy())
    assert count == 60 and value == six["mask_sum"][0]
    assert six["mask_sum"].n_unique() == 1


def _trained_conversation(source: dict) -> list[dict]:
    """What the export must hold for a clean helper row: turns: all rows get the target's answer in place of
    the source's assistant turn; single-turn rows the prompt plus the answer."""

    def answer(content: str, reasoning: str) -> dict:
        return {"role": "assistant", "content": content, "reasoning_content": reasoning}

    final = answer(source["content"], source["reasoning_content"])
    if source.get("turns_mode") == "all":
        first_user, _source_answer, second_user = source["messages"]
        first = answer(source["turn_content"][0], source["turn_reasoning"][0])
        return [first_user, first, second_user, final]
    return [*source["messages"], final]


def test_export_holds_clean_samples_in_the_training_shape(tmp_path, tokenizer_dir, tokenizer):
    clean, planted = _planted_corpus(tmp_path / "gen")
    config = _config(
        tmp_path / "gen", tokenizer_dir, tmp_path / "out", export_tokens=True, max_degenerate_share=0.5
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    export = finalize_export(result)
    assert not (tmp_path / "out" / "export.partial").exists()
    lines = (export / "train.jsonl").read_text(encoding="utf-8").splitlines()
    exported = [json.loads(line) for line in lines]
    assert [e["id"] for e in exported] == [r["id"] for r in clean]  # generation order, first occurrence only
    by_id = {r["id"]: r for r in clean}
    for entry in exported:
        source = by_id[entry["id"]]
        assert set(entry) == {"id", "conversations"}
        assert entry["conversations"] == _trained_conversation(source)
        assert "Source model's answer" not in json.dumps(entry), "only the target's own answers are exported"
    tokens = pl.read_parquet(export / "tokens" / "*.parquet")
    assert tokens.columns == ["id", "input_ids", "loss_mask"]
    assert tokens["id"].to_list() == [r["id"] for r in clean]
    mask_sums = dict(result.records.filter(~pl.col("dropped")).select("id", "mask_sum").iter_rows())
    for entry in tokens.iter_rows(named=True):
        ids, mask = np.array(entry["input_ids"]), np.array(entry["loss_mask"])
        assert ids.shape == mask.shape and set(np.unique(mask)) <= {0, 1}
        assert mask.sum() == mask_sums[entry["id"]]
        source = by_id[entry["id"]]
        supervised = tokenizer.backend_tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
        # the default trainer, SpecForge's qwen3.5 template: from after "<think>\n" through "<|im_end|>\n"
        assert supervised == f"{source['reasoning_content']}\n</think>\n\n{source['content']}<|im_end|>\n"
    counts = json.loads((export / "counts.json").read_text())
    assert counts["in"] == len(clean) + len(planted)
    assert counts["out"] == len(clean) and counts["dropped"] == len(planted)
    # several flags on one sample: counted under each flag, once in "dropped"
    assert sum(counts["dropped_by_flag"].values()) > counts["dropped"]
    for flag, n in counts["dropped_by_flag"].items():
        assert n == int(result.records[flag].sum())


def test_keep_flagged_reports_but_keeps(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(10)
    rows[0] = row("long-one", reasoning="Think. " * 10, content="Long answer. " * 200)
    write_generation(tmp_path / "gen", rows)
    config = _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out", keep_flagged=["over_max_length"])
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    assert result.counts["flagged_but_kept"] == {"over_max_length": 1}
    assert result.counts["out"] == 10 and result.counts["dropped"] == 0
    finalize_export(result)
    ids = [
        json.loads(x)["id"] for x in (tmp_path / "out" / "export" / "train.jsonl").read_text().splitlines()
    ]
    assert "long-one" in ids


def test_duplicate_answer_threshold_is_a_parameter(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(10) + [
        row(f"same-{i}", reasoning="Sure.", content="Same answer every time.") for i in range(4)
    ]
    write_generation(tmp_path / "gen", rows)
    flagged = {}
    for threshold in (4, 5):
        config = _config(
            tmp_path / "gen",
            tokenizer_dir,
            tmp_path / f"out{threshold}",
            duplicate_answer_min_prompts=threshold,
        )
        result = validate_generation(config, tokenizer=tokenizer, progress=False)
        flagged[threshold] = int(result.records["duplicate_answer"].sum())
    assert flagged == {4: 4, 5: 0}


def test_gate_passes_clean_data_and_stops_garbage_without_publishing(tmp_path, tokenizer_dir, tokenizer):
    write_generation(tmp_path / "clean", clean_rows(20))
    passed = validate_generation(
        _config(tmp_path / "clean", tokenizer_dir, tmp_path / "out-clean"),
        tokenizer=tokenizer,
        progress=False,
    )
    assert passed.passed and require_fit_to_train(passed).startswith("PASS")
    garbage = clean_rows(5) + [row(f"g-{i}", reasoning="", content="") for i in range(15)]
    write_generation(tmp_path / "garbage", garbage)
    failed = validate_generation(
        _config(tmp_path / "garbage", tokenizer_dir, tmp_path / "out-garbage"),
        tokenizer=tokenizer,
        progress=False,
    )
    assert failed.degenerate_share == pytest.approx(0.75)
    with pytest.raises(ValidationGateError, match=r"FAIL: 15 of 20 samples degenerate \(75\.0%"):
        require_fit_to_train(failed)
    with pytest.raises(ValidationGateError):
        finalize_export(failed)
    assert not (tmp_path / "out-garbage" / "export").exists()
    assert (tmp_path / "out-garbage" / "export.partial" / "train.jsonl").exists()
    summary = json.loads((tmp_path / "out-garbage" / "summary.json").read_text())
    assert summary["passed"] is False and summary["counts"]["dropped"] == 15


# --- unreadable input: a clear error naming the file --------------------------------------------------------------


def test_missing_or_misplaced_folders_are_named(tmp_path, tokenizer_dir):
    with pytest.raises(GenerationDataError, match=r"nowhere does not exist.*out_dir"):
        validate_generation(_config(tmp_path / "nowhere", tokenizer_dir, tmp_path / "out"), progress=False)
    (tmp_path / "noshards").mkdir()
    with pytest.raises(GenerationDataError, match=r"noshards has no shards/ folder"):
        validate_generation(_config(tmp_path / "noshards", tokenizer_dir, tmp_path / "out"), progress=False)
    (tmp_path / "empty" / "shards").mkdir(parents=True)
    with pytest.raises(GenerationDataError, match=r"holds no \.parquet shards"):
        validate_generation(_config(tmp_path / "empty", tokenizer_dir, tmp_path / "out"), progress=False)


def test_missing_columns_name_the_shard_and_the_columns(tmp_path, tokenizer_dir):
    write_generation(tmp_path / "gen", clean_rows(30), shard_size=10)
    bad = tmp_path / "gen" / "shards" / "part-00001.parquet"
    pl.read_parquet(bad).drop("reasoning_content", "finish_reason").write_parquet(bad)
    with pytest.raises(
        GenerationDataError, match=r"part-00001\.parquet lacks column\(s\) reasoning_content, finish_reason"
    ):
        validate_generation(_config(tmp_path / "gen", tokenizer_dir, tmp_path / "out"), progress=False)


def test_wrong_column_types_name_the_shard(tmp_path, tokenizer_dir):
    write_generation(tmp_path / "gen", clean_rows(10))
    bad = tmp_path / "gen" / "shards" / "part-00000.parquet"
    frame = pl.read_parquet(bad)
    as_json = pl.Series("messages", [json.dumps(m) for m in frame["messages"].to_list()], dtype=pl.String)
    frame.with_columns(as_json).write_parquet(bad)
    with pytest.raises(GenerationDataError, match=r"part-00000\.parquet: messages is String"):
        validate_generation(_config(tmp_path / "gen", tokenizer_dir, tmp_path / "out"), progress=False)


def test_corrupt_shard_is_named_and_nothing_is_written(tmp_path, tokenizer_dir):
    write_generation(tmp_path / "gen", clean_rows(30), shard_size=10)
    bad = tmp_path / "gen" / "shards" / "part-00002.parquet"
    bad.write_bytes(bad.read_bytes()[:200])  # a torn write
    with pytest.raises(GenerationDataError, match=r"part-00002\.parquet cannot be read.*resume generate"):
        validate_generation(_config(tmp_path / "gen", tokenizer_dir, tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


def test_wrong_tokenizer_path_is_named(tmp_path):
    write_generation(tmp_path / "gen", clean_rows(5))
    config = _config(tmp_path / "gen", tmp_path / "no-tokenizer", tmp_path / "out")
    with pytest.raises(TokenizerLoadError, match=r"no-tokenizer does not exist"):
        validate_generation(config, progress=False)


def test_unreadable_manifest_is_a_warning_not_an_error(tmp_path, tokenizer_dir, tokenizer):
    write_generation(tmp_path / "gen", clean_rows(5))
    (tmp_path / "gen" / "manifest.json").write_text("{torn")
    result = validate_generation(
        _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    assert result.samples == 5
    assert any("manifest.json is not readable JSON" in w for w in result.output.warnings)


def test_bad_parameters_are_all_reported(tmp_path):
    with pytest.raises(ParameterError) as error:
        build_config(
            ValidateConfig,
            {
                "generation_dir": str(tmp_path / "gen"),
                "tokenizer": "t",
                "out_dir": str(tmp_path / "gen" / "validated"),
                "mask_convention": "think_somewhere",
                "trainer": "specforge-qwen4",
                "keep_flagged": ["tiny_masks"],
                "max_degenerate_share": 1.5,
            },
        )
    names = {name for name, _ in error.value.problems}
    assert {"mask_convention", "trainer", "keep_flagged.0", "max_degenerate_share"} <= names
    assert "choose one of specforge-qwen3.5" in str(error.value)
    with pytest.raises(ParameterError, match="inside generation_dir"):
        build_config(
            ValidateConfig,
            {
                "generation_dir": str(tmp_path / "gen"),
                "tokenizer": "t",
                "out_dir": str(tmp_path / "gen" / "v"),
            },
        )


def test_the_gate_judges_truncation_and_garbage_against_their_own_thresholds(
    tmp_path, tokenizer_dir, tokenizer
):
    """Expected truncation at max_tokens does not fail the gate; garbage does, even inside a truncation budget."""
    clean = clean_rows(30)
    cut = [
        row(f"cut-{i}", reasoning="Let me think. " * 20, content=None, finish_reason="length")
        for i in range(6)
    ]
    empty = [row(f"empty-{i}", reasoning="Let me think. " * 20, content="") for i in range(4)]

    def gate(name: str, rows: list[dict]):
        write_generation(tmp_path / name, rows)
        config = _config(
            tmp_path / name, tokenizer_dir, tmp_path / f"{name}-out", duplicate_answer_min_prompts=100
        )
        return validate_generation(config, tokenizer=tokenizer, progress=False)

    truncated_only = gate("cut", clean + cut)  # 6 of 36 = 16.7% truncated, under 25%
    assert truncated_only.counts["degenerate"] == 0 and truncated_only.counts["length_limited"] == 6
    assert truncated_only.passed, gate_message(truncated_only)

    too_many_cut = gate("cut-more", clean[:12] + cut)  # 6 of 18 = 33% truncated
    assert not too_many_cut.passed and "max_truncated_share" in gate_message(too_many_cut)

    garbage = gate("garbage", clean + cut + empty)  # 4 of 40 = 10% empty answers, over 5%
    assert garbage.counts["degenerate"] == 4 and garbage.counts["length_limited"] == 6
    assert not garbage.passed
    with pytest.raises(ValidationGateError, match="4 of 40 samples degenerate"):
        require_fit_to_train(garbage)
