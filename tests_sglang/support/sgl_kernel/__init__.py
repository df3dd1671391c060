"""draftgen's pure-torch stand-in for ``sgl_kernel``'s CPU ops: just enough for SGLang 0.5.23 on an AVX2 CPU.

Why it exists: with ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports ``*_cpu`` ops from ``sgl_kernel`` when its modules
load, and calls ``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu`` from its ``intel_amx``
attention backend. The real CPU build of ``sgl_kernel`` is compiled C++ that needs AVX-512/AMX, which these machines
lack. This package, first on the servers' ``PYTHONPATH`` (see ``tests_sglang/support/sglang-python``), provides the
ops SGLang reaches with plain decoding, NGRAM and STANDALONE (EAGLE-worker) speculation, and those of the
``qwen3_5`` hybrid family (Gated DeltaNet layers, gated attention, its MTP head under NEXTN), each written in plain torch
from the semantics of SGLang's own reference of the same name (its Triton kernels, its Python wrappers and their
docstrings), and each unit-tested against an independent statement of those semantics (tests_sglang/test_ops_*.py).

What it deliberately lacks:

* ``convert_weight_packed``: SGLang decides "this CPU has AMX kernels" by looking for that one op
  (``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")``). Without it every layer (RMSNorm, SiLU, linear,
  rotary) takes its ``forward_native`` torch path, so those kernels need no stand-in.
* everything else: any other name SGLang asks for raises ``NotImplementedError`` naming itself (module
  ``__getattr__``), so a new SGLang release that reaches a new op fails loudly at import, by name, instead of
  silently taking some other path.
"""

from __future__ import annotations

from sgl_kernel import attention as _attention  # registers torch.ops.sgl_kernel.{extend,decode}_attention_cpu
from sgl_kernel import gated_delta as _gated_delta  # Gated DeltaNet gates and recurrent update
from sgl_kernel import hybrid_layers as _hybrid_layers  # Qwen3.5/3.6 layers: gated attention, gated RMSNorm
from sgl_kernel._missing import missing_attribute
from sgl_kernel.cache_locs import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)
from sgl_kernel.tree import build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu

__version__ = "0.0.0+draftgen-cpu-stand-in"

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]
PROVIDED = tuple(
    __all__
)  # the module-level functions; sgl_kernel.speculative and sgl_kernel.mamba add theirs
TORCH_OPS = (
    *_attention.TORCH_OPS,
    *_hybrid_layers.TORCH_OPS,
    *_gated_delta.TORCH_OPS,
)  # on torch.ops.sgl_kernel


def __getattr__(name: str):
    return missing_attribute(__name__, name)
