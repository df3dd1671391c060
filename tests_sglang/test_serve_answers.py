"""Real SGLang servers started by ``draftgen serve`` answer: readiness stages, known answers, speculation.

The designed model's greedy answer is known, so the plain server's reasoning split is checked exactly. The
random model's greedy answer is not known in advance; it is computed here by transformers (the same bf16
checkpoint, in float32 like those servers, ``generate`` with greedy decoding), and both speculative servers must
give exactly that text:
greedy speculative decoding is lossless, and the target's forward passes on those servers run through our
``sgl_kernel`` stand-in's attention and tree ops, so a wrong op shows up as a different answer.
"""

from __future__ import annotations

import functools

import yaml
from chat import chat, chat_stream
from conftest import EXACT_DTYPE, STANDALONE_STEPS
from sitecustomize import FORKED_NOTE
from tiny_qwen3 import DESIGNED_ANSWER, DESIGNED_REASONING

PROMPT = "Tell me something about the weather today."
RANDOM_TOKENS = 32
SPEC_KEYS = {
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
}


@functools.cache
def transformers_greedy(model_dir: str, text: str, max_tokens: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, EXACT_DTYPE))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        enable_thinking=False,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_plain_server_reached_ready_through_serves_stages(fleet):
    run = fleet.plain
    output = run.wait_output("wrote ", 120)
    assert f"server :{run.port} (GPU 0): starting (pid " in output
    assert "connection refused: loading weights" in output  # SGLang opens its port only after loading
    assert "ready after" in output and "1 of 1 servers ready" in output
    listed = yaml.safe_load((run.run_dir / "servers.yaml").read_text())
    assert run.url in str(listed), listed


def test_designed_model_answers_with_reasoning_split_by_the_qwen3_parser(fleet, models):
    reply = chat(fleet.plain.url, str(models.designed), "What is the answer?", thinking=True, max_tokens=64)
    choice = reply["choices"][0]
    assert choice["message"]["reasoning_content"] == DESIGNED_REASONING
    assert choice["message"]["content"].strip() == DESIGNED_ANSWER
    assert choice["finish_reason"] == "stop"
    assert reply["usage"]["reasoning_tokens"] > 0


def test_designed_model_with_thinking_off_answers_directly(fleet, models):
    reply = chat(fleet.plain.url, str(models.designed), "What is the answer?", thinking=False, max_tokens=64)
    message = reply["choices"][0]["message"]
    assert message["content"] == DESIGNED_ANSWER
    assert not message.get("reasoning_content")


def test_designed_model_streams_reasoning_then_content(fleet, models):
    chunks = chat_stream(
        fleet.plain.url, str(models.designed), "What is the answer?", thinking=True, max_tokens=64
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning == DESIGNED_REASONING
    assert content.strip() == DESIGNED_ANSWER
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def speculative_answer(run, model: str) -> dict:
    reply = chat(
        run.url,
        model,
        PROMPT,
        thinking=False,
        max_tokens=RANDOM_TOKENS,
        return_spec_tokens_details=True,
        ignore_eos=True,
    )
    assert reply["usage"]["completion_tokens"] == RANDOM_TOKENS
    details = reply["sglext"]["spec_tokens_details"]
    assert SPEC_KEYS <= set(details), details
    assert details["spec_verify_ct"] >= 1
    return reply


def test_speculative_servers_kept_the_intel_amx_backend(fleet):
    # Without sitecustomize.py's AMX mark SGLang swaps intel_amx for torch_native (which fails in verify).
    for run in (fleet.ngram, fleet.standalone):
        log = run.server_log.read_text(errors="replace")
        assert "'attention_backend': 'intel_amx'" in log
        assert "will fallback to torch_native" not in log


def test_the_fleets_sglang_forked_its_scheduler_and_detokenizer(fleet):
    """The wrapper's default (support/sitecustomize.py); the relaunched tune winner spawns them instead."""
    for run in (fleet.plain, fleet.ngram, fleet.standalone):
        assert FORKED_NOTE in run.server_log.read_text(errors="replace"), run.name
        commands = " | ".join(" ".join(p.cmdline()) for p in run.descendants())
        assert "sglang::scheduler" in commands and "sglang::detokenizer" in commands, (run.name, commands)


def test_ngram_server_answers_as_transformers_does_and_reports_spec_details(fleet, models):
    reply = speculative_answer(fleet.ngram, str(models.random))
    expected = transformers_greedy(str(models.random), PROMPT, RANDOM_TOKENS)
    assert reply["choices"][0]["message"]["content"] == expected


def test_ngram_server_accepts_drafts_for_a_repeated_request(fleet, models):
    # NGRAM drafts from a trie of the tokens it has seen; after one answer, the same request's continuation is
    # in it, so drafts are accepted and a verify step yields more than one token.
    speculative_answer(fleet.ngram, str(models.random))
    details = speculative_answer(fleet.ngram, str(models.random))["sglext"]["spec_tokens_details"]
    assert details["spec_num_correct_drafts"] > 0, details
    assert details["spec_accept_length"] > 1.5, details
    assert details["spec_verify_ct"] < RANDOM_TOKENS


def test_standalone_server_answers_as_transformers_does_with_accepted_drafts(fleet, models):
    reply = speculative_answer(fleet.standalone, str(models.random))
    assert reply["choices"][0]["message"]["content"] == transformers_greedy(
        str(models.random), PROMPT, RANDOM_TOKENS
    )
    details = reply["sglext"]["spec_tokens_details"]
    # the draft (the target plus noise) agrees with the target often but not always: both verify paths ran
    assert details["spec_num_correct_drafts"] > 0, details
    assert details["spec_num_correct_drafts"] < details["spec_num_proposed_drafts"], details
    assert 1.0 < details["spec_accept_length"] <= STANDALONE_STEPS + 1, details
