"""validate.ipynb on the streamed generate run's folder, with the model folder's own tokenizer and chat template.

The designed model's answers are known token for token, so the training export is checked against what the model
generated: the prompt validate renders is the prompt SGLang billed, and the supervised tokens of every sample are
the designed answer's (reasoning, ``</think>``, one ``\\n\\n``, the answer, ``<|im_end|>``). One parameter is
relaxed, with its reason: ``min_assistant_tokens`` 4, because the designed answer is 13 tokens and the production
floor (16) would flag every sample ``tiny_mask``. The gate itself keeps its production thresholds.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from notebook_runs import stored_rows
from prompt_files import ids_of
from test_generate_sglang import SGLANG_CONTENT, tokenizer
from tiny_qwen3 import DESIGNED_ANSWER, DESIGNED_REASONING, IM_END, THINK_CLOSE

# The template renders the final turn as <think>\nREASONING\n</think>\n\nANSWER; the trainer (specforge-qwen3.5)
# supervises from the first token after the generation prompt's <think>\n to the end of the turn.
SUPERVISED = DESIGNED_REASONING + "\n" + THINK_CLOSE + "\n\n" + DESIGNED_ANSWER + IM_END + "\n"


def test_validate_passes_the_gate_and_renders_each_prompt_as_sglang_billed_it(validate_run, stream_run):
    summary = json.loads((validate_run / "summary.json").read_text())
    assert summary["passed"], summary
    assert summary["counts"]["in"] == summary["counts"]["out"] == len(ids_of(stream_run.prompts))
    assert summary["coverage"]["missing"] == 0
    samples = pl.read_parquet(validate_run / "samples.parquet")
    assert not samples["dropped"].any(), samples.filter(pl.col("dropped")).select("id", "flags")
    stored = stored_rows(stream_run.run_dir).select("id", "prompt_tokens")
    joined = samples.join(stored, on="id")
    assert joined.height == samples.height
    assert (joined["n_prompt_tokens"] == joined["prompt_tokens"]).all(), joined.select(
        "id", "n_prompt_tokens", "prompt_tokens"
    )


def test_the_export_trains_on_exactly_what_the_model_generated(validate_run, models):
    tok = tokenizer(str(models.designed))
    tokens = pl.concat(
        [pl.read_parquet(p) for p in sorted((validate_run / "export" / "tokens").glob("*.parquet"))]
    )
    assert tokens.height > 0
    for row in tokens.iter_rows(named=True):
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        supervised = tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
        assert supervised == SUPERVISED, row["id"]
    exported = [
        json.loads(line) for line in (validate_run / "export" / "train.jsonl").read_text().splitlines()
    ]
    assert sorted(r["id"] for r in exported) == sorted(tokens["id"].to_list())
    for record in exported:
        answers = [t for t in record["conversations"] if t["role"] == "assistant"]
        expected = 3 if record["id"].startswith("multi") else 1
        assert len(answers) == expected, record
        assert all(
            a["content"] == SGLANG_CONTENT and a["reasoning_content"] == DESIGNED_REASONING for a in answers
        ), record
    assert "old answer" not in (validate_run / "export" / "train.jsonl").read_text()  # only the target's text
