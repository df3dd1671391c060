"""generate.ipynb against real SGLang, run the production way (``draftgen run generate -p ...``).

The plain server's designed model answers every turn with a known text, so what generate stored is checked
exactly: the reasoning and the answer of every turn, each turn's completion tokens (the designed path's tokens) and
prompt tokens (the tokenizer's rendering of the request generate sent, the model's own earlier answers in it).
Streaming and non-streaming, ``turns: all`` over three-turn conversations, and a client SIGKILLed mid-run then
resumed: every id stored exactly once.
"""

from __future__ import annotations

import functools
import json

import polars as pl
from notebook_runs import assert_exactly_once, notebook_text, stored_rows
from prompt_files import ids_of
from tier_runs import RESUME_PROMPTS, GenerateRun, ResumeRun
from tiny_qwen3 import DESIGNED_ANSWER, DESIGNED_REASONING, IM_END, THINK_CLOSE

# SGLang's qwen3 reasoning parser keeps the "\n\n" the model emits after </think> at the start of content.
SGLANG_CONTENT = "\n\n" + DESIGNED_ANSWER


@functools.cache
def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def designed_completion_tokens(model_dir: str) -> int:
    """The designed path after the thinking-on prompt, <|im_end|> included (SGLang counts the stop token)."""
    text = DESIGNED_REASONING + THINK_CLOSE + "\n\n" + DESIGNED_ANSWER + IM_END
    return len(tokenizer(model_dir).encode(text, add_special_tokens=False))


def request_of(messages: list[dict], turn_after: int, earlier: dict[int, str]) -> list[dict]:
    """What generate sends for the answer after ``messages[turn_after]`` with ``turns: all`` (docs/design.md):
    the source up to there, its assistant messages replaced by the target's earlier answers (content only)."""
    out = []
    for index, message in enumerate(messages[: turn_after + 1]):
        if message["role"] != "assistant":
            out.append({"role": message["role"], "content": message["content"]})
        if index in earlier:
            out.append({"role": "assistant", "content": earlier[index]})
    return out


def test_streamed_multi_turn_run_stores_the_designed_answer_of_every_turn(stream_run: GenerateRun, models):
    rows = assert_exactly_once(stream_run.run_dir, ids_of(stream_run.prompts))
    manifest = json.loads((stream_run.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    completion = designed_completion_tokens(str(models.designed))
    for row in rows.iter_rows(named=True):
        expected_after = [1, 3, 5] if row["id"].startswith("multi") else [0]
        assert row["turn_after"] == expected_after, row["id"]
        assert row["turns_mode"] == "all"
        assert row["turn_reasoning"] == [DESIGNED_REASONING] * len(expected_after), row["id"]
        assert row["turn_content"] == [SGLANG_CONTENT] * len(expected_after), row["id"]
        assert row["turn_finish_reason"] == ["stop"] * len(expected_after), row["id"]
        assert row["turn_completion_tokens"] == [completion] * len(expected_after), row["id"]
        assert row["completion_tokens"] == completion * len(expected_after)
        assert row["ttft_s"] is not None and row["usage_reported"]  # streamed, with SGLang's usage chunk
        assert row["spec_accept_length"] is None  # the plain server does not speculate
    assert rows.filter(pl.col("id").str.starts_with("multi")).height == 3


def test_each_turn_billed_the_tokens_of_the_request_generate_built(stream_run: GenerateRun, models):
    """Each turn's prompt_tokens (SGLang's usage) equal the model folder's template rendering of the request:
    thinking on reached SGLang, and later turns carried the target's own earlier answers, not the source's."""
    tok = tokenizer(str(models.designed))
    for row in stored_rows(stream_run.run_dir).iter_rows(named=True):
        earlier: dict[int, str] = {}
        for after, content, billed in zip(
            row["turn_after"], row["turn_content"], row["turn_prompt_tokens"], strict=True
        ):
            ids = tok.apply_chat_template(
                request_of(row["messages"], after, earlier),
                add_generation_prompt=True,
                enable_thinking=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
            assert billed == len(ids), (row["id"], after)
            earlier[after] = content


def test_every_stored_turn_has_the_cached_tokens_sglang_reported(stream_run: GenerateRun):
    """draftgen serve starts SGLang with --enable-cache-report, so each streamed answer's usage chunk says how many
    prompt tokens its radix cache held; every turn stores it, and a conversation's later turn (answered on the one
    server, where the turn before it ran) finds at least half of the previous turn's prompt cached."""
    for row in stored_rows(stream_run.run_dir).iter_rows(named=True):
        cached, prompt = row["turn_cached_tokens"], row["turn_prompt_tokens"]
        assert row["turn_server"] == [stream_run.params["servers"][0]] * len(cached), row["id"]
        assert all(isinstance(c, int) and 0 <= c < p for c, p in zip(cached, prompt, strict=True)), row["id"]
        for k in range(1, len(cached)):
            assert cached[k] >= prompt[k - 1] // 2, (row["id"], k, cached, prompt)


def test_preflight_read_the_real_engine(stream_run: GenerateRun):
    text = notebook_text(stream_run.run_dir / "generate.ipynb")
    assert "engine sglang 0.5.23" in text
    assert "canary" in text and "reasoning 25 chars" in text  # the designed reasoning, from the real server


def test_client_sigkilled_mid_run_then_resumed_stores_every_id_once(resume_run: ResumeRun):
    """The kernel (the client) died with SIGKILL after the first shard, requests in flight on the real server;
    ``draftgen run --resume`` generated only what was not stored."""
    run = resume_run
    assert run.first_returncode not in (0, None)
    before = run.stored_before
    assert 0 < len(before) < RESUME_PROMPTS and len(set(before)) == len(before), before
    rows = assert_exactly_once(run.run_dir, ids_of(run.prompts))
    assert set(rows["content"].to_list()) == {SGLANG_CONTENT}
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["sessions"][-1]["completed"] == RESUME_PROMPTS - len(
        before
    )  # only the rest was generated
    assert "already stored" in notebook_text(run.run_dir / "generate.ipynb")
