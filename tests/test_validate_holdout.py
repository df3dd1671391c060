"""The held-out split: a stable share of prompt ids, whole conversations, kept out of every training file and
written beside them for the drafter verdict — the same ids on every node and every rerun."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
from validate_helpers import clean_rows, write_generation

from draftgen.params import build_config
from draftgen.prompts.rows import holdout_fraction, shard_of
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import finalize_export, validate_generation


def _validate(folders, tokenizer_dir, tokenizer, out: Path, share: float):  # type: ignore[no-untyped-def]
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": [str(f) for f in folders],
            "tokenizer": str(tokenizer_dir),
            "out_dir": str(out),
            "holdout_share": share,
            "export_tokens": True,
        },
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    return result, finalize_export(result)


def _training_ids(export: Path) -> set[str]:
    """Every prompt id that appears in any training file of an export."""
    ids = {json.loads(x)["id"] for x in (export / "train.jsonl").read_text().splitlines()}
    ids |= {json.loads(x)["id"] for x in (export / "prompts.jsonl").read_text().splitlines()}
    ids |= set(pl.read_parquet(export / "tokens" / "*.parquet")["id"].to_list())
    return {i.partition("#")[0] for i in ids}


def test_the_share_is_a_stable_keyed_hash_independent_of_the_shards():
    ids = [f"p-{i:06d}" for i in range(20_000)]
    held = [i for i in ids if holdout_fraction(i) < 0.01]
    # Binomial(20000, 0.01): 200 ± 14; five standard deviations either way
    assert abs(len(held) - 200) < 5 * math.sqrt(20_000 * 0.01 * 0.99)
    assert held == [i for i in ids if holdout_fraction(i) < 0.01], "the same ids every time"
    assert all(0.0 <= holdout_fraction(i) < 1.0 for i in ids[:100])
    by_shard = [sum(shard_of(i, 2) == s for i in held) for s in (0, 1)]
    assert min(by_shard) > 0.3 * len(held), "the held-out ids spread over the shards"


def test_held_out_conversations_never_reach_a_training_file(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(60)
    write_generation(tmp_path / "gen", rows)
    result, export = _validate([tmp_path / "gen"], tokenizer_dir, tokenizer, tmp_path / "out", 0.25)
    expected = {r["id"] for r in rows if holdout_fraction(r["id"]) < 0.25}
    assert 5 < len(expected) < 30
    assert not _training_ids(export) & expected
    held_rows = result.records.filter(pl.col("held_out"))
    assert set(held_rows["prompt_id"].to_list()) == expected
    multi = [r["id"] for r in rows if r.get("turn_after") and r["id"] in expected]
    assert multi, "a held-out multi-turn conversation is held out whole"
    assert all(held_rows.filter(pl.col("prompt_id") == i).height == 2 for i in multi)
    holdout = [json.loads(x) for x in (export / "holdout" / "prompts.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rows}
    assert {h["id"] for h in holdout} == expected
    assert all(h["messages"] == by_id[h["id"]]["messages"] for h in holdout), (
        "the source prompt, as a prompt row"
    )
    counts = result.counts
    assert counts["held_out"] == {"rows": held_rows.height, "prompts": len(expected)}
    assert counts["out"] == result.records.filter(~pl.col("dropped") & ~pl.col("held_out")).height
    info = json.loads((export / "dataset_info.json").read_text())
    assert info["holdout"]["file"] == "holdout/prompts.jsonl" and info["counts"]["held_out"][
        "prompts"
    ] == len(expected)


def test_the_held_out_answers_are_exported_as_an_eval_set_no_training_file_holds(
    tmp_path, tokenizer_dir, tokenizer
):
    """export/holdout/eval.jsonl: the held-out clean samples in prompts.jsonl's form, the target's own answers a
    drafter is evaluated on (draftgen loop); rows the gate drops stay out of it as they stay out of training."""
    rows = clean_rows(60)
    write_generation(tmp_path / "gen", rows)
    result, export = _validate([tmp_path / "gen"], tokenizer_dir, tokenizer, tmp_path / "out", 0.25)
    held = result.records.filter(pl.col("held_out") & ~pl.col("dropped"))
    eval_rows = [json.loads(x) for x in (export / "holdout" / "eval.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in eval_rows) == sorted(held["id"].to_list())
    assert not {r["id"] for r in eval_rows} & {
        json.loads(x)["id"] for x in (export / "prompts.jsonl").read_text().splitlines()
    }
    masks = dict(zip(held["id"], held["mask_sum"], strict=True))
    for row in eval_rows:
        assert len(row["input_ids"]) == len(row["loss_mask"]) and set(row["loss_mask"]) <= {0, 1}
        assert sum(row["loss_mask"]) == masks[row["id"]], "the trainer's mask, as for a training row"
