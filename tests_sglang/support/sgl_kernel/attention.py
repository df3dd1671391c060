"""``torch.ops.sgl_kernel.extend_attention_cpu`` and ``decode_attention_cpu``: paged attention over SGLang's KV cache.

SGLang's ``intel_amx`` attention backend (``sglang/srt/layers/attention/intel_amx_backend.py``) calls these two
ops; it is the CPU backend that supports speculative verify (``torch_native`` fails there), so NGRAM and STANDALONE
need them. They are registered as torch custom ops (``torch.library.custom_op``) because SGLang looks them up on
``torch.ops.sgl_kernel``. The math is plain torch in float32, one request at a time, written from the semantics of
SGLang's Triton references (``sglang/kernels/ops/attention/{extend,decode}_attention.py``):

* keys and values live in per-layer buffers ``[slots, kv_heads, head_dim]``; request r's token p is in slot
  ``req_to_token[r, p]``. Query head h reads KV head ``h // (heads / kv_heads)`` (grouped-query attention).
* scores are ``q·k * sm_scale``, soft-capped to ``logit_cap * tanh(s / logit_cap)`` when ``logit_cap > 0``;
  a per-head ``sinks`` logit, when given, joins the softmax denominator only.
* ``sliding_window_size`` is what the backend passes (the layer's window + 1; 0 when the layer has none): a query at
  position p sees keys at positions > p - sliding_window_size.
* extend: request i's last ``extend_seq_lens[i]`` tokens are queries; they see the whole prefix and, among the new
  tokens, themselves and earlier ones (``is_causal``), or, with a ``tree_mask`` (speculative verify of a draft tree,
  ``N x N`` per request, SGLang's QLEN_ONLY layout), the new tokens the mask allows. New keys come from
  ``k_extend``/``v_extend`` (the cache when those are None).
* decode: one query per request over its ``seq_lens[i]`` tokens; the new token's ``key``/``value``, when given,
  are first written to slots ``loc`` (SGLang leaves that write to this op). ``attn_logits`` is the kernel's
  scratch buffer: unused here.

Cross-attention (encoder-decoder models) and non-unit KV scales (fp8 caches) are not reached by the tiny Qwen3
of this tier and raise ``NotImplementedError`` rather than being guessed.
"""

from __future__ import annotations

import torch

TORCH_OPS = ("extend_attention_cpu", "decode_attention_cpu")


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ``q`` [Lq, H, D] over ``k`` [Lk, Hkv, D] / ``v`` [Lk, Hkv, Dv]; ``visible`` [Lq, Lk] bool or
    None (all visible). Returns [Lq, H, Dv] in float32; a query that sees no key gets zeros."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} KV heads")
    group = heads // kv_heads
    qh = q.float().transpose(0, 1)  # H, Lq, D
    kh = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # H, Lk, D
    vh = v.float().repeat_interleave(group, dim=1).transpose(0, 1)  # H, Lk, Dv
    scores = torch.matmul(qh, kh.transpose(1, 2)) * sm_scale  # H, Lq, Lk
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(heads, 1, 1).expand(heads, scores.shape[1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    peak = scores.amax(dim=-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        weights = weights[..., :-1]
    weights = torch.where(total > 0, weights / total.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    return torch.matmul(weights, vh).transpose(0, 1)  # Lq, H, Dv


def _window(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window_size: int) -> torch.Tensor:
    """[Lq, Lk] True where a key is inside the query's sliding window (all True when there is no window)."""
    if sliding_window_size <= 0:
        return torch.ones(q_pos.numel(), k_pos.numel(), dtype=torch.bool)
    return k_pos.view(1, -1) > q_pos.view(-1, 1) - sliding_window_size


def _unsupported(name: str, k_scale: float, v_scale: float, is_cross_attn: bool, encoder_lens) -> None:
    if is_cross_attn or encoder_lens is not None:
        raise NotImplementedError(f"{name}: cross-attention is not provided by draftgen's CPU stand-in")
    if k_scale != 1.0 or v_scale != 1.0:
        raise NotImplementedError(
            f"{name}: scaled (fp8) KV caches are not provided by draftgen's CPU stand-in"
        )


@torch.library.custom_op("sgl_kernel::extend_attention_cpu", mutates_args=("o_extend",), device_types="cpu")
def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    _unsupported("extend_attention_cpu", k_scale, v_scale, is_cross_attn, encoder_lens)
    rows = zip(
        req_pool_indices.tolist(),
        seq_lens.tolist(),
        extend_seq_lens.tolist(),
        extend_start_loc.tolist(),
        strict=True,
    )
    mask_start = 0
    for req, seq_len, extend_len, start in rows:
        prefix_len = seq_len - extend_len
        slots = req_to_token[req, :seq_len].long()
        keys, values = k_buffer[slots], v_buffer[slots]
        if k_extend is not None and v_extend is not None:
            keys = torch.cat([keys[:prefix_len], k_extend[start : start + extend_len]])
            values = torch.cat([values[:prefix_len], v_extend[start : start + extend_len]])
        q_pos = torch.arange(prefix_len, seq_len)
        k_pos = torch.arange(seq_len)
        visible = _window(q_pos, k_pos, sliding_window_size)
        if tree_mask is not None:
            tree = tree_mask.reshape(-1)[mask_start : mask_start + extend_len * extend_len]
            among_new = tree.view(extend_len, extend_len).bool()
            mask_start += extend_len * extend_len
            visible[:, prefix_len:] &= among_new
        elif is_causal:
            visible &= k_pos.view(1, -1) <= q_pos.view(-1, 1)
        out = attend(q_extend[start : start + extend_len], keys, values, visible, sm_scale, logit_cap, sinks)
        o_extend[start : start + extend_len] = out.to(o_extend.dtype)


@torch.library.custom_op(
    "sgl_kernel::decode_attention_cpu",
    mutates_args=("k_buffer", "v_buffer", "output", "attn_logits"),
    device_types="cpu",
)
def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    _unsupported("decode_attention_cpu", k_scale, v_scale, is_cross_attn, encoder_lens)
    if key is not None and value is not None:
        slots = loc.long()
        k_buffer[slots] = key.to(k_buffer.dtype)
        v_buffer[slots] = value.to(v_buffer.dtype)
    for i, (req, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        slots = req_to_token[req, :seq_len].long()
        visible = _window(torch.tensor([seq_len - 1]), torch.arange(seq_len), sliding_window_size)
        out = attend(query[i : i + 1], k_buffer[slots], v_buffer[slots], visible, sm_scale, logit_cap, sinks)
        output[i] = out[0].to(output.dtype)
