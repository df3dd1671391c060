"""The simulator's model without a server: tokenization, completion plans, acceptance draws, profiles, faults."""

from __future__ import annotations

import statistics

import pytest

from draftgen.sim.faults import FAULT_KEYS, Faults, faults_to_specs, parse_faults
from draftgen.sim.profiles import PROFILES, get_profile
from draftgen.sim.textgen import (
    THINK_END,
    acceptance_probability,
    plan_acceptance,
    plan_completion,
    request_seed,
)

# ----- the served tokenizer and completion plans ----------------------------------------------------------
PLAN = dict(reasoning_median=300, answer_median=80, sigma=0.8)


def test_chat_prompts_render_as_transformers_renders_them(sim_tokenizer, sim_tokenizer_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(sim_tokenizer_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "Café, naïve — 数学?"},
    ]
    for thinking in (True, False):
        text = sim_tokenizer.render(messages, thinking)
        expected = reference.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert text == expected
        ids = reference.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, enable_thinking=thinking, return_dict=False
        )
        assert sim_tokenizer.encode(text) == list(ids)
    assert sim_tokenizer.render(messages, True).endswith("<|im_start|>assistant\n<think>\n")
    assert sim_tokenizer.render(messages, False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_planned_ids_are_the_canonical_encoding_of_the_text(sim_tokenizer, thinking, ignore_eos):
    for seed in range(60):
        plan = plan_completion(
            seed, sim_tokenizer, max_tokens=3000, enable_thinking=thinking, ignore_eos=ignore_eos, **PLAN
        )
        text = "".join(plan.tokens)
        assert len(plan.tokens) == len(plan.ids)
        assert sim_tokenizer.decode(plan.ids) == text
        if plan.finish_type == "stop":  # a length cut may end inside a word, whose re-encoding can differ
            assert sim_tokenizer.encode(text) == list(plan.ids), (seed, text[:200])
        if ignore_eos:
            assert plan.completion_tokens == 3000 and plan.finish_type == "length"


def test_plan_shape_thinking_on_and_off(sim_tokenizer):
    on = plan_completion(7, sim_tokenizer, max_tokens=10_000, enable_thinking=True, **PLAN)
    assert on.finish_type == "stop" and on.counts_eos
    assert on.ids[on.think_end_index] == sim_tokenizer.think_end_id and on.tokens.count(THINK_END) == 1
    reasoning, answer = on.split_range(0, len(on.tokens))
    assert reasoning and answer.strip()
    assert on.completion_tokens == len(on.ids) + 1
    assert on.output_ids(on.completion_tokens) == [
        *on.ids,
        sim_tokenizer.eos_id,
    ]  # the EOS, as SGLang sends it
    assert on.reasoning_tokens(on.completion_tokens) == on.think_end_index + 1
    off = plan_completion(7, sim_tokenizer, max_tokens=10_000, enable_thinking=False, **PLAN)
    assert off.think_end_index is None and THINK_END not in off.tokens
    assert off.split_range(0, len(off.tokens))[0] == "" and off.reasoning_tokens(5) == 0


def test_plan_is_deterministic_and_truncation_is_a_prefix(sim_tokenizer):
    kwargs = dict(enable_thinking=True, **PLAN)
    full = plan_completion(11, sim_tokenizer, max_tokens=10_000, **kwargs)
    assert plan_completion(11, sim_tokenizer, max_tokens=10_000, **kwargs) == full
    assert plan_completion(12, sim_tokenizer, max_tokens=10_000, **kwargs).tokens != full.tokens
    cut = plan_completion(
        11, sim_tokenizer, max_tokens=full.think_end_index, **kwargs
    )  # just before </think>
    assert cut.finish_type == "length" and not cut.counts_eos
    assert cut.ids == full.ids[: full.think_end_index] and cut.output_ids(10**6) == list(cut.ids)
    reasoning, answer = cut.split_range(0, len(cut.tokens))
    assert answer == "" and reasoning == "".join(cut.tokens)
    # stop needs room for the EOS: exactly len(ids) leaves none, so it is a length cut
    assert plan_completion(11, sim_tokenizer, max_tokens=len(full.ids), **kwargs).finish_type == "length"
    assert plan_completion(11, sim_tokenizer, max_tokens=len(full.ids) + 1, **kwargs).finish_type == "stop"


def test_lengths_in_tokens_are_long_tailed(sim_tokenizer):
    lengths = [
        len(
            plan_completion(
                s,
                sim_tokenizer,
                max_tokens=100_000,
                enable_thinking=True,
                reasoning_median=1100,
                answer_median=350,
                sigma=0.75,
            ).ids
        )
        for s in range(300)
    ]
    median = statistics.median(lengths)
    assert 1000 < median < 2200
    assert max(lengths) > 3 * median  # a long right tail
    assert statistics.mean(lengths) > median


def test_empty_answer_is_the_short_failure(sim_tokenizer):
    plan = plan_completion(3, sim_tokenizer, max_tokens=4096, enable_thinking=True, empty_answer=True, **PLAN)
    assert "".join(plan.tokens) == "\n</think>\n\nOK." and plan.finish_type == "stop"
    assert plan.completion_tokens == len(sim_tokenizer.encode("\n</think>\n\nOK.")) + 1


@pytest.mark.parametrize("thinking", [True, False])
def test_noncanonical_ids_decode_to_the_same_text_and_differ_from_re_encoding(sim_tokenizer, thinking):
    for seed in range(30):
        kwargs = dict(max_tokens=5000, enable_thinking=thinking, **PLAN)
        canonical = plan_completion(seed, sim_tokenizer, **kwargs)
        odd = plan_completion(seed, sim_tokenizer, noncanonical=True, **kwargs)
        text = "".join(odd.tokens)
        assert odd.noncanonical and not canonical.noncanonical
        assert text == "".join(canonical.tokens) == sim_tokenizer.decode(odd.ids)
        assert sim_tokenizer.encode(text) == list(canonical.ids) != list(odd.ids)
        assert len(odd.ids) > len(canonical.ids)  # one token spelled as two or more
        assert all(0 <= i < sim_tokenizer.vocab_size for i in odd.ids)


def test_request_seed_depends_on_prompt_and_client_seed():
    a, b = {"messages": [{"role": "user", "content": "a"}]}, {"messages": [{"role": "user", "content": "b"}]}
    assert request_seed(a, None) == request_seed(dict(a), None)
    assert request_seed(a, None) != request_seed(b, None)
    assert request_seed(a, 1) != request_seed(
        b, 1
    )  # a client seed never makes two prompts share a completion
    assert request_seed(a, 1) != request_seed(a, 2)


# ----- acceptance draws ---------------------------------------------------------------------------------
def test_acceptance_chain_mean_matches_the_profile():
    profile = get_profile("b200-mtp")
    p = acceptance_probability(profile.accept_mean, profile.draft_tokens)
    assert sum(p**i for i in range(profile.draft_tokens)) == pytest.approx(profile.accept_mean)
    draws = plan_acceptance(5, 200_000, p, profile.draft_tokens, profile.draft_tokens)
    assert sum(draws) == 200_000
    assert set(draws) <= {1, 2, 3, 4}
    assert statistics.mean(draws) == pytest.approx(profile.accept_mean, abs=0.03)


def test_no_speculation_means_one_token_per_step():
    assert acceptance_probability(1.0, 1) == 0.0
    assert plan_acceptance(1, 50, 0.0, 1, 1) == [1] * 50


# ----- profiles -------------------------------------------------------------------------------------------
def test_b200_mtp_calibration():
    b200 = get_profile("b200-mtp")
    assert b200.speculative and b200.max_running_requests == 48 and b200.draft_tokens == 4
    assert b200.accept_mean == pytest.approx(3.6)
    assert b200.tokens_per_second(1) == pytest.approx(250, rel=0.02)
    curve = [b200.tokens_per_second(b) for b in (1, 8, 16, 32, 48)]
    assert curve == sorted(curve)  # rising with concurrency
    assert b200.tokens_per_second(64) == b200.tokens_per_second(48)  # flat past the cap
    assert curve[-1] - b200.tokens_per_second(40) < b200.tokens_per_second(9) - b200.tokens_per_second(
        1
    )  # flattening
    assert b200.step_seconds(10) == pytest.approx(b200.step_base_s + 10 * b200.step_per_req_s)


def test_rtx_pro_6000_calibration():
    rtx = get_profile("rtx-pro-6000")
    assert not rtx.speculative and rtx.accept_mean == 1.0
    assert rtx.tokens_per_second(rtx.max_running_requests) == pytest.approx(400, rel=0.05)


def test_instant_profile_has_no_waits():
    instant = get_profile("instant")
    assert instant.step_seconds(100) == 0.0 and instant.prefill_seconds(10_000) == 0.0


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="b200-mtp"):
        get_profile("h100")
    assert set(PROFILES) == {"b200-mtp", "rtx-pro-6000", "instant"}


