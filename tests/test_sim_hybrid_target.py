"""The simulated target is Qwen3.6-27B, a qwen3_5 hybrid: /server_info and /model_info say what real SGLang says.

Real SGLang 0.5.23 reports the algorithm it resolved (NEXTN is EAGLE with the target's own MTP head) and, for a
hybrid, its mamba radix cache settings; on the GPU node serve's commands resolve to extra_buffer with the overlap
schedule on (tests_sglang/test_hybrid_server_args.py resolves them with SGLang itself, and
tests_sglang/test_sim_matches_the_hybrid.py compares this simulator with a real hybrid server).
"""

from __future__ import annotations

from sim_helpers import get_json

from draftgen.sim.native_api import reported_algorithm


def test_a_nextn_server_reports_eagle_and_the_hybrids_cache(sim_fleet):
    url = sim_fleet(profile="b200-mtp", speed=50).urls[0]
    info = get_json(f"{url}/server_info")
    assert info["speculative_algorithm"] == "EAGLE"
    assert (
        info["speculative_num_steps"],
        info["speculative_eagle_topk"],
        info["speculative_num_draft_tokens"],
    ) == (
        3,
        1,
        4,
    )
    assert info["mamba_radix_cache_strategy"] == "extra_buffer" and info["uses_mamba_radix_cache"] is True
    assert info["disable_overlap_schedule"] is False
    model = get_json(f"{url}/model_info")
    assert model["model_type"] == "qwen3_5" and model["architectures"] == ["Qwen3_5ForConditionalGeneration"]


def test_without_speculation_no_algorithm_and_the_same_cache(sim_fleet):
    info = get_json(f"{sim_fleet(profile='rtx-pro-6000', speed=100).urls[0]}/server_info")
    assert info["speculative_algorithm"] is None and info["mamba_radix_cache_strategy"] == "extra_buffer"


def test_only_nextn_is_renamed():
    assert reported_algorithm(None) == reported_algorithm("NEXTN") == "EAGLE"
    for algorithm in ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH"):
        assert reported_algorithm(algorithm) == algorithm
