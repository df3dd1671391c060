"""validate.ipynb on the streamed generate run's folder, with the model folder's own tokenizer and chat template.

The designed model's answers are known token for token, so the training export is checked against what the model
generated. validate makes one sample per generated turn (``multi-000#2``: the third answer of ``multi-000``, the
target's own earlier answers before it) and trains on SGLang's own token ids: the prompt validate renders is the
prompt SGLang billed for that turn, and the supervised tokens of every sample are the designed answer as the
model generated it (reasoning, ``</think>`` straight after it, ``\\n\\n``, the answer, ``<|im_end|>``) and the
template's ``\\n`` after the turn. Re-rendering the text through the chat template would put a ``\\n`` before
``</think>`` that the model never generated: validate flags that ``retokenized_differs`` and keeps the server's ids.
One parameter is relaxed, with its reason: ``min_assistant_tokens`` 4, because the designed answer is 13 tokens
and the production floor (16) would flag every sample ``tiny_mask``. The gate keeps its production thresholds.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from notebook_runs import stored_rows
from prompt_files import ids_of
from test_generate_sglang import SGLANG_CONTENT, tokenizer
from tiny_qwen3 import DESIGNED_ANSWER, DESIGNED_REASONING, IM_END, THINK_CLOSE

# The trainer (specforge-qwen3.5) supervises from the first token after the generation prompt's <think>\n to the end
# of the turn: the server's completion ids, then the template's newline after <|im_end|>.
SUPERVISED = DESIGNED_REASONING + THINK_CLOSE + "\n\n" + DESIGNED_ANSWER + IM_END + "\n"
# Where the template's rendering of the same text differs from the server's ids: it writes "\n</think>".
RETOKENIZED = "server 151668 '</think>' vs re-tokenized 198 '\\n'"


def test_validate_passes_the_gate_and_renders_each_turns_prompt_as_sglang_billed_it(validate_run, stream_run):
    stored = stored_rows(stream_run.run_dir)
    answers = sum(len(t) for t in stored["turn_after"].to_list())
    assert answers == 6 + 3 * 3
    summary = json.loads((validate_run / "summary.json").read_text())
    assert summary["passed"], summary
    assert summary["counts"]["in"] == summary["counts"]["out"] == answers
    assert summary["counts"]["token_source"]["server"] == answers  # SGLang's own ids, every turn
    assert summary["coverage"]["missing"] == 0 and summary["coverage"]["stored"] == len(
        ids_of(stream_run.prompts)
    )
    samples = pl.read_parquet(validate_run / "samples.parquet")
    assert not samples["dropped"].any(), samples.filter(pl.col("dropped")).select("id", "flags")
    assert (samples["token_source"] == "server").all()
    assert all(d.endswith(RETOKENIZED) for d in samples["difference"].to_list()), samples["difference"]
    billed = stored.select("id", "turn_prompt_tokens").explode("turn_prompt_tokens")
    billed = billed.with_columns(pl.int_range(pl.len()).over("id").alias("turn")).rename({"id": "prompt_id"})
    joined = samples.join(billed, on=["prompt_id", "turn"])
    assert joined.height == samples.height == answers
    assert (joined["n_prompt_tokens"] == joined["turn_prompt_tokens"]).all(), joined.select(
        "id", "n_prompt_tokens", "turn_prompt_tokens"
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
        turn = int(
            record["id"].partition("#")[2] or 0
        )  # multi-000#2: the third answer, two earlier ones before it
        assert len(answers) == turn + 1, record
        assert all(a["content"] == SGLANG_CONTENT for a in answers), record
        assert answers[-1]["reasoning_content"] == DESIGNED_REASONING, record
        assert all("reasoning_content" not in a for a in answers[:-1]), record  # earlier turns: content only
    assert len(exported) == 6 + 3 * 3
    assert "old answer" not in (validate_run / "export" / "train.jsonl").read_text()  # only the target's text
