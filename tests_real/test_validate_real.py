"""validate.ipynb on the real servers' output, with the model's own (tiny) tokenizer and chat template.

The text is a random model's noise, so most samples carry flags (truncated at max_tokens, broken UTF-8): the gate
is opened (max_degenerate_share and max_truncated_share 1.0) and those two flags are reported but kept
(keep_flagged), so the export has rows. What is checked: validate read every stored row, rendered each prompt to
exactly the tokens the serving engine billed, flagged truncation as the servers reported it, and exported what it
kept as conversations and as token ids with loss masks.
"""

from __future__ import annotations

import json

import polars as pl
from conftest import GenerateRun
from notebook_runs import draftgen_run


def test_validate_reads_every_row_and_renders_prompts_as_the_servers_did(generate_run: GenerateRun, tmp_path):
    run_dir = draftgen_run(
        "validate",
        tmp_path,
        "real",
        {
            "generation_dir": str(generate_run.run_dir),
            "tokenizer": generate_run.params["model"],
            "enable_thinking": False,
            "mask_convention": "think_in_prompt",
            "train_max_length": 2048,
            "max_degenerate_share": 1.0,
            "max_truncated_share": 1.0,
            "export_tokens": True,
            "keep_flagged": ["truncated", "invalid_text"],
            # a row per conversation, so that each row's prompt is the request the stored prompt_tokens billed;
            # rows per turn (the default) meet the real servers in test_trainer_oracle_real.py
            "rows": "per_conversation",
        },
    )
    samples = pl.read_parquet(run_dir / "samples.parquet")
    stored = pl.concat(
        [pl.read_parquet(p) for p in sorted((generate_run.run_dir / "shards").glob("*.parquet"))]
    )
    assert sorted(samples["id"].to_list()) == sorted(generate_run.expected_ids)
    joined = samples.join(
        stored.select("id", "prompt_tokens", "finish_reason", "turn_finish_reason"), on="id", suffix="_stored"
    )
    # The prompt validate renders with the tokenizer folder is, token for token, the prompt each server billed.
    assert (joined["n_prompt_tokens"] == joined["prompt_tokens"]).all(), joined.filter(
        pl.col("n_prompt_tokens") != pl.col("prompt_tokens")
    ).select("id", "n_prompt_tokens", "prompt_tokens")
    # A sample is truncated when any of its generated turns is (turns: all generates every assistant turn of a
    # multi-turn prompt; the row's finish_reason is its last turn's).
    turn_reasons = (
        pl.when(pl.col("turn_finish_reason").is_null())
        .then(pl.concat_list(pl.col("finish_reason_stored")))
        .otherwise(pl.col("turn_finish_reason"))
    )
    truncated = joined.select(turn_reasons.list.eval(pl.element() != "stop").list.any().alias("expected"))
    assert (joined["truncated"] == truncated["expected"]).all(), joined.filter(
        pl.col("truncated") != truncated["expected"]
    ).select("id", "truncated", "finish_reason_stored", "turn_finish_reason")
    # multi-turn prompts are among them, so the rule above is met
    assert joined["turn_finish_reason"].list.len().max() > 1
    summary = json.loads((run_dir / "summary.json").read_text())
    counts = summary["counts"]
    assert counts["in"] == len(generate_run.expected_ids)
    exported = [json.loads(line) for line in (run_dir / "export" / "train.jsonl").read_text().splitlines()]
    kept = samples.filter(~pl.col("dropped"))["id"].to_list()
    assert kept and sorted(r["id"] for r in exported) == sorted(kept) and len(kept) == counts["out"]
    for record in exported:
        roles = [turn["role"] for turn in record["conversations"]]
        assert roles[-1] == "assistant" and "user" in roles
    tokens = pl.concat([pl.read_parquet(p) for p in (run_dir / "export" / "tokens").glob("*.parquet")])
    assert sorted(tokens["id"].to_list()) == sorted(kept)
    assert all(
        len(i) == len(m) and sum(m) > 0 for i, m in zip(tokens["input_ids"], tokens["loss_mask"], strict=True)
    )
