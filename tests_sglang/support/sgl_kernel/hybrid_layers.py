"""The small CPU ops of Qwen3.5/3.6's layers: gated attention's q/k norms and output gate, GDN's split and norm.

SGLang 0.5.23's ``models/qwen3_5.py`` looks the first four up on ``torch.ops.sgl_kernel`` when it is imported on
the CPU (so all must exist for the model to load), and calls them as follows; each restates SGLang's Triton
reference of the same name without ``_cpu`` (``srt/models/utils.py``, ``kernels/ops/elementwise/elementwise.py``,
``kernels/ops/attention/triton_gdn_fused_proj.py``, ``kernels/ops/attention/fla/layernorm_gated.py``):

* ``fused_qk_gemma_rmsnorm_with_gate_cpu`` (attention with an output gate, as Qwen3.6 has): the q projection
  holds, per head, the head's query then its gate (``[q_h0, gate_h0, q_h1, ...]``); q and k are RMS-normalised per
  head with Gemma's ``(1 + weight)`` scale, the gate copied out; all three returned ``[rows, head_dim]``;
* ``fused_qk_gemma_rmsnorm_cpu``: the same norms without a gate (attention without an output gate);
* ``fused_sigmoid_mul_cpu(x, gate)``: ``x *= sigmoid(gate)`` in place, the gate possibly a strided
  ``[tokens, heads, head_dim]`` view of ``x``'s shape;
* ``fused_qkvzba_split_reshape_cat_contiguous_cpu``: splits ``[q | k | v | z]`` and ``[b | a]`` into ``q k v``
  together, ``z`` per value head, ``b`` and ``a`` (used when value heads per key head is 1, 2 or 4; Qwen3.6-27B
  has 3, where SGLang splits in plain torch);
* ``fused_rmsnorm_gated_cpu(x, weight, z, eps)``: the GDN output norm, ``rmsnorm(x) * weight * silu(z)`` per
  value head (norm before gate; a plain ``weight`` scale, not Gemma's). SGLang's ``RMSNormGated`` takes this op
  only on a CPU with AMX and otherwise its Triton kernel, which needs CUDA; the launcher routes it here
  (``support/sitecustomize.py``).
"""

from __future__ import annotations

import torch

TORCH_OPS = (
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_sigmoid_mul_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_rmsnorm_gated_cpu",
)


def gemma_rms_norm(rows: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of each row with Gemma's ``(1 + weight)`` scale, in float32, returned in the rows' dtype."""
    x = rows.float()
    normed = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return normed.to(rows.dtype)


@torch.library.custom_op("sgl_kernel::fused_qk_gemma_rmsnorm_cpu", mutates_args=(), device_types="cpu")
def fused_qk_gemma_rmsnorm_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        gemma_rms_norm(q.reshape(-1, head_dim), q_weight, eps),
        gemma_rms_norm(k.reshape(-1, head_dim), k_weight, eps),
    )


@torch.library.custom_op(
    "sgl_kernel::fused_qk_gemma_rmsnorm_with_gate_cpu", mutates_args=(), device_types="cpu"
)
def fused_qk_gemma_rmsnorm_with_gate_cpu(
    q_gate: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    head_dim: int,
    num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per_head = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q, gate = per_head[..., :head_dim], per_head[..., head_dim:]
    return (
        gemma_rms_norm(q.reshape(-1, head_dim), q_weight, eps),
        gemma_rms_norm(k.reshape(-1, head_dim), k_weight, eps),
        gate.reshape(-1, head_dim).clone(),
    )


@torch.library.custom_op("sgl_kernel::fused_sigmoid_mul_cpu", mutates_args=("x",), device_types="cpu")
def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    x.copy_((x.float() * torch.sigmoid(gate.reshape(x.shape).float())).to(x.dtype))


@torch.library.custom_op(
    "sgl_kernel::fused_qkvzba_split_reshape_cat_contiguous_cpu", mutates_args=(), device_types="cpu"
)
def fused_qkvzba_split_reshape_cat_contiguous_cpu(
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    rows = mixed_qkvz.shape[0]
    return (
        mixed_qkvz[:, :qkv].clone(),
        mixed_qkvz[:, qkv : qkv + num_heads_v * head_v].reshape(rows, num_heads_v, head_v).clone(),
        mixed_ba[:, :num_heads_v].clone(),
        mixed_ba[:, num_heads_v : 2 * num_heads_v].clone(),
    )


@torch.library.custom_op("sgl_kernel::fused_rmsnorm_gated_cpu", mutates_args=(), device_types="cpu")
def fused_rmsnorm_gated_cpu(
    x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, eps: float
) -> torch.Tensor:
    rows = x.float()
    normed = rows * torch.rsqrt((rows * rows).mean(-1, keepdim=True) + eps) * weight.float()
    return (normed * torch.nn.functional.silu(z.float())).to(x.dtype)
