"""The simulator's speculative settings: SGLang's flags change step cost, acceptance and memory (issue 13 part 2)."""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import urllib.request

import pytest

from draftgen.sim.fleet import FleetError, find_free_base_port
from draftgen.sim.profiles import get_profile
from draftgen.sim.speculative import (
    SimSettings,
    StartupError,
    apply_settings,
    settings_argv,
    startup_warnings,
)
from draftgen.sim.textgen import plan_acceptance, plan_acceptance_by_position

B200 = get_profile("b200-mtp")


def mtp(steps: int, topk: int, drafts: int, **more: object) -> SimSettings:
    return SimSettings(
        speculative_algorithm="NEXTN",
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=drafts,
        **more,  # type: ignore[arg-type]
    )


def test_seed_settings_reproduce_the_profile():
    derived = apply_settings(B200, mtp(3, 1, 4))
    assert derived.step_base_s == pytest.approx(B200.step_base_s)
    assert derived.step_per_req_s == pytest.approx(B200.step_per_req_s)
    assert derived.accept_mean == pytest.approx(3.6)
    assert derived.tokens_per_second(1) == pytest.approx(250, rel=0.01)
    assert derived.tokens_per_second(48) == pytest.approx(B200.tokens_per_second(48))
    assert derived.max_running_requests == 48  # SGLang's cap with speculation
    # Same per-position acceptance as the flag-less profile, so the same draws, bit for bit.
    assert derived.position_probabilities() == pytest.approx(B200.position_probabilities())
    assert apply_settings(B200, SimSettings()) is B200  # no flags: the profile untouched


def test_position_draws_equal_the_constant_chain_when_positions_agree():
    p = B200.position_probabilities()[0]
    assert plan_acceptance(9, 5_000, p, 4, 4) == plan_acceptance_by_position(9, 5_000, (p, p, p), 4)


def test_more_steps_cost_more_draft_time_and_add_less_acceptance_each():
    profiles = [apply_settings(B200, mtp(s, 1, s + 1, max_running_requests=32)) for s in range(1, 6)]
    bases = [p.step_base_s for p in profiles]
    accepts = [p.accept_mean for p in profiles]
    assert bases == sorted(bases) and len(set(bases)) == len(bases)  # draft cost grows with steps
    gains = [b - a for a, b in itertools.pairwise(accepts)]
    assert all(g > 0 for g in gains) and gains == sorted(gains, reverse=True)  # diminishing returns
    # Measured draws follow the position model.
    deep = profiles[-1]
    draws = plan_acceptance_by_position(3, 200_000, deep.position_probabilities(), deep.draft_tokens)
    assert statistics.mean(draws) == pytest.approx(deep.accept_mean, abs=0.03)


def test_verify_cost_grows_with_batch_times_draft_tokens():
    narrow = apply_settings(B200, mtp(3, 2, 4))
    wide = apply_settings(B200, mtp(3, 2, 8))
    extra = wide.step_seconds(64) - narrow.step_seconds(64)
    assert extra == pytest.approx(64 * 4 * B200.spec_costs.verify_per_token_s)  # type: ignore[union-attr]
    assert wide.step_seconds(1) - narrow.step_seconds(1) < extra / 32  # a batch of one barely pays it
    # The best setting alone is not the best at a full batch.
    alone = max(range(1, 6), key=lambda s: apply_settings(B200, mtp(s, 1, s + 1)).tokens_per_second(1))
    full = max(
        range(1, 6),
        key=lambda s: apply_settings(B200, mtp(s, 1, s + 1, max_running_requests=96)).tokens_per_second(96),
    )
    assert alone > full


def test_mtp_off_runs_one_token_per_step_with_a_larger_batch():
    off = apply_settings(B200, SimSettings(speculative_algorithm="none"))
    assert not off.speculative and off.accept_mean == 1.0 and off.draft_tokens == 1
    assert off.max_running_requests > 48
    assert off.tokens_per_second(1) < B200.tokens_per_second(1) / 2


