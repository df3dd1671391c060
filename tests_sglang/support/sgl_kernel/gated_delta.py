"""The gated delta rule of a Gated DeltaNet layer (Qwen3.5/3.6's linear attention), its gates, and SGLang's CPU ops.

SGLang 0.5.23 reaches three ops here on the CPU (``layers/attention/linear/gdn_backend.py``,
``layers/attention/linear/kernels/gdn_triton.py``): ``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` (prefill),
``torch.ops.sgl_kernel.fused_gdn_gating_cpu`` (prefill gates) and
``torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu`` (decode and speculative verify). Their
meaning is that of SGLang's Triton references (``kernels/ops/attention/fla/chunk.py``,
``kernels/ops/attention/linear/fused_gdn_gating.py`` and ``fused_sigmoid_gating_recurrent.py``), restated:

* gates, per token and value head: ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus with ``beta`` and a
  linear ``threshold`` above which it is the identity), ``beta = sigmoid(b)``;
* value head h reads key head ``h // (value_heads / key_heads)``; with ``use_qk_l2norm_in_kernel`` q and k are
  divided by ``sqrt(sum of squares + 1e-6)``; q is scaled by ``scale`` (default ``head_k_dim ** -0.5``);
* the state S of a head is ``[V, K]`` (SGLang's pool layout ``[slots, value_heads, V, K]``); per token:
  ``S = exp(g) S``; ``u = beta (v - S k)``; ``S = S + u k^T``; the output is ``S q``;
* a request's state starts from ``initial_state[initial_state_indices[i]]`` and is written back there (a
  negative index: a padding row, started from zeros and not written).

The GPU kernels compute prefill in chunks of 64 tokens (the WY form) for parallelism; that is the same
recurrence, so here it runs token by token, vectorised over heads, in float32.
"""

from __future__ import annotations

import itertools

import torch

TORCH_OPS = ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu")
L2NORM_EPS = 1e-6


