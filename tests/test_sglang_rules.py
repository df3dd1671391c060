"""SGLang's rules, written once (draftgen.sglang_rules): each rule alone, and its two users agreeing.

``server_settings`` (serve, tune) refuses what SGLang would refuse or change; the simulator applies the same rules to
the flags it is started with. The identity tests fail when either user grows its own copy; the agreement tests
walk a grid of settings through both and fail when they part.
"""

from __future__ import annotations

import argparse
import itertools

import pytest

from draftgen import server_settings
from draftgen.serve.config import MTP_ARGS
from draftgen.server_settings import MTP_DEFAULT, ServerSettings, batch_cap, sglang_problems
from draftgen.sglang_rules import adaptive, hybrid_memory, speculation
from draftgen.sim import adaptive as sim_adaptive
from draftgen.sim import native_api as sim_native_api
from draftgen.sim import speculative as sim_speculative
from draftgen.sim.profiles import get_profile
from draftgen.sim.speculative import StartupError, apply_settings, startup_warnings

B200 = get_profile("b200-mtp")


# ----- the rules alone ----------------------------------------------------------------------------------------
def test_a_chain_verifies_one_draft_per_step_and_a_tree_its_best_candidates():
    assert speculation.chain_draft_tokens(3, 1, 9) == 4  # top-k 1: steps + 1, whatever was given
    assert speculation.chain_draft_tokens(3, 2, 9) == 9  # a tree keeps what was asked
    assert [speculation.tree_candidates(s, 2) for s in (1, 2, 3)] == [2, 6, 10]  # 2, then + 4 per step
    assert speculation.tree_holds(3, 2, 11) and not speculation.tree_holds(3, 2, 12)


def test_the_batch_cap_is_48_with_speculation_unless_given():
    assert speculation.effective_max_running(None, True) == 48
    assert speculation.effective_max_running(None, False) is None  # sized from memory
    assert speculation.effective_max_running(96, True) == 96
    assert batch_cap(MTP_DEFAULT) == 48 and batch_cap(server_settings.SPECULATION_OFF) is None


def test_the_default_mtp_is_the_numbers_sglang_chooses_itself():
    assert str(speculation.AUTO_NUMBERS) == "3/1/4" and speculation.AUTO_NUMBERS.as_list() == [3, 1, 4]
    launched = " ".join(MTP_ARGS)  # what serve adds with MTP on
    assert (
        launched
        == "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
        + ("--speculative-num-draft-tokens 4")
    )
    assert (B200.spec_steps, B200.spec_topk, B200.draft_tokens) == (3, 1, 4)  # the profile as launched


def test_sglang_reports_nextn_as_eagle_and_every_other_algorithm_as_given():
    assert speculation.resolved_algorithm("NEXTN") == "EAGLE"
    assert [speculation.resolved_algorithm(a) for a in ("EAGLE", "EAGLE3", "DFLASH")] == [
        "EAGLE",
        "EAGLE3",
        "DFLASH",
    ]


def test_dflash_overrides_steps_and_topk_other_than_one_and_runs_on_gpus_only():
    assert speculation.dflash_overrides(None, 1) == []
    assert speculation.dflash_overrides(3, 2) == [
        "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=3 to 1.",
        "DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=2 to 1.",
    ]
    assert [speculation.dflash_runs_on(d) for d in ("cuda:0", "npu", "xpu", "cpu")] == [
        True,
        True,
        True,
        False,
    ]


def test_adaptive_table_candidates_and_start():
    assert adaptive.CANDIDATE_STEPS == (0, 1, 3, 5, 7)
    assert adaptive.start_steps(None) == 3 and adaptive.start_steps(5) == 5
    assert adaptive.steps_problem(5) is None
    assert adaptive.steps_problem(4) == (
        "--speculative-num-steps=4 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]. "
        "Pass one of those values."
    )
    assert [adaptive.slot_for(b).min_batch for b in (0, 1, 7, 8, 31, 32, 63, 64, 500)] == [
        1, 1, 1, 8, 8, 32, 32, 64, 64,
    ]  # fmt: skip
    assert (
        adaptive.slot_start(3, adaptive.slot_for(40)) == 1
    )  # 3 is not a candidate of (0, 1): the middle one


