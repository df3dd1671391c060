"""The stand-in's small Qwen3.5/3.6 layer ops and the CPU paths for SGLang's GPU-only mamba state commit.

References: per-row restatements of Gemma's RMS norm and the gate, transformers' own ``Qwen3_5RMSNormGated`` and
``Qwen3_5RMSNorm`` modules, SGLang's own plain-torch split (``Qwen3_5GatedDeltaNet.fix_query_key_value_ordering``'s
layout: ``[q | k | v | z]``), and hand-made state pools for the commit.
"""

from __future__ import annotations

import sgl_kernel  # noqa: F401  (importing it registers the torch ops)
import torch
from sglang_cpu_paths import scatter_accepted_steps, scatter_accepted_windows

OPS = torch.ops.sgl_kernel
HEADS, KV_HEADS, HEAD_DIM, EPS = 4, 2, 8, 1e-6


def rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gemma_row(row: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    row = row.double()
    return row / torch.sqrt((row**2).mean() + EPS) * (1 + weight.double())


def test_qk_gemma_norm_with_gate_deinterleaves_per_head_and_normalises_each_head():
    tokens = 3
    q_gate = torch.randn(tokens, HEADS * 2 * HEAD_DIM, generator=rng(1))
    k = torch.randn(tokens, KV_HEADS * HEAD_DIM, generator=rng(2))
    qw, kw = torch.randn(HEAD_DIM, generator=rng(3)) * 0.1, torch.randn(HEAD_DIM, generator=rng(4)) * 0.1
    q_out, k_out, gate = OPS.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, EPS, HEAD_DIM, HEADS)
    assert q_out.shape == gate.shape == (tokens * HEADS, HEAD_DIM) and k_out.shape == (
        tokens * KV_HEADS,
        HEAD_DIM,
    )
    for t in range(tokens):
        for h in range(HEADS):
            block = q_gate[t, h * 2 * HEAD_DIM : (h + 1) * 2 * HEAD_DIM]  # this head's query, then its gate
            torch.testing.assert_close(q_out[t * HEADS + h].double(), gemma_row(block[:HEAD_DIM], qw))
            assert torch.equal(gate[t * HEADS + h], block[HEAD_DIM:])
        for h in range(KV_HEADS):
            torch.testing.assert_close(
                k_out[t * KV_HEADS + h].double(), gemma_row(k[t, h * HEAD_DIM : (h + 1) * HEAD_DIM], kw)
            )


def test_qk_gemma_norm_without_gate_matches_transformers_qwen3_5_rmsnorm():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    q = torch.randn(5, HEADS * HEAD_DIM, generator=rng(5))
    k = torch.randn(5, KV_HEADS * HEAD_DIM, generator=rng(6))
    q_norm, k_norm = Qwen3_5RMSNorm(HEAD_DIM, eps=EPS), Qwen3_5RMSNorm(HEAD_DIM, eps=EPS)
    with torch.no_grad():
        q_norm.weight.copy_(torch.randn(HEAD_DIM, generator=rng(7)) * 0.1)
        k_norm.weight.copy_(torch.randn(HEAD_DIM, generator=rng(8)) * 0.1)
        q_out, k_out = OPS.fused_qk_gemma_rmsnorm_cpu(q, k, q_norm.weight, k_norm.weight, EPS, HEAD_DIM)
        torch.testing.assert_close(q_out, q_norm(q.view(-1, HEAD_DIM)))
        torch.testing.assert_close(k_out, k_norm(k.view(-1, HEAD_DIM)))


def test_sigmoid_mul_gates_in_place_also_through_a_strided_gate_view():
    x = torch.randn(3, HEADS * HEAD_DIM, generator=rng(9))
    original = x.clone()
    q_gate = torch.randn(3, HEADS, 2 * HEAD_DIM, generator=rng(10))
    gate = q_gate[..., HEAD_DIM:]  # the strided [tokens, heads, head_dim] view SGLang's native split leaves
    assert not gate.is_contiguous()
    assert OPS.fused_sigmoid_mul_cpu(x, gate) is None
    torch.testing.assert_close(x, original * torch.sigmoid(gate.reshape(3, -1)))


