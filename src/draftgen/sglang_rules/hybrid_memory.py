"""How SGLang 0.5.23 budgets GPU memory and request slots for a hybrid model (Qwen3.5/3.6: linear-attention
layers with a recurrent state per request beside full-attention layers with a KV cache).

Facts from ``mem_cache/kv_cache_configurator.py`` (``_calculate_mamba_ratio``, ``resolve_max_num_reqs``) and
``arg_groups/fields/schedule.py`` (``mamba_full_memory_ratio``); the simulator's memory model applies them
(docs/simulator.md, "Speculative settings"). Flags that change them (``--mamba-radix-cache-strategy``,
``--max-mamba-cache-size``) belong here when draftgen comes to model them.
"""

from __future__ import annotations

from types import MappingProxyType

# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: recurrent-state slots per running request with the radix cache on
# (one per request with it off, as under MTP for this model family).
STATE_SLOTS_PER_REQUEST = 3
# mamba_full_memory_ratio's fallback: the memory left after the weights is split between recurrent states and the
# KV cache in this ratio (states : KV = 0.9 : 1).
STATE_TO_KV_MEMORY_RATIO = 0.9
# resolve_max_num_reqs: without --max-running-requests the request pool is sized at 2048 slots or more.
REQUEST_POOL_FLOOR = 2048
# What SGLang resolves for a qwen3_5 hybrid on a GPU node and reports in /server_info (the hybrid part of the SGLang
# tier, tests_sglang/test_hybrid_server_args.py, resolves serve's commands with SGLang itself): the mamba radix
# cache's `auto` strategy is extra_buffer with the overlap schedule on.
RESOLVED_CACHE = MappingProxyType(
    {
        "mamba_radix_cache_strategy": "extra_buffer",
        "uses_mamba_radix_cache": True,
        "disable_overlap_schedule": False,
    }
)