def gates(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` in float32, each the shape of ``a``."""
    x = a.float() + dt_bias.float()
    scaled = softplus_beta * x
    softplus = torch.where(scaled <= softplus_threshold, torch.log1p(torch.exp(scaled)) / softplus_beta, x)
    return -torch.exp(A_log.float()) * softplus, torch.sigmoid(b.float())


def _keys_per_value_head(q: torch.Tensor, k: torch.Tensor, value_heads: int, l2norm: bool, scale: float):
    """q, k ``[T, H, K]`` -> float32 ``[T, value_heads, K]``, normalised and scaled as the kernels do."""
    heads = k.shape[1]
    if value_heads % heads:
        raise ValueError(f"{value_heads} value heads do not group over {heads} key heads")
    q, k = q.float(), k.float()
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    group = value_heads // heads
    return (q * scale).repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)


def delta_rule_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for every head: state ``[HV, V, K]``, q/k ``[HV, K]``, v ``[HV, V]``, g/beta ``[HV]`` (float32).
    Returns ``(output [HV, V], new state)``."""
    state = state * torch.exp(g).view(-1, 1, 1)
    update = beta.view(-1, 1) * (v - torch.einsum("hvk,hk->hv", state, k))
    state = state + update.unsqueeze(-1) * k.unsqueeze(1)
    return torch.einsum("hvk,hk->hv", state, q), state


def _segments(cu_seqlens: torch.Tensor | None, batch: int, length: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(n * length, (n + 1) * length) for n in range(batch)]
    bounds = cu_seqlens.tolist()
    return list(itertools.pairwise(bounds))


def _start_state(source: torch.Tensor | None, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    if source is None or index < 0:
        return torch.zeros(shape, dtype=torch.float32)
    return source[index].float()


def chunk_gated_delta_rule_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    initial_state_indices: torch.Tensor | None = None,
    scale: float | None = None,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor, None]:
    """Prefill: q/k ``[1, T, H, K]``, v ``[1, T, HV, V]``, g/beta ``[1, T, HV]`` (already gated). Returns
    ``(output [1, T, HV, V], final states [N, HV, V, K], None)`` and writes each request's final state back."""
    if head_first:
        raise NotImplementedError(
            "chunk_gated_delta_rule_cpu: head_first inputs (SGLang passes head_first=False)"
        )
    batch, length, value_heads, head_v = v.shape
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    segments = _segments(cu_seqlens, batch, length)
    q, k, v = q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, value_heads, head_v)
    g, beta = g.reshape(-1, value_heads).float(), beta.reshape(-1, value_heads).float()
    qh, kh = _keys_per_value_head(q, k, value_heads, use_qk_l2norm_in_kernel, scale)
    out = torch.zeros(v.shape, dtype=torch.float32)
    indices = (
        initial_state_indices.tolist() if initial_state_indices is not None else list(range(len(segments)))
    )
    finals = []
    for (begin, end), index in zip(segments, indices, strict=True):
        state = _start_state(initial_state, index, (value_heads, head_v, k.shape[-1]))
        for t in range(begin, end):
            out[t], state = delta_rule_step(state, qh[t], kh[t], v[t].float(), g[t], beta[t])
        finals.append(state)
        if initial_state is not None and index >= 0:
            initial_state[index] = state.to(initial_state.dtype)
    final = torch.stack(finals) if finals else torch.zeros(0, value_heads, head_v, k.shape[-1])
    return out.to(v.dtype).view(batch, length, value_heads, head_v), final, None


@torch.library.custom_op("sgl_kernel::fused_gdn_gating_cpu", mutates_args=(), device_types="cpu")
def fused_gdn_gating_cpu(
    A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates: a/b ``[T, HV]`` -> ``(g, beta)``, each ``[1, T, HV]`` float32."""
    g, beta = gates(A_log, a, b, dt_bias)
    return g.unsqueeze(0), beta.unsqueeze(0)


def _parents(retrieve_parent_token: torch.Tensor | None, row: int, count: int) -> list[int]:
    if retrieve_parent_token is None:
        return list(range(-1, count - 1))
    return [-1, *retrieve_parent_token[row, 1:count].tolist()]


@torch.library.custom_op(
    "sgl_kernel::fused_sigmoid_gating_delta_rule_update_cpu",
    mutates_args=("initial_state_source", "intermediate_states_buffer"),
    device_types="cpu",
)
def fused_sigmoid_gating_delta_rule_update_cpu(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor | None,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    is_kda: bool = False,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    cache_steps: int | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode and verify, gates computed inline: q/k ``[B, T, H, K]``, v ``[B, T, HV, V]``, a/b ``[B*T, HV]``.
    Returns ``[B, T, HV, V]``. Verify (``intermediate_states_buffer``): the state after each token t goes to
    ``intermediate_states_buffer[intermediate_state_indices[i], t]``, a draft tree's token continues from its
    parent's state (``retrieve_parent_token``), and ``disable_state_update`` leaves the pool as it was."""
    if is_kda:
        raise NotImplementedError(
            "fused_sigmoid_gating_delta_rule_update_cpu: KDA (per-channel gates) is not provided by draftgen's "
            "CPU stand-in"
        )
    batch, length, value_heads, head_v = v.shape
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    segments = _segments(cu_seqlens, batch, length)
    q, k, v = q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, value_heads, head_v)
    g, beta = gates(
        A_log,
        a.reshape(-1, value_heads),
        b.reshape(-1, value_heads),
        dt_bias,
        softplus_beta,
        softplus_threshold,
    )
    qh, kh = _keys_per_value_head(q, k, value_heads, use_qk_l2norm_in_kernel, scale)
    out = torch.zeros(v.shape, dtype=torch.float32)
    indices = initial_state_indices.tolist()
    cache_rows = intermediate_state_indices.tolist() if intermediate_states_buffer is not None else None
    for row, ((begin, end), index) in enumerate(zip(segments, indices, strict=True)):
        start = _start_state(initial_state_source, index, (value_heads, head_v, k.shape[-1]))
        after: list[torch.Tensor] = []  # the state after each token of this request
        for step, parent in enumerate(_parents(retrieve_parent_token, row, end - begin)):
            t = begin + step
            state = start if parent < 0 else after[parent]
            out[t], state = delta_rule_step(state, qh[t], kh[t], v[t].float(), g[t], beta[t])
            after.append(state)
            if cache_rows is not None and cache_rows[row] >= 0:
                intermediate_states_buffer[cache_rows[row], step] = state.to(intermediate_states_buffer.dtype)
        if after and not disable_state_update and initial_state_source is not None and index >= 0:
            initial_state_source[index] = after[-1].to(initial_state_source.dtype)
    return out.to(q.dtype).view(batch, length, value_heads, head_v)