def test_adaptive_decision_moves_one_way_per_decision():
    slot = adaptive.Slot(1, (1, 3, 5, 7), down_hysteresis=-0.25)
    assert adaptive.decide(3, 2.6, slot) == 5  # 2.6 > 3 - 0.5: up one candidate
    assert adaptive.decide(3, 6.9, slot) == 7  # far above: up as far as the average reaches
    assert adaptive.decide(5, 2.2, slot) == 3  # at most 3 - 0.5 - 0.25: down
    assert adaptive.decide(5, 0.1, slot) == 1  # down as far as it goes
    assert adaptive.decide(3, 2.4, slot) == 3  # in between: stays
    zero = adaptive.Slot(8, (0, 1, 3), down_hysteresis=0.0)
    assert adaptive.decide(0, -1.0, zero) == 1  # no drafting probes the next count
    assert adaptive.decide(1, 0.5, zero) == 0  # zero accepted drafts reach the floor
    lifted = adaptive.Slot(1, (1, 3), down_hysteresis=0.0, up_hysteresis=1.0)
    assert adaptive.decide(1, 1.0, lifted) == 1 and adaptive.decide(1, 1.6, lifted) == 3


def test_adaptive_is_switched_off_in_sglangs_words():
    assert (
        adaptive.unsupported_reason("EAGLE", 1) is None
        and adaptive.unsupported_reason("EAGLE3", None) is None
    )
    assert (
        adaptive.unsupported_reason("DFLASH", 2)
        == "speculative_algorithm=DFLASH (only EAGLE/EAGLE3 are supported)"
    )
    assert adaptive.unsupported_reason("NEXTN", 2) == "speculative_eagle_topk=2 (only topk=1 is supported)"
    assert (
        adaptive.disabled_warning("x")
        == "speculative_adaptive disabled: x. Falling back to static speculative params."
    )


# ----- one copy: both users hold the rules' own objects --------------------------------------------------------
def test_serve_tune_and_the_simulator_read_the_same_rule_objects():
    assert sim_speculative.speculation is speculation and sim_speculative.adaptive is adaptive
    assert sim_speculative.hybrid_memory is hybrid_memory
    assert server_settings.MTP_ALGORITHMS is speculation.MTP_ALGORITHMS
    assert server_settings.DRAFT_MODEL_ALGORITHMS is speculation.DRAFT_MODEL_ALGORITHMS
    assert server_settings.chain_draft_tokens is speculation.chain_draft_tokens
    assert server_settings.tree_holds is speculation.tree_holds
    assert server_settings.effective_max_running is speculation.effective_max_running
    assert server_settings.dflash_overrides is speculation.dflash_overrides
    assert server_settings.adaptive is adaptive
    assert sim_adaptive.decide is adaptive.decide and sim_adaptive.DEFAULT_TABLE is adaptive.DEFAULT_TABLE
    assert sim_native_api.resolved_algorithm is speculation.resolved_algorithm
    assert sim_native_api.RESOLVED_CACHE is hybrid_memory.RESOLVED_CACHE
    # a module-level name of a rule in either user is the rules' own object, never a copy
    rule_names = {
        "SPEC_DEFAULT_MAX_RUNNING",
        "MTP_ALGORITHMS",
        "DRAFTER_ALGORITHMS",
        "DRAFT_MODEL_ALGORITHMS",
    }
    rule_names |= {"DEFAULT_SLOTS", "DEFAULT_TABLE", "CANDIDATE_STEPS", "ADAPTIVE_CANDIDATE_STEPS"}
    for user in (server_settings, sim_speculative, sim_adaptive):
        for name in rule_names & set(vars(user)):
            rule = getattr(speculation, name, getattr(adaptive, name, None))
            assert getattr(user, name) is rule, f"{user.__name__}.{name} is a copy of a rule"