def test_too_many_running_requests_fail_at_start_with_sglangs_message():
    with pytest.raises(StartupError) as caught:
        apply_settings(B200, mtp(3, 1, 4, max_running_requests=256))
    assert "Not enough memory. Please try to increase --mem-fraction-static." in str(caught.value)
    assert caught.value.after_load  # the weights load first, as in SGLang
    with pytest.raises(StartupError):
        apply_settings(B200, SimSettings(max_running_requests=256))  # the cap alone is checked too
    # Fewer draft tokens per request or more memory make room.
    assert apply_settings(B200, mtp(1, 1, 2, max_running_requests=200)).max_running_requests == 200
    roomy = apply_settings(B200, mtp(3, 1, 4, max_running_requests=140, mem_fraction_static=0.9))
    assert roomy.kv_capacity_tokens > 0


def test_topk_one_adjusts_draft_tokens_like_sglang():
    flags = mtp(3, 1, 6)
    assert apply_settings(B200, flags).draft_tokens == 4
    assert any("adjusted" in line for line in startup_warnings(B200, flags))


def test_bad_flag_combinations_are_refused():
    with pytest.raises(StartupError, match="need --speculative-algorithm"):
        apply_settings(B200, SimSettings(speculative_num_steps=2))
    with pytest.raises(StartupError, match="out of range"):
        apply_settings(B200, mtp(1, 2, 6))  # a 1-step tree of 2 branches has 2 candidates, not 5
    with pytest.raises(StartupError, match="no speculative cost model"):
        apply_settings(get_profile("rtx-pro-6000"), mtp(3, 1, 4))


def test_server_process_with_too_large_cap_exits_with_the_message(sim_fleet):
    with pytest.raises(FleetError) as caught:
        sim_fleet(server_args=settings_argv(mtp(3, 1, 4, max_running_requests=256)), timeout=30)
    assert "exited with code 1" in str(caught.value)
    assert "Not enough memory. Please try to increase --mem-fraction-static" in str(caught.value)


def test_server_reports_and_runs_its_settings(sim_fleet):
    fleet = sim_fleet(server_args=settings_argv(mtp(1, 1, 2, max_running_requests=64)), speed=50.0)
    with urllib.request.urlopen(f"{fleet.urls[0]}/server_info", timeout=5) as response:
        info = json.load(response)
    assert info["speculative_num_steps"] == 1 and info["speculative_num_draft_tokens"] == 2
    assert info["max_running_requests"] == 64
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 2_000, "ignore_eos": True}})
    request = urllib.request.Request(
        f"{fleet.urls[0]}/generate", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        meta = json.load(response)["meta_info"]
    assert meta["spec_accept_length"] == pytest.approx(1.93, abs=0.05)  # 1 + p for one draft position


def test_draftgen_sim_refuses_settings_that_cannot_start():
    port = find_free_base_port(1)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftgen",
            "sim",
            "--servers",
            "1",
            "--base-port",
            str(port),
            "--max-running-requests",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Not enough memory" in done.stderr


def _request(tokenizer, rid: int, prompt_tokens: int, max_tokens: int):
    from draftgen.sim.engine import SimRequest
    from draftgen.sim.textgen import plan_completion

    plan = plan_completion(
        rid,
        tokenizer,
        max_tokens=max_tokens,
        enable_thinking=True,
        reasoning_median=100,
        answer_median=10,
        sigma=0.1,
        ignore_eos=True,
    )
    return SimRequest(
        rid=str(rid), kind="chat", prompt_tokens=prompt_tokens, plan=plan, draws=[1], stream=False
    )


def test_kv_left_after_the_memory_check_limits_admission(sim_tokenizer):
    from draftgen.sim.engine import Engine

    tight = apply_settings(B200, mtp(5, 1, 6, max_running_requests=96))  # ~57K KV tokens left
    engine = Engine(tight, speed=1.0, slow=1.0, on_finish=lambda r: None)
    engine.ready.set()
    for rid in range(96):
        engine.submit(_request(sim_tokenizer, rid, prompt_tokens=1_000, max_tokens=2_000))
    admitted = engine._admissible()
    assert len(admitted) == tight.kv_capacity_tokens // 3_000  # each holds 3,000 tokens at its longest
    assert len(admitted) < tight.max_running_requests
    # Without settings the profile keeps its old behaviour: only the batch cap limits admission.
    plain = Engine(B200, speed=1.0, slow=1.0, on_finish=lambda r: None)
    plain.ready.set()
    for rid in range(96):
        plain.submit(_request(sim_tokenizer, rid, prompt_tokens=100_000, max_tokens=2_000))
    assert len(plain._admissible()) == B200.max_running_requests
