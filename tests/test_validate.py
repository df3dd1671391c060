"""validate: every planted defect flagged, clean samples untouched, the export's shape, the gate, bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from validate_helpers import (
    WEATHER,
    agentic_row,
    clean_rows,
    planted_rows,
    planted_tool_rows,
    row,
    with_server_ids,
    write_generation,
)

from draftgen.params import ParameterError, build_config
from draftgen.training.conversation import stored_messages
from draftgen.training.masks import TokenizerLoadError
from draftgen.training.trainers import Trainer
from draftgen.validate import report
from draftgen.validate.config import CUT_CONSEQUENCES, FLAGS, ValidateConfig
from draftgen.validate.pipeline import (
    ValidationGateError,
    finalize_export,
    gate_message,
    require_fit_to_train,
    validate_generation,
)
from draftgen.validate.reader import GenerationDataError


def _config(generation: Path, tokenizer_dir: Path, out: Path, **overrides) -> ValidateConfig:
    values = {
        "generation_dir": str(generation),
        "tokenizer": str(tokenizer_dir),
        "out_dir": str(out),
        "train_max_length": 512,
        "duplicate_answer_min_prompts": 3,
        "holdout_share": 0.0,  # exact counts; the held-out split has tests of its own
        **overrides,
    }
    return build_config(ValidateConfig, values)


def _split_one_token(ids: list[int], tokenizer) -> list[int]:  # type: ignore[no-untyped-def]
    """The same text in other tokens: the first token whose two halves are vocabulary tokens, split in two (what a
    sampled model sometimes emits; re-tokenizing the text merges them back)."""
    vocab = tokenizer.backend_tokenizer
    for position, token in enumerate(ids):
        piece = vocab.id_to_token(token)
        if piece and len(piece) > 1 and not piece.startswith("<"):
            left, right = vocab.token_to_id(piece[:1]), vocab.token_to_id(piece[1:])
            if left is not None and right is not None:
                return [*ids[:position], left, right, *ids[position + 1 :]]
    raise AssertionError("no token to split")


def _id_defects(tokenizer, clean: list[dict]) -> list[tuple[dict, str]]:  # type: ignore[no-untyped-def]
    """A row per token-id defect (the server's ids), each with the flag it must raise."""
    made = clean_rows(8, seed=7, prefix="ids")
    noncanonical = with_server_ids(made[0], tokenizer)
    noncanonical["turn_output_ids"] = [_split_one_token(noncanonical["turn_output_ids"][0], tokenizer)]
    partial = with_server_ids(made[2], tokenizer, missing_turns=(0,))  # made[2] is a two-turn conversation
    foreign = with_server_ids(made[3], tokenizer)
    foreign["turn_output_ids"] = [[*foreign["turn_output_ids"][0][:3], len(tokenizer) + 7]]
    other_text = with_server_ids(made[4], tokenizer)
    other_text["turn_output_ids"] = with_server_ids(made[5], tokenizer)["turn_output_ids"]
    long_prompt = row(
        "ids-long-prompt",
        reasoning="Short thought.",
        content="Short answer.",
        messages=[{"role": "user", "content": " ".join(["every index of the sorted list"] * 120)}],
    )
    return [
        (noncanonical, "retokenized_differs"),
        (partial, "ids_missing"),
        (foreign, "ids_unusable"),
        (other_text, "ids_unusable"),
        # its answer lies past max_length: the trainer's loader drops it (a cut at max_length, not degenerate)
        (with_server_ids(long_prompt, tokenizer), "trainer_rejects"),
    ]


ID_FLAGS = ("retokenized_differs", "ids_missing", "ids_unusable")


def _planted_corpus(folder: Path, tokenizer) -> tuple[list[dict], list[tuple[dict, str]]]:  # type: ignore[no-untyped-def]
    """Clean rows and one row (at least) per flag, every one with the token ids a server returns."""
    rng = random.Random(7)
    agentic = [
        agentic_row(f"clean-agentic-{i}", rng, city=city) for i, city in enumerate(("Paris", "Rome", "Lima"))
    ]
    clean = [with_server_ids(r, tokenizer) for r in [*clean_rows(40), *agentic]]
    planted = [(with_server_ids(r, tokenizer), flag) for r, flag in [*planted_rows(), *planted_tool_rows()]]
    repeat = row(
        clean[3]["id"], reasoning="a second answer for an id", content="Stored twice by a bad resume."
    )
    planted.append((with_server_ids(repeat, tokenizer), "duplicate_id"))
    planted += _id_defects(tokenizer, clean)
    rows = clean[:20] + [r for r, _ in planted] + clean[20:]
    write_generation(folder, rows, shard_size=16)
    return clean, planted


def _span_trainer(trainer: str) -> bool:
    return not trainer.startswith("draftgen-")


@pytest.mark.parametrize(
    ("trainer", "rows"),
    # specforge-lfm is a ChatML model's trainer without reasoning: this corpus is a thinking model's (its own
    # tests: tests/test_trainer_masks.py; against SpecForge on a real ChatML model: tests_model/).
    [(t.value, "per_turn") for t in Trainer if t is not Trainer.SPECFORGE_LFM]
    + [("specforge-qwen3.5", "per_conversation")],
)
def test_every_planted_defect_is_caught_and_clean_samples_raise_no_flag(
    tmp_path, tokenizer_dir, tokenizer, trainer, rows
):
    clean, planted = _planted_corpus(tmp_path / "gen", tokenizer)
    config = _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out", trainer=trainer, rows=rows)
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    records = result.records
    per_turn = rows == "per_turn"
    stored = clean + [r for r, _ in planted]
    turns = [len(r.get("turn_after") or [None]) for r in stored]
    assert records.height == (sum(turns) if per_turn else len(stored))
    assert {flag for _, flag in planted} == set(FLAGS), "the planted corpus must hold every flag kind"
    key = "prompt_id" if per_turn else "id"
    clean_ids = {r["id"] for r in clean}
    first = records.filter(pl.col(key).is_in(clean_ids) & pl.col("id").is_first_distinct())
    assert first[key].n_unique() == len(clean)
    if trainer == "specforge-qwen3-thinking" and per_turn:
        # Its template entry puts "You are a helpful assistant." first when a conversation has no system message: a
        # system prompt the target never saw. The export keeps the server's ids; the difference is reported.
        added = first.filter(pl.col("retokenized_differs"))
        # after "<|im_start|>" (without tools) or after "<|im_start|>system\n", the tools' system turn (with tools)
        tools_turn = len(
            tokenizer.backend_tokenizer.encode("<|im_start|>system\n", add_special_tokens=False).ids
        )
        agentic = added[key].str.starts_with("clean-agentic")
        assert added.height > 0 and added.filter(~agentic)["difference"].str.contains("at token 1: ").all()
        assert added.filter(agentic)["difference"].str.contains(f"at token {tools_turn}: ").all()
        first = first.with_columns(pl.col("flags").list.set_difference(["retokenized_differs"]))
    assert first.filter(pl.col("flags").list.len() > 0).height == 0, first.filter(
        pl.col("flags").list.len() > 0
    ).select("id", "flags", "mismatch", "difference", "ids_problem")
    ids_checked = _span_trainer(trainer) and per_turn
    for sample, flag in planted:
        if flag in ID_FLAGS and not ids_checked:
            continue  # rows from the server's ids: span trainers, a row per turn
        if flag == "trainer_rejects" and not _span_trainer(trainer):
            continue  # draftgen's own conventions cut nothing at max_length: the answer stays supervised
        flagged = records.filter((pl.col(key) == sample["id"]) & pl.col(flag))
        assert flagged.height >= 1, f"{sample['id']} should raise {flag}"
    kept_planted = {
        sample["id"]
        for sample, _ in planted
        if not records.filter((pl.col(key) == sample["id"]) & pl.col("dropped")).height
    }
    # A turn cut by max_tokens trains as generated where its row is the server's ids (train_truncated): the planted
    # rows that finished "length"; one without a finish reason is still dropped.
    cut = {s["id"] for s, _ in planted if s["finish_reason"] == "length"} if ids_checked else set()
    assert set(records.filter(pl.col("cut_trained"))[key].to_list()) == cut
    # draftgen's own conventions cut nothing at max_length (above): the row a span trainer rejects may stay with them
    spared = set() if _span_trainer(trainer) else {s["id"] for s, f in planted if f == "trainer_rejects"}
    assert (
        kept_planted
        <= {s["id"] for s, f in planted if f in config.keep_flagged or f in ID_FLAGS} | cut | spared
    )
    assert "bad-no-finish" not in kept_planted
    assert result.counts["out"] == records.filter(~pl.col("dropped")).height
    exported_prompts = set(records.filter(~pl.col("dropped"))[key].to_list())
    assert clean_ids <= exported_prompts


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


def _trained_rows(source: dict) -> dict[str, tuple[list[dict], dict]]:
    """What the export must hold for a clean helper row: a training row per generated turn (id, with "#k" for
    turn k of a multi-turn row), its history as the target saw it (earlier answers its own content only), and the
    answer that row supervises."""

    def answer(content: str, reasoning: str) -> dict:
        return {"role": "assistant", "content": content, "reasoning_content": reasoning}

    final = answer(source["content"], source["reasoning_content"])
    if source.get(
        "tools"
    ):  # agentic_row: the target's call, the source's result re-addressed to it, a follow-up
        first_user, _source_call, result, second_user = stored_messages(source)
        call = json.loads(source["turn_tool_calls"][0])
        first = {**answer("", source["turn_reasoning"][0]), "tool_calls": call}
        seen = {"role": "assistant", "content": "", "tool_calls": call}
        spliced = {"role": "tool", "content": result["content"], "tool_call_id": call[0]["id"]}
        return {
            f"{source['id']}#0": ([first_user, first], first),
            f"{source['id']}#1": ([first_user, seen, spliced, second_user, final], final),
        }
    if source.get("turns_mode") == "all":
        first_user, _source_answer, second_user = source["messages"]
        first = answer(source["turn_content"][0], source["turn_reasoning"][0])
        seen = {"role": "assistant", "content": source["turn_content"][0]}
        return {
            f"{source['id']}#0": ([first_user, first], first),
            f"{source['id']}#1": ([first_user, seen, second_user, final], final),
        }
    return {source["id"]: ([*source["messages"], final], final)}


def test_export_holds_clean_samples_in_the_training_shape(tmp_path, tokenizer_dir, tokenizer):
    clean, _planted = _planted_corpus(tmp_path / "gen", tokenizer)
    config = _config(
        tmp_path / "gen", tokenizer_dir, tmp_path / "out", export_tokens=True, max_degenerate_share=0.5
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    export = finalize_export(result)
    assert not (tmp_path / "out" / "export.partial").exists()
    kept = result.records.filter(~pl.col("dropped"))
    lines = (export / "train.jsonl").read_text(encoding="utf-8").splitlines()
    exported = [json.loads(line) for line in lines]
    # generation order, first occurrence only; a cut turn trained as generated is in the files of ids only
    finished = kept.filter(~pl.col("cut_trained"))
    assert finished.height < kept.height, "the planted corpus holds cut turns that train"
    assert [e["id"] for e in exported] == finished["id"].to_list()
    expected = {k: v for source in clean for k, v in _trained_rows(source).items()}
    assert set(expected) <= {e["id"] for e in exported}, "every turn of every clean row is a training row"
    agentic = {k for source in clean if source.get("tools") for k in _trained_rows(source)}
    assert agentic, "the clean rows hold agentic conversations"
    for entry in exported:
        assert set(entry) - {"tools"} == {"id", "conversations"}
        if entry["id"] in agentic:  # SpecForge's shape: the schemas as a JSON string
            assert json.loads(entry["tools"]) == [WEATHER]
        assert "Source model's answer" not in json.dumps(entry), "only the target's own answers are exported"
        if entry["id"] in expected:
            assert entry["conversations"] == expected[entry["id"]][0]
    tokens = pl.read_parquet(export / "tokens" / "*.parquet")
    prompts = [json.loads(line) for line in (export / "prompts.jsonl").read_text().splitlines()]
    assert tokens.columns == ["id", "input_ids", "loss_mask"]
    assert tokens["id"].to_list() == kept["id"].to_list() == [p["id"] for p in prompts]
    mask_sums = dict(kept.select("id", "mask_sum").iter_rows())
    for entry, pre in zip(tokens.iter_rows(named=True), prompts, strict=True):
        ids, mask = np.array(entry["input_ids"]), np.array(entry["loss_mask"])
        assert ids.tolist() == pre["input_ids"] and mask.tolist() == pre["loss_mask"]
        assert ids.shape == mask.shape and set(np.unique(mask)) <= {0, 1} and len(ids) <= config.max_length
        assert mask.sum() == mask_sums[entry["id"]]
        if entry["id"] not in expected:
            continue
        supervised = tokenizer.backend_tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
        # the default trainer, SpecForge's qwen3.5 template: from after "<think>\n" through "<|im_end|>\n",
        # only the row's own (last) turn
        done = expected[entry["id"]][1]
        calls = "".join(
            f"<tool_call>\n<function={c['function']['name']}>\n<parameter=city>\n"
            f"{json.loads(c['function']['arguments'])['city']}\n</parameter>\n</function>\n</tool_call>"
            for c in done.get("tool_calls", ())
        )  # the target's call as the template renders it: supervised with its turn
        assert supervised == f"{done['reasoning_content']}\n</think>\n\n{done['content']}{calls}<|im_end|>\n"
    counts = json.loads((export / "counts.json").read_text())
    assert counts["in"] == result.records.height and counts["out"] == kept.height
    assert counts["conversation_rows"] == finished.height == len(exported)
    assert counts["dropped"] == result.records.height - kept.height
    # several flags on one sample: counted under each flag, once in "dropped"
    assert sum(counts["dropped_by_flag"].values()) > counts["dropped"]
    dropped = result.records.filter(pl.col("dropped"))
    for flag, n in counts["dropped_by_flag"].items():
        assert n == int(dropped[flag].sum())
        if flag not in CUT_CONSEQUENCES:  # a defect drops every row that has it
            assert n == int(result.records[flag].sum())


def test_keep_flagged_reports_but_keeps(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(10)
    rows[0] = row("long-one", reasoning="Think. " * 10, content="Long answer. " * 200)
    write_generation(tmp_path / "gen", rows)
    config = _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out", keep_flagged=["over_max_length"])
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    assert result.counts["flagged_but_kept"] == {"over_max_length": 1}
    # a training row per generated turn: clean_rows(10) holds two two-turn conversations
    assert result.counts["out"] == 12 and result.counts["dropped"] == 0
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
    garbage = clean_rows(5) + [row(f"g-{i}", reasoning="", content="") for i in range(15)]  # 6 + 15 rows
    write_generation(tmp_path / "garbage", garbage)
    failed = validate_generation(
        _config(tmp_path / "garbage", tokenizer_dir, tmp_path / "out-garbage"),
        tokenizer=tokenizer,
        progress=False,
    )
    assert failed.degenerate_share == pytest.approx(15 / 21)
    with pytest.raises(ValidationGateError, match=r"FAIL: 15 of 21 samples degenerate \(71\.4%"):
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
    assert result.records["prompt_id"].n_unique() == 5 and result.samples == 6  # one two-turn conversation
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

    # training rows: clean_rows(30) holds seven two-turn conversations, 37 rows
    truncated_only = gate("cut", clean + cut)  # 6 of 43 = 14% truncated, under 25%
    assert truncated_only.counts["degenerate"] == 0 and truncated_only.counts["length_limited"] == 6
    assert truncated_only.passed, gate_message(truncated_only)

    too_many_cut = gate("cut-more", clean[:12] + cut)  # 6 of 15 + 6 = 29% truncated
    assert not too_many_cut.passed and "max_truncated_share" in gate_message(too_many_cut)

    garbage = gate("garbage", clean + cut + empty)  # 4 of 47 = 8.5% empty answers, over 5%
    assert garbage.counts["degenerate"] == 4 and garbage.counts["length_limited"] == 6
    assert not garbage.passed
    with pytest.raises(ValidationGateError, match="4 of 47 samples degenerate") as failed:
        require_fit_to_train(garbage)
    # the advice names the cause the flags show, not the truncation's
    assert "Most degenerate samples are empty_answer" in str(failed.value)
    assert "--reasoning-parser" in str(failed.value) and "raise max_tokens" not in str(failed.value)


def test_an_answer_past_max_length_is_the_trainers_cut_not_a_tiny_mask(tmp_path, tokenizer_dir, tokenizer):
    """A conversation longer than max_length (generated without generate's cap) leaves its answer outside the
    trainer's window: dropped and counted as cut at max_length, never degenerate; an empty answer there still is."""
    pasted = [{"role": "user", "content": "Pasted log line with some words. " * 300 + "What failed?"}]
    rows = clean_rows(10)
    rows.append(
        row("past", reasoning="Read the log. " * 5, content="The disk filled up. " * 5, messages=pasted)
    )
    rows.append(row("past-empty", reasoning="Read the log. " * 5, content="", messages=pasted))
    write_generation(tmp_path / "gen", rows)
    result = validate_generation(
        _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    by_id = {r["id"]: r for r in result.records.to_dicts()}
    past = by_id["past"]
    assert (
        past["over_max_length"] and past["past_max_length"] and past["cut_at_max_length"] and past["dropped"]
    )
    assert not past["tiny_mask"]  # (trainer_rejects: its loader drops it, which is what the counts say)
    assert by_id["past-empty"]["empty_answer"] and by_id["past-empty"]["dropped"]
    assert result.counts["degenerate"] == 1  # the empty answer only
    assert result.counts["cut_at_max_length"]["rows"] == 1
    buckets = result.counts["yield"]["buckets"]
    assert buckets["cut at max_length"] >= past["generated_tokens"]
    assert all(not r["past_max_length"] for i, r in by_id.items() if i.startswith("clean"))


def test_an_answer_past_max_length_is_kept_where_tiny_masks_are(tmp_path, tokenizer_dir, tokenizer):
    pasted = [{"role": "user", "content": "Pasted log line with some words. " * 300 + "What failed?"}]
    rows = [
        *clean_rows(4),
        row("past", reasoning="Read the log.", content="The disk filled up. " * 5, messages=pasted),
    ]
    write_generation(tmp_path / "gen", rows)
    kept = ["over_max_length", "tiny_mask", "trainer_rejects"]
    config = _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out", keep_flagged=kept)
    records = validate_generation(config, tokenizer=tokenizer, progress=False).records
    past = records.filter(pl.col("id") == "past").row(0, named=True)
    assert past["past_max_length"] and not past["dropped"]
