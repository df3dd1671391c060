"""The batch cap draftgen reads from SGLang's /server_info: the one the server runs, not the argument it was given."""

from __future__ import annotations

from draftgen.client.introspect import ServerInfo


def state(cap: int) -> dict:
    return {"effective_max_running_requests_per_dp": cap, "last_gen_throughput": 0.0}


def test_the_effective_cap_wins_over_the_argument_when_a_pool_lowered_it():
    # a qwen3_5 hybrid on SGLang 0.5.23: argument 48 (speculation's default), the mamba state pool holds 21
    info = ServerInfo({"max_running_requests": 48, "internal_states": [state(21)]})
    assert info.max_running_requests == 21


def test_data_parallel_ranks_add_up():
    info = ServerInfo({"max_running_requests": 96, "internal_states": [state(48), state(48)]})
    assert info.max_running_requests == 96


def test_without_internal_state_the_argument_is_the_cap():
    assert ServerInfo({"max_running_requests": 64}).max_running_requests == 64
    assert ServerInfo({"max_running_requests": 64, "internal_states": [{}]}).max_running_requests == 64
    assert ServerInfo({"internal_states": [state(0)]}).max_running_requests is None
    assert ServerInfo().max_running_requests is None
