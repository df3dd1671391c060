"""The stand-in's Gated DeltaNet ops against slow restatements of the maths and against transformers' own chunked form.

The reference here runs one head and one token at a time with the state as transformers keeps it (``[K, V]``,
``S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q``); the ops keep SGLang's pool layout (``[V, K]``),
vectorise over heads and batch requests by ``cu_seqlens``. transformers' ``torch_chunk_gated_delta_rule`` (the
WY chunked algorithm the GPU kernels use) is a third, independent statement.
"""

from __future__ import annotations

import math

import pytest
import torch
from sgl_kernel.gated_delta import gates
from sgl_kernel.mamba import chunk_gated_delta_rule_cpu

GDN_UPDATE = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu
GDN_GATING = torch.ops.sgl_kernel.fused_gdn_gating_cpu
KEY_HEADS, VALUE_HEADS, K, V = 2, 6, 8, 4  # three value heads per key head, as Qwen3.6-27B (16 / 48)


def rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reference_gates(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):
    g, out_beta = torch.empty_like(a, dtype=torch.float64), torch.empty_like(b, dtype=torch.float64)
    for t in range(a.shape[0]):
        for h in range(a.shape[1]):
            x = float(a[t, h]) + float(dt_bias[h])
            softplus = math.log1p(math.exp(beta * x)) / beta if beta * x <= threshold else x
            g[t, h] = -math.exp(float(A_log[h])) * softplus
            out_beta[t, h] = 1.0 / (1.0 + math.exp(-float(b[t, h])))
    return g, out_beta


