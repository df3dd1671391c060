"""The stand-in's attention ops against references: ``scaled_dot_product_attention`` and a plain per-score loop.

Each case lays a few requests' keys and values in shuffled KV-cache slots (as SGLang's allocator does), runs the
op through ``torch.ops.sgl_kernel`` exactly as SGLang's ``intel_amx`` backend calls it, and compares with attention
computed on the same tokens laid out contiguously.
"""

from __future__ import annotations

import math

import pytest
import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel.*)
import torch
import torch.nn.functional as F

HEADS, KV_HEADS, DIM = 4, 2, 16
SLOTS, POOL_LEN = 64, 32
SCALE = 1.0 / math.sqrt(DIM)


class Cache:
    """A KV cache with requests' tokens at shuffled slots, plus the contiguous copy the references use."""

    def __init__(self, seq_lens: list[int], seed: int = 0, dtype=torch.float32):
        generator = torch.Generator().manual_seed(seed)
        self.k_buffer = torch.randn(SLOTS, KV_HEADS, DIM, generator=generator).to(dtype)
        self.v_buffer = torch.randn(SLOTS, KV_HEADS, DIM, generator=generator).to(dtype)
        self.req_to_token = torch.zeros(8, POOL_LEN, dtype=torch.int32)
        free = torch.randperm(SLOTS - 1, generator=generator) + 1  # slot 0 is SGLang's padding slot
        self.req_pool_indices = torch.tensor([5, 2, 7][: len(seq_lens)], dtype=torch.int64)
        used = 0
        for req, seq_len in zip(self.req_pool_indices.tolist(), seq_lens, strict=True):
            self.req_to_token[req, :seq_len] = free[used : used + seq_len].int()
            used += seq_len
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)

    def keys(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        slots = self.req_to_token[self.req_pool_indices[i], : self.seq_lens[i]].long()
        return self.k_buffer[slots], self.v_buffer[slots]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """[Lq, H, D] x [Lk, Hkv, D] -> [Lq, H, D] with torch's own attention (grouped-query)."""
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1).unsqueeze(0),
        k.float().transpose(0, 1).unsqueeze(0),
        v.float().transpose(0, 1).unsqueeze(0),
        attn_mask=visible,
        scale=SCALE,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def loop_attention(q, k, v, visible, logit_cap=0.0, sinks=None):
    """Attention one score at a time, straight from the definition (capped scores, sink in the denominator)."""
    lq, heads, _ = q.shape
    out = torch.zeros(lq, heads, v.shape[-1], dtype=torch.float64)
    group = heads // k.shape[1]
    for i in range(lq):
        for h in range(heads):
            scores = []
            for j in range(k.shape[0]):
                if visible[i, j]:
                    s = float(q[i, h].double() @ k[j, h // group].double()) * SCALE
                    scores.append((j, logit_cap * math.tanh(s / logit_cap) if logit_cap > 0 else s))
            exps = [(j, math.exp(s)) for j, s in scores]
            total = sum(e for _, e in exps) + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
            for j, e in exps:
                out[i, h] += (e / total) * v[j, h // group].double()
    return out.float()


def run_extend(
    cache: Cache,
    extend_lens: list[int],
    q,
    k_new,
    v_new,
    *,
    tree_mask=None,
    window=0,
    logit_cap=0.0,
    sinks=None,
    is_causal=True,
    with_new_kv=True,
):
    o = torch.empty_like(q)
    starts = torch.tensor([0, *torch.tensor(extend_lens).cumsum(0).tolist()[:-1]], dtype=torch.int32)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        k_new if with_new_kv else None,
        v_new if with_new_kv else None,
        o,
        cache.k_buffer,
        cache.v_buffer,
        1.0,
        1.0,
        cache.req_to_token,
        cache.req_pool_indices,
        cache.seq_lens,
        torch.tensor(extend_lens, dtype=torch.int32),
        starts,
        max(extend_lens),
        SCALE,
        logit_cap,
        False,
        window,
        None,
        sinks,
        tree_mask,
        is_causal,
    )
    return o, starts.tolist()


def new_tokens(cache: Cache, extend_lens: list[int], seed: int = 1):
    """Queries for each request's last tokens; their K/V are the cache's (SGLang writes them before the op)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(extend_lens), HEADS, DIM, generator=generator)
    ks, vs = [], []
    for i, n in enumerate(extend_lens):
        k, v = cache.keys(i)
        ks.append(k[-n:])
        vs.append(v[-n:])
    return q, torch.cat(ks), torch.cat(vs)


def causal(prefix: int, n: int) -> torch.Tensor:
    return torch.arange(prefix + n).view(1, -1) <= (prefix + torch.arange(n)).view(-1, 1)


@pytest.mark.parametrize("with_new_kv", [True, False], ids=["new-kv-given", "new-kv-from-cache"])
def test_extend_matches_sdpa(with_new_kv):
    seq_lens, extend_lens = [9, 5, 12], [4, 5, 1]  # a prefix hit, a fresh prompt, one new token
    cache = Cache(seq_lens)
    q, k_new, v_new = new_tokens(cache, extend_lens)
    o, starts = run_extend(cache, extend_lens, q, k_new, v_new, with_new_kv=with_new_kv)
    for i, (seq_len, n, start) in enumerate(zip(seq_lens, extend_lens, starts, strict=True)):
        k, v = cache.keys(i)
        expected = sdpa(q[start : start + n], k, v, causal(seq_len - n, n))
        torch.testing.assert_close(o[start : start + n], expected, atol=1e-5, rtol=1e-5)


def test_extend_bf16_matches_sdpa_within_bf16_rounding():
    seq_lens, extend_lens = [7, 3], [3, 3]
    cache = Cache(seq_lens, dtype=torch.bfloat16)
    q, k_new, v_new = new_tokens(cache, extend_lens)
    q = q.bfloat16()
    o, starts = run_extend(cache, extend_lens, q, k_new, v_new)
    assert o.dtype == torch.bfloat16
    for i, (seq_len, n, start) in enumerate(zip(seq_lens, extend_lens, starts, strict=True)):
        k, v = cache.keys(i)
        expected = sdpa(q[start : start + n], k, v, causal(seq_len - n, n))
        torch.testing.assert_close(o[start : start + n].float(), expected, atol=2e-2, rtol=2e-2)


def test_extend_with_tree_mask_lets_drafts_see_only_their_ancestors():
    # Verify step: 4 draft-tree tokens per request after the committed prefix; QLEN_ONLY mask (N x N per request).
    seq_lens, n = [10, 6], 4
    cache = Cache(seq_lens)
    q, k_new, v_new = new_tokens(cache, [n, n])
    trees = [
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]],  # 0 -> {1, 2}, 1 -> {3}
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]],  # a chain
    ]
    tree_mask = torch.tensor(trees, dtype=torch.bool).flatten()
    o, starts = run_extend(cache, [n, n], q, k_new, v_new, tree_mask=tree_mask)
    for i, (seq_len, start) in enumerate(zip(seq_lens, starts, strict=True)):
        k, v = cache.keys(i)
        visible = torch.ones(n, seq_len, dtype=torch.bool)
        visible[:, seq_len - n :] = torch.tensor(trees[i], dtype=torch.bool)
        expected = sdpa(q[start : start + n], k, v, visible)
        torch.testing.assert_close(o[start : start + n], expected, atol=1e-5, rtol=1e-5)
    # The branch matters: node 2 must not see node 1 (a causal mask would let it).
    k, v = cache.keys(0)
    causal_out = sdpa(q[0:n], k, v, causal(seq_lens[0] - n, n))
    assert not torch.allclose(o[2], causal_out[2], atol=1e-4)


def test_extend_non_causal_sees_every_new_token():
    seq_lens, extend_lens = [6], [3]
    cache = Cache(seq_lens)
    q, k_new, v_new = new_tokens(cache, extend_lens)
    o, _ = run_extend(cache, extend_lens, q, k_new, v_new, is_causal=False)
    k, v = cache.keys(0)
    torch.testing.assert_close(o, sdpa(q, k, v, torch.ones(3, 6, dtype=torch.bool)), atol=1e-5, rtol=1e-5)


def test_extend_sliding_window_logit_cap_and_sinks_match_the_loop():
    seq_lens, extend_lens, window = [9], [4], 3  # window as the backend passes it: the layer's window + 1
    cache = Cache(seq_lens)
    q, k_new, v_new = new_tokens(cache, extend_lens)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    o, _ = run_extend(cache, extend_lens, q, k_new, v_new, window=window, logit_cap=2.0, sinks=sinks)
    k, v = cache.keys(0)
    q_pos = torch.arange(5, 9).view(-1, 1)
    k_pos = torch.arange(9).view(1, -1)
    visible = (k_pos <= q_pos) & (k_pos > q_pos - window)
    torch.testing.assert_close(
        o, loop_attention(q, k, v, visible, logit_cap=2.0, sinks=sinks), atol=1e-5, rtol=1e-5
    )


def run_decode(cache: Cache, q, key, value, loc, *, window=0, logit_cap=0.0, sinks=None):
    o = torch.empty_like(q)
    attn_logits = torch.zeros(q.shape[0], HEADS, 8, DIM + 1)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q,
        cache.k_buffer,
        cache.v_buffer,
        1.0,
        1.0,
        o,
        key,
        value,
        loc,
        attn_logits,
        cache.req_to_token,
        cache.req_pool_indices,
        cache.seq_lens,
        SCALE,
        logit_cap,
        False,
        window,
        None,
        sinks,
    )
    return o


def decode_case(seq_lens: list[int]):
    """A decode step: each request's last slot is its new token, whose K/V the op itself must write."""
    cache = Cache(seq_lens)
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(len(seq_lens), HEADS, DIM, generator=generator)
    key = torch.randn(len(seq_lens), KV_HEADS, DIM, generator=generator)
    value = torch.randn(len(seq_lens), KV_HEADS, DIM, generator=generator)
    loc = torch.stack(
        [cache.req_to_token[r, s - 1].long() for r, s in zip(cache.req_pool_indices, seq_lens, strict=True)]
    )
    return cache, q, key, value, loc


def test_decode_writes_the_new_token_and_matches_sdpa():
    seq_lens = [5, 11, 1]
    cache, q, key, value, loc = decode_case(seq_lens)
    o = run_decode(cache, q, key, value, loc)
    torch.testing.assert_close(cache.k_buffer[loc], key)
    torch.testing.assert_close(cache.v_buffer[loc], value)
    for i, seq_len in enumerate(seq_lens):
        k, v = cache.keys(i)
        expected = sdpa(q[i : i + 1], k, v, torch.ones(1, seq_len, dtype=torch.bool))
        torch.testing.assert_close(o[i : i + 1], expected, atol=1e-5, rtol=1e-5)


def test_decode_sliding_window_logit_cap_and_sinks_match_the_loop():
    seq_lens, window = [8, 3], 4
    cache, q, key, value, loc = decode_case(seq_lens)
    sinks = torch.tensor([1.0, 0.0, -0.5, 3.0])
    o = run_decode(cache, q, key, value, loc, window=window, logit_cap=1.5, sinks=sinks)
    for i, seq_len in enumerate(seq_lens):
        k, v = cache.keys(i)
        visible = (torch.arange(seq_len) > seq_len - 1 - window).view(1, -1)
        expected = loop_attention(q[i : i + 1], k, v, visible, logit_cap=1.5, sinks=sinks)
        torch.testing.assert_close(o[i : i + 1], expected, atol=1e-5, rtol=1e-5)


def test_unsupported_attention_features_fail_by_name():
    cache, q, key, value, loc = decode_case([3])
    with pytest.raises(NotImplementedError, match="decode_attention_cpu: scaled"):
        torch.ops.sgl_kernel.decode_attention_cpu(
            q,
            cache.k_buffer,
            cache.v_buffer,
            0.5,
            1.0,
            torch.empty_like(q),
            key,
            value,
            loc,
            torch.zeros(1),
            cache.req_to_token,
            cache.req_pool_indices,
            cache.seq_lens,
            SCALE,
            0.0,
            False,
            0,
            None,
            None,
        )