def test_qkvzba_split_is_sglangs_plain_split():
    k_heads, v_heads, head_k, head_v, tokens = 2, 4, 8, 4, 3
    key, value = k_heads * head_k, v_heads * head_v
    qkvz = torch.randn(tokens, 2 * key + 2 * value, generator=rng(11))
    ba = torch.randn(tokens, 2 * v_heads, generator=rng(12))
    mixed, z, b, a = OPS.fused_qkvzba_split_reshape_cat_contiguous_cpu(
        qkvz, ba, k_heads, v_heads, head_k, head_v
    )
    q_, k_, v_, z_ = qkvz.split([key, key, value, value], dim=-1)
    assert torch.equal(mixed, torch.cat([q_, k_, v_], dim=-1))
    assert torch.equal(z, z_.reshape(tokens, v_heads, head_v))
    assert torch.equal(b, ba[:, :v_heads]) and torch.equal(a, ba[:, v_heads:])


def test_gated_rmsnorm_matches_transformers_qwen3_5_rmsnorm_gated():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    norm = Qwen3_5RMSNormGated(HEAD_DIM, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(HEAD_DIM, generator=rng(13)) * 0.2)
        x, z = torch.randn(6, HEAD_DIM, generator=rng(14)), torch.randn(6, HEAD_DIM, generator=rng(15))
        torch.testing.assert_close(OPS.fused_rmsnorm_gated_cpu(x, norm.weight, z, EPS), norm(x, z))
        bf = OPS.fused_rmsnorm_gated_cpu(x.bfloat16(), norm.weight, z.bfloat16(), EPS)
        assert bf.dtype == torch.bfloat16


def test_the_state_commit_copies_each_accepted_step_into_its_slot():
    layers, slots, rows, steps = 2, 5, 3, 4
    dst = torch.zeros(layers, slots, 2, 3)
    src = torch.arange(layers * rows * steps * 6, dtype=torch.float32).view(layers, rows, steps, 2, 3)
    # request 0 accepted up to step 2 -> slot 4; request 1 nothing (step -1); request 2 step 0 -> slot 1
    scatter_accepted_steps(dst, src, torch.tensor([4, 3, 1]), torch.tensor([2, -1, 0]))
    assert torch.equal(dst[:, 4], src[:, 0, 2]) and torch.equal(dst[:, 1], src[:, 2, 0])
    assert not dst[:, [0, 2, 3]].any()
    # explicit source rows, and out-of-range entries skipped as the kernels' bounds checks skip them
    again = torch.zeros_like(dst)
    scatter_accepted_steps(
        again, src, torch.tensor([0, 9, 2]), torch.tensor([1, 1, 7]), torch.tensor([2, 0, 1])
    )
    assert torch.equal(again[:, 0], src[:, 2, 1]) and not again[:, 1:].any()


def test_the_window_commit_reads_through_an_overlapping_view_and_both_index_sets():
    layers, slots, rows, steps, dim, window = 1, 4, 2, 3, 2, 2
    shared = torch.arange(layers * rows * dim * (steps + window - 1), dtype=torch.float32)
    shared = shared.view(layers, rows, dim, steps + window - 1)
    # step t's window is shared[..., t : t + window]: the deduplicated layout SGLang uses on CUDA
    s = shared.stride()
    view = shared.as_strided((layers, rows, steps, dim, window), (s[0], s[1], s[3], s[2], s[3]))
    conv = torch.zeros(layers, slots, dim, window)
    scatter_accepted_windows(
        [(conv, view)], torch.tensor([3, 0]), torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([0])
    )
    assert torch.equal(conv[0, 3], shared[0, 0, :, 1:3]) and torch.equal(conv[0, 0], shared[0, 1, :, 2:4])
    assert torch.equal(conv[0, 2], shared[0, 0, :, 0:2])  # the second set (track slots): its row 0, step 0