def reference_sequence(q, k, v, g, beta, state_vk, scale, l2norm=True):
    """One request, head by head and token by token. q/k [T, KEY_HEADS, K], v [T, VALUE_HEADS, V], g/beta [T,
    VALUE_HEADS]; state [VALUE_HEADS, V, K] (pool layout). Returns (outputs [T, VALUE_HEADS, V], states after
    each token [T, VALUE_HEADS, V, K])."""
    group = VALUE_HEADS // KEY_HEADS
    out = torch.zeros(q.shape[0], VALUE_HEADS, V, dtype=torch.float64)
    states = torch.zeros(q.shape[0], VALUE_HEADS, V, K, dtype=torch.float64)
    for h in range(VALUE_HEADS):
        s = state_vk[h].double().T.clone()  # [K, V], transformers' layout
        for t in range(q.shape[0]):
            qt, kt = q[t, h // group].double(), k[t, h // group].double()
            if l2norm:
                qt, kt = qt / math.sqrt(float(qt @ qt) + 1e-6), kt / math.sqrt(float(kt @ kt) + 1e-6)
            s = s * math.exp(float(g[t, h]))
            delta = float(beta[t, h]) * (v[t, h].double() - s.T @ kt)
            s = s + torch.outer(kt, delta)
            out[t, h] = s.T @ (qt * scale)
            states[t, h] = s.T
    return out, states


def random_inputs(tokens: int, seed: int):
    r = rng(seed)
    q, k = torch.randn(tokens, KEY_HEADS, K, generator=r), torch.randn(tokens, KEY_HEADS, K, generator=r)
    v = torch.randn(tokens, VALUE_HEADS, V, generator=r)
    a, b = torch.randn(tokens, VALUE_HEADS, generator=r), torch.randn(tokens, VALUE_HEADS, generator=r) * 2
    A_log, dt_bias = torch.randn(VALUE_HEADS, generator=r) * 0.5, torch.randn(VALUE_HEADS, generator=r)
    return q, k, v, a, b, A_log, dt_bias


def pool(slots: int, seed: int) -> torch.Tensor:
    return torch.randn(slots, VALUE_HEADS, V, K, generator=rng(seed)) * 0.3


def test_gates_follow_their_definition_on_both_sides_of_the_softplus_threshold():
    *_, a, b, A_log, dt_bias = random_inputs(5, seed=1)
    a[0, 0], a[1, 1] = 30.0, -40.0  # above the threshold softplus is the identity; far below, ~exp(x)
    g, beta = gates(A_log, a, b, dt_bias)
    want_g, want_beta = reference_gates(A_log, a, b, dt_bias)
    torch.testing.assert_close(g.double(), want_g, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(beta.double(), want_beta, rtol=1e-6, atol=1e-7)
    assert g.dtype == beta.dtype == torch.float32 and bool((g <= 0).all())
    g_op, beta_op = GDN_GATING(A_log, a, b, dt_bias)
    assert g_op.shape == beta_op.shape == (1, 5, VALUE_HEADS)
    assert torch.equal(g_op[0], g) and torch.equal(beta_op[0], beta)


def test_gates_honour_softplus_beta_and_threshold():
    _, _, _, a, b, A_log, dt_bias = random_inputs(4, seed=2)
    g, _ = gates(A_log, a, b, dt_bias, softplus_beta=2.0, softplus_threshold=0.5)
    want, _ = reference_gates(A_log, a, b, dt_bias, beta=2.0, threshold=0.5)
    torch.testing.assert_close(g.double(), want, rtol=1e-5, atol=1e-7)


def test_prefill_over_several_requests_matches_the_reference_and_writes_each_final_state():
    lengths, slots = [5, 1, 9], [3, 0, 6]
    tokens = sum(lengths)
    q, k, v, a, b, A_log, dt_bias = random_inputs(tokens, seed=3)
    g, beta = gates(A_log, a, b, dt_bias)
    states = pool(8, seed=4)
    before = states.clone()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out, final, h = chunk_gated_delta_rule_cpu(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        initial_state=states,
        cu_seqlens=cu,
        head_first=False,
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=torch.tensor(slots, dtype=torch.int32),
    )
    assert out.shape == (1, tokens, VALUE_HEADS, V) and h is None
    for i, (slot, begin, end) in enumerate(zip(slots, cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        want, after = reference_sequence(
            q[begin:end], k[begin:end], v[begin:end], g[begin:end], beta[begin:end], before[slot], K**-0.5
        )
        torch.testing.assert_close(out[0, begin:end].double(), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(states[slot].double(), after[-1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(final[i].double(), after[-1], rtol=1e-4, atol=1e-5)
    untouched = [s for s in range(8) if s not in slots]
    assert torch.equal(states[untouched], before[untouched])


def test_prefill_agrees_with_transformers_chunked_gated_delta_rule():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    tokens = 70  # more than one of transformers' 64-token chunks
    q, k, v, a, b, A_log, dt_bias = random_inputs(tokens, seed=5)
    g, beta = gates(A_log, a, b, dt_bias)
    states = pool(2, seed=6)
    start = states[1].clone()
    out, _, _ = chunk_gated_delta_rule_cpu(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        initial_state=states,
        cu_seqlens=torch.tensor([0, tokens]),
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=torch.tensor([1]),
    )
    group = VALUE_HEADS // KEY_HEADS
    want, want_state = torch_chunk_gated_delta_rule(
        q.repeat_interleave(group, dim=1).unsqueeze(0),
        k.repeat_interleave(group, dim=1).unsqueeze(0),
        v.unsqueeze(0),
        g=g.unsqueeze(0),
        beta=beta.unsqueeze(0),
        initial_state=start.transpose(-1, -2).unsqueeze(0),  # transformers keeps [K, V]
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states[1], want_state[0].transpose(-1, -2), rtol=1e-4, atol=1e-4)


def test_a_padding_row_starts_from_zero_and_writes_nothing():
    q, k, v, a, b, A_log, dt_bias = random_inputs(3, seed=7)
    g, beta = gates(A_log, a, b, dt_bias)
    states = pool(2, seed=8)
    before = states.clone()
    out, _, _ = chunk_gated_delta_rule_cpu(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        initial_state=states,
        cu_seqlens=torch.tensor([0, 3]),
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=torch.tensor([-1]),
    )
    want, _ = reference_sequence(q, k, v, g, beta, torch.zeros(VALUE_HEADS, V, K), K**-0.5)
    torch.testing.assert_close(out[0].double(), want, rtol=1e-4, atol=1e-5)
    assert torch.equal(states, before)


def test_decode_continues_prefill_exactly():
    """A request prefilled then decoded token by token ends where one prefill of the whole sequence ends."""
    q, k, v, a, b, A_log, dt_bias = random_inputs(7, seed=9)
    g, beta = gates(A_log, a, b, dt_bias)
    whole, stepped = pool(3, seed=10), None
    stepped = whole.clone()
    out_whole, _, _ = chunk_gated_delta_rule_cpu(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        initial_state=whole,
        cu_seqlens=torch.tensor([0, 7]),
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=torch.tensor([2]),
    )
    chunk_gated_delta_rule_cpu(
        q[:4].unsqueeze(0),
        k[:4].unsqueeze(0),
        v[:4].unsqueeze(0),
        g[:4].unsqueeze(0),
        beta[:4].unsqueeze(0),
        initial_state=stepped,
        cu_seqlens=torch.tensor([0, 4]),
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=torch.tensor([2]),
    )
    for t in range(4, 7):
        out = GDN_UPDATE(
            A_log=A_log,
            dt_bias=dt_bias,
            q=q[t : t + 1].unsqueeze(0),
            k=k[t : t + 1].unsqueeze(0),
            v=v[t : t + 1].unsqueeze(0),
            a=a[t : t + 1],
            b=b[t : t + 1],
            initial_state_source=stepped,
            initial_state_indices=torch.tensor([2]),
            cu_seqlens=torch.tensor([0, 1]),
            use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0,
            softplus_threshold=20.0,
        )
        assert out.shape == (1, 1, VALUE_HEADS, V)
        torch.testing.assert_close(out[0, 0], out_whole[0, t], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stepped[2], whole[2], rtol=1e-5, atol=1e-6)


def test_batched_decode_updates_each_requests_own_slot():
    q, k, v, a, b, A_log, dt_bias = random_inputs(3, seed=11)
    g, beta = gates(A_log, a, b, dt_bias)
    states = pool(5, seed=12)
    before = states.clone()
    slots = [4, 1, 2]
    out = GDN_UPDATE(
        A_log=A_log,
        dt_bias=dt_bias,
        q=q.unsqueeze(0),
        k=k.unsqueeze(0),
        v=v.unsqueeze(0),
        a=a,
        b=b,
        initial_state_source=states,
        initial_state_indices=torch.tensor(slots),
        cu_seqlens=torch.tensor([0, 1, 2, 3]),
        use_qk_l2norm_in_kernel=True,
    )
    for i, slot in enumerate(slots):
        want, after = reference_sequence(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], before[slot], K**-0.5
        )
        torch.testing.assert_close(out[0, i].double(), want[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(states[slot].double(), after[0], rtol=1e-4, atol=1e-5)
    assert torch.equal(states[[0, 3]], before[[0, 3]])


def verify_inputs(batch: int, drafts: int, seed: int):
    tokens = batch * drafts
    q, k, v, a, b, A_log, dt_bias = random_inputs(tokens, seed)
    buffer = torch.full((batch + 2, drafts, VALUE_HEADS, V, K), 7.0)  # one row per request, plus spare rows
    return q, k, v, a, b, A_log, dt_bias, buffer


def test_verify_keeps_the_pool_and_stores_the_state_after_every_draft_token():
    batch, drafts = 2, 4
    q, k, v, a, b, A_log, dt_bias, buffer = verify_inputs(batch, drafts, seed=13)
    g, beta = gates(A_log, a, b, dt_bias)
    states = pool(4, seed=14)
    before = states.clone()
    slots, rows = [3, 0], [2, 0]
    out = GDN_UPDATE(
        A_log=A_log,
        dt_bias=dt_bias,
        q=q.unsqueeze(0),
        k=k.unsqueeze(0),
        v=v.unsqueeze(0),
        a=a,
        b=b,
        initial_state_source=states,
        initial_state_indices=torch.tensor(slots),
        cu_seqlens=torch.tensor([0, drafts, 2 * drafts]),
        use_qk_l2norm_in_kernel=True,
        is_kda=False,
        disable_state_update=True,
        intermediate_states_buffer=buffer,
        intermediate_state_indices=torch.tensor(rows),
        cache_steps=drafts,
        retrieve_parent_token=None,
    )
    assert torch.equal(states, before)
    for i, (slot, row) in enumerate(zip(slots, rows, strict=True)):
        span = slice(i * drafts, (i + 1) * drafts)
        want, after = reference_sequence(
            q[span], k[span], v[span], g[span], beta[span], before[slot], K**-0.5
        )
        torch.testing.assert_close(out[0, span].double(), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(buffer[row].double(), after, rtol=1e-4, atol=1e-5)
    assert bool((buffer[[1, 3]] == 7.0).all())  # rows of no request untouched


def test_a_draft_tree_token_continues_from_its_parents_state():
    """Tree 0 -> {1, 2}, 1 -> 3: token 2's state is token 0's state stepped once; token 3 follows 0, 1, 3."""
    drafts = 4
    q, k, v, a, b, A_log, dt_bias, buffer = verify_inputs(1, drafts, seed=15)
    g, beta = gates(A_log, a, b, dt_bias)
    states = pool(1, seed=16)
    before = states.clone()
    parents = torch.tensor([[-1, 0, 0, 1]])
    out = GDN_UPDATE(
        A_log=A_log,
        dt_bias=dt_bias,
        q=q.unsqueeze(0),
        k=k.unsqueeze(0),
        v=v.unsqueeze(0),
        a=a,
        b=b,
        initial_state_source=states,
        initial_state_indices=torch.tensor([0]),
        cu_seqlens=torch.tensor([0, drafts]),
        use_qk_l2norm_in_kernel=True,
        disable_state_update=True,
        intermediate_states_buffer=buffer,
        intermediate_state_indices=torch.tensor([0]),
        cache_steps=drafts,
        retrieve_parent_token=parents,
    )
    for token, path in {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3]}.items():
        want, after = reference_sequence(q[path], k[path], v[path], g[path], beta[path], before[0], K**-0.5)
        torch.testing.assert_close(out[0, token].double(), want[-1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(buffer[0, token].double(), after[-1], rtol=1e-4, atol=1e-5)


def test_kda_gates_and_head_first_inputs_are_refused_by_name():
    q, k, v, a, b, A_log, dt_bias = random_inputs(1, seed=17)
    with pytest.raises(NotImplementedError, match="KDA"):
        GDN_UPDATE(
            A_log=A_log,
            dt_bias=dt_bias,
            q=q.unsqueeze(0),
            k=k.unsqueeze(0),
            v=v.unsqueeze(0),
            a=a,
            b=b,
            initial_state_source=pool(1, 0),
            initial_state_indices=torch.tensor([0]),
            is_kda=True,
        )
    with pytest.raises(NotImplementedError, match="head_first"):
        chunk_gated_delta_rule_cpu(q, k, v, a, b, None, None, head_first=True)
