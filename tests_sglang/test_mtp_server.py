"""The target's own kind of model on real SGLang: a ``qwen3_5`` hybrid served by ``draftgen serve`` with NEXTN 3/1/4.

``draftgen serve`` starts it with its default MTP flags and ``--reasoning-parser qwen3``, the CPU's extras after
``--`` (support/mtp_runs.py: ``HYBRID_ARGS``). The designed hybrid (support/tiny_qwen3_5.py) answers a known text
and its MTP head misses every third draft, so SGLang's own NEXTN path (the MTP head as EAGLE's draft, verify, the
mamba state commit after each verify) is checked exactly: the answer, the verify steps per request, and every
output token's log-probability against transformers' own forward pass of the same checkpoint.
"""

from __future__ import annotations

import functools

import pytest
import requests
from chat import chat
from mtp_runs import MAMBA_CAPPED_RUNNING, MTP_SERVED_MODEL
from tiny_qwen3 import DESIGNED_ANSWER, DESIGNED_REASONING, designed_chain
from tiny_qwen3_5 import SPEC_STEPS, chain_start, designed_verify_steps

from draftgen.defaults import CONCURRENCY_PER_SERVER

PROMPT = "What is the answer?"


@functools.cache
def hybrid_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def designed(model_dir: str, thinking: bool, max_tokens: int = 64, steps: int = SPEC_STEPS):
    """What the designed hybrid does under NEXTN ``steps``/1/``steps + 1`` after the chat template's prompt."""
    tok = hybrid_tokenizer(model_dir)
    chain = designed_chain(tok)
    return designed_verify_steps(chain, chain_start(chain, tok, thinking), max_tokens, steps=steps)


def test_serve_started_nextn_and_sglang_resolved_the_hybrid_settings(mtp_server):
    """serve's own command line carries its MTP defaults; SGLang's log shows what it resolved from them on this
    CPU: NEXTN as EAGLE with the model's MTP head, the mamba radix cache no_buffer (overlap schedule off), and the
    batch cap the mamba state pool sets, which /server_info reports too."""
    [launcher] = mtp_server.launchers()
    command = " ".join(launcher.cmdline())
    for flags in (
        "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4",
        "--reasoning-parser qwen3",
        "--enable-metrics",
        "--tool-call-parser qwen3_coder",  # the qwen3_5 family's (sglang_rules.parsers)
    ):
        assert flags in command, command
    assert "--no-mtp" not in " ".join(mtp_server.command) and "--mamba-radix-cache-strategy" not in command
    log = mtp_server.server_log.read_text(errors="replace")
    for resolved in (
        "'speculative_algorithm': 'EAGLE',",
        "'speculative_num_steps': 3,",
        "'speculative_num_draft_tokens': 4,",
        "'speculative_draft_model_path': None,",  # the target's own MTP head, no draft model
        "'mamba_radix_cache_strategy': 'no_buffer',",
        "'disable_overlap_schedule': True,",
        f"max_running_requests is capped to {MAMBA_CAPPED_RUNNING} by the mamba state cache",
        f"max_running_requests={MAMBA_CAPPED_RUNNING},",
        "type=Qwen3_5ForCausalLMMTP",  # the draft worker loaded the MTP head
    ):
        assert resolved in log, resolved
    info = requests.get(f"{mtp_server.url}/server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "EAGLE" and info["mamba_radix_cache_strategy"] == "no_buffer"
    # the argument serve starts it with when MTP is on (the production concurrency; SGLang's own default is 48)...
    assert info["max_running_requests"] == CONCURRENCY_PER_SERVER
    [state] = info["internal_states"]
    assert state["effective_max_running_requests_per_dp"] == MAMBA_CAPPED_RUNNING  # ...and the cap it runs


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_the_designed_answer_with_the_designed_acceptance(mtp_server, models, thinking):
    reply = chat(
        mtp_server.url,
        MTP_SERVED_MODEL,
        PROMPT,
        thinking=thinking,
        max_tokens=64,
        return_spec_tokens_details=True,
    )
    message = reply["choices"][0]["message"]
    if thinking:
        assert message["reasoning_content"] == DESIGNED_REASONING
        assert message["content"] == "\n\n" + DESIGNED_ANSWER
    else:
        assert message["content"] == DESIGNED_ANSWER
    want = designed(str(models.hybrid), thinking)
    details = reply["sglext"]["spec_tokens_details"]
    assert reply["usage"]["completion_tokens"] == want.tokens
    assert details["spec_verify_ct"] == want.verify_steps
    assert details["spec_accept_length"] == pytest.approx(want.accept_length)
    assert 1.0 < details["spec_accept_length"] < SPEC_STEPS + 1  # drafts accepted, not all of them
    assert details["spec_num_proposed_drafts"] == SPEC_STEPS * want.verify_steps
    assert details["spec_num_correct_drafts"] == want.correct_drafts
    assert details["spec_correct_drafts_histogram"] == list(want.histogram)


def test_every_output_token_has_transformers_log_probability(mtp_server, models):
    """/generate with log-probabilities: the hybrid's Gated DeltaNet and attention layers shape them (their state
    over the whole context), so SGLang's prefill, its NEXTN verify steps and the mamba state it commits after each
    must compute what transformers computes, to float32 rounding."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = hybrid_tokenizer(str(models.hybrid))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Tell me again, what is the answer?"}],
        add_generation_prompt=True,
        enable_thinking=True,
        tokenize=False,
    )
    reply = requests.post(
        f"{mtp_server.url}/generate",
        json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": 64, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
        timeout=300,
    ).json()
    meta = reply["meta_info"]
    assert reply["text"] == DESIGNED_REASONING + "</think>\n\n" + DESIGNED_ANSWER
    assert meta["spec_verify_ct"] == designed(str(models.hybrid), True).verify_steps
    prompt_ids = [token for _, token, _ in meta["input_token_logprobs"]]
    output = [(logprob, token) for logprob, token, _ in meta["output_token_logprobs"]]
    ids = prompt_ids + [token for _, token in output]
    model = AutoModelForCausalLM.from_pretrained(models.hybrid, dtype=torch.float32)
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    theirs = [logprobs[len(prompt_ids) + i - 1, token].item() for i, (_, token) in enumerate(output)]
    ours = [logprob for logprob, _ in output]
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-5, list(
        zip(ours, theirs, strict=True)
    )
    assert max(theirs) - min(theirs) > 0.01  # the mixers do shape them (a bigram alone gives one value)
    # the prompt's log-probabilities go through another of SGLang's paths, good to ~3e-4 here
    prompt_theirs = [logprobs[i - 1, ids[i]].item() for i in range(1, len(prompt_ids))]
    prompt_ours = [logprob for logprob, _, _ in meta["input_token_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(prompt_ours, prompt_theirs, strict=True)) < 1e-3


def test_the_hybrids_metrics_count_the_mamba_state_pool(mtp_server):
    text = requests.get(f"{mtp_server.url}/metrics", timeout=30).text
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    for name in (
        "sglang:generation_tokens_total",
        "sglang:spec_verify_calls_total",
        "sglang:mamba_usage",
        "sglang:mamba_used_tokens",
        "sglang:mamba_available_tokens",
    ):
        assert name in names, name