# ----- fault specs ----------------------------------------------------------------------------------------
def test_fault_specs_round_trip():
    specs = [
        "error_rate=0.25",
        "overload=3",
        "overload_status=503",
        "crash_after=5s",
        "omit_done=true",
        "sglang_version=0.5.9",
    ]
    faults = parse_faults(specs)
    assert faults == Faults(
        error_rate=0.25,
        overload=3,
        overload_status=503,
        crash_after="5s",
        omit_done=True,
        sglang_version="0.5.9",
    )
    assert faults.crash_after_seconds() == 5.0 and faults.crash_after_requests() is None
    assert parse_faults(faults_to_specs(faults)) == faults
    assert parse_faults(["crash_after=4"]).crash_after_requests() == 4


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("error_rate", "expected KEY=VALUE"),
        ("bogus=1", "unknown fault 'bogus'"),
        ("error_rate=2", "between 0 and 1"),
        ("error_rate=lots", "error_rate"),
        ("overload_status=500", "429 or 503"),
        ("crash_after=0", "positive"),
        ("crash_after=2.5", "positive"),
        ("slow=0", "> 0"),
        ("omit_usage=maybe", "true/false"),
        ("sglang_version=0.4.0", "0.5.4"),
    ],
)
def test_bad_fault_specs_are_refused_with_a_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_faults([spec])


def test_every_fault_key_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "simulator.md").read_text()
    for key in FAULT_KEYS:
        assert f"`{key}`" in doc, key