# ----- agreement: what server_settings refuses is what the simulator would not run as asked --------------------
def _simulated(settings: ServerSettings):  # type: ignore[no-untyped-def]
    """The profile a simulated server started with ``settings``'s flags runs (StartupError when it would not)."""
    parser = argparse.ArgumentParser()
    sim_speculative.add_sglang_flags(parser)
    flags = sim_speculative.sim_settings(parser.parse_args(settings.sim_args()))
    return apply_settings(B200, flags), startup_warnings(B200, flags)


def _runs_as_asked(settings: ServerSettings) -> bool:
    try:
        profile, _ = _simulated(settings)
    except StartupError:
        return False
    asked = (
        settings.speculative_num_steps,
        settings.speculative_eagle_topk,
        settings.speculative_num_draft_tokens,
    )
    return (profile.spec_steps, profile.spec_topk, profile.draft_tokens) == asked


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_a_static_candidate_is_refused_exactly_when_the_simulator_would_run_another(algorithm):
    checked = 0
    for steps, topk, drafts in itertools.product(range(1, 5), range(1, 4), range(2, 12)):
        settings = ServerSettings(
            speculative_algorithm=algorithm,
            speculative_num_steps=steps,
            speculative_eagle_topk=topk,
            speculative_num_draft_tokens=drafts,
            max_running_requests=8,  # small enough that memory never decides
        )
        refused = bool(sglang_problems(settings))
        assert refused == (not _runs_as_asked(settings)), (settings.label, sglang_problems(settings))
        checked += 1
    assert checked == 120


@pytest.mark.parametrize("cap", [None, 8, 64])
def test_both_users_put_the_same_batch_cap_on_a_candidate(cap):
    for settings in (
        MTP_DEFAULT,
        MTP_DEFAULT.model_copy(update={"speculative_num_steps": 1, "speculative_num_draft_tokens": 2}),
    ):
        settings = settings.model_copy(update={"max_running_requests": cap})
        profile, warnings = _simulated(settings)
        assert profile.max_running_requests == batch_cap(settings) == (cap or 48)
        assert any("max_running_requests set to 48" in w for w in warnings) == (cap is None)


def test_adaptive_start_steps_are_refused_exactly_when_the_simulator_refuses_them():
    for steps in range(1, 9):
        settings = MTP_DEFAULT.model_copy(
            update={
                "speculative_num_steps": steps,
                "speculative_num_draft_tokens": steps + 1,
                "speculative_adaptive": True,
            }
        )
        refused = bool(sglang_problems(settings))
        try:
            profile, _ = _simulated(settings)
            simulated = profile.adaptive_steps
        except StartupError as exc:
            simulated = None
            assert adaptive.steps_problem(steps) in str(exc)
        assert refused == (simulated is None), steps
        assert refused == (steps not in adaptive.CANDIDATE_STEPS)


def test_adaptive_switched_off_by_top_k_is_refused_and_simulated_as_static_with_the_same_reason():
    settings = MTP_DEFAULT.model_copy(
        update={"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6, "speculative_adaptive": True}
    )
    reason = adaptive.disabled_warning(adaptive.topk_reason(2) or "")
    assert any(reason in problem for problem in sglang_problems(settings))
    profile, warnings = _simulated(settings)
    assert profile.adaptive_steps is None and (profile.spec_steps, profile.spec_topk) == (3, 2)
    assert f"WARNING {reason}" in warnings


def test_dflash_warnings_are_the_same_words_in_both():
    settings = ServerSettings(
        speculative_algorithm="DFLASH",
        speculative_num_steps=3,
        speculative_num_draft_tokens=8,
        speculative_draft_model_path="sim:dflash",
    )
    [override] = speculation.dflash_overrides(3, None)
    assert any(override in problem for problem in sglang_problems(settings))
    profile, warnings = _simulated(settings)
    assert f"WARNING {override}" in warnings and (profile.spec_steps, profile.draft_tokens) == (1, 8)
