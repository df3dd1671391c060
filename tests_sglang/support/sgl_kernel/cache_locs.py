"""KV-cache slot bookkeeping ops: copying slot numbers between ``req_to_token`` rows and flat location lists.

``req_to_token`` is SGLang's ``[max_requests, pool_len]`` table (int32): row ``r`` lists, position by position, the
KV-cache slot that holds each token of request ``r``. These ops move slot numbers between that table and flat
"out cache loc" vectors (one slot per new token, requests one after another). Each follows the Triton kernel or
the Python wrapper of the same name in SGLang 0.5.23 (``sglang/srt/mem_cache/allocation.py``,
``sglang/kernels/ops/speculative/{cache_locs,eagle}.py``, ``sglang/kernels/ops/kvcache/cache_move.py``); the
semantics are restated in each docstring. Loops run over requests (a handful on the CPU), slices do the rest.
"""

from __future__ import annotations

import ctypes

import torch


def _check_pool_len(req_to_token: torch.Tensor, pool_len: int) -> None:
    if req_to_token.dim() != 2 or req_to_token.shape[1] != pool_len:
        raise ValueError(
            f"req_to_token has shape {tuple(req_to_token.shape)}, expected [*, pool_len={pool_len}]"
        )


def _rows(*tensors: torch.Tensor) -> list[tuple[int, ...]]:
    return list(zip(*(t.tolist() for t in tensors), strict=True))


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write new slots into the table: ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` gets the next
    ``end[i] - start[i]`` entries of ``out_cache_loc`` (request i's entries follow those of requests 0..i-1)."""
    _check_pool_len(req_to_token, pool_len)
    offset = 0
    for req, start, end in _rows(req_pool_indices, start_offset, end_offset):
        if end > start:
            req_to_token[req, start:end] = out_cache_loc[offset : offset + end - start].to(req_to_token.dtype)
        offset += end - start


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse read: ``out_cache_loc`` gets ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` for each
    request in turn, packed one after another."""
    _check_pool_len(req_to_token, pool_len)
    offset = 0
    for req, start, end in _rows(req_pool_indices, start_offset, end_offset):
        if end > start:
            out_cache_loc[offset : offset + end - start] = req_to_token[req, start:end].to(
                out_cache_loc.dtype
            )
        offset += end - start


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """EAGLE draft slots: request i's ``topk * num_steps`` slots, which the allocator reserved right after its
    committed tokens (``req_to_token[req, seq_lens[i] : seq_lens[i] + topk * num_steps]``), are copied to
    ``out_cache_loc[i * topk * num_steps : (i + 1) * topk * num_steps]``."""
    _check_pool_len(req_to_token, pool_len)
    width = topk * num_steps
    for i, (req, seq_len) in enumerate(_rows(req_pool_indices, seq_lens)):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[req, seq_len : seq_len + width].to(
            out_cache_loc.dtype
        )


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """The per-candidate table for multi-step draft decoding (``IntelAMXMultiStepDraftBackend``): a new
    ``[num_seqs * topk, pool_len]`` table whose row ``i * topk + t`` holds request i's committed prefix
    (``seq_lens[i]`` slots) followed by candidate t's ``num_steps`` draft slots, which
    ``assign_draft_cache_locs_contiguous`` laid out at ``seq_lens[i] + t * num_steps``. Entries past
    ``seq_lens[i] + num_steps`` are not read by SGLang; they are zero here."""
    _check_pool_len(req_to_token, pool_len)
    out = torch.zeros((len(seq_lens) * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for i, (req, seq_len) in enumerate(_rows(req_pool_indices, seq_lens)):
        row = req_to_token[req]
        for t in range(topk):
            draft = seq_len + t * num_steps
            out[i * topk + t, :seq_len] = row[:seq_len]
            out[i * topk + t, seq_len : seq_len + num_steps] = row[draft : draft + num_steps]
    return out


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i]`` = the last accepted token of request i: ``accept_tokens.flat[i * accept_stride +
    accept_lens[i] - 1]`` (``accept_lens`` counts the bonus token itself)."""
    flat = accept_tokens.reshape(-1)
    for i, accepted in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[i * accept_stride + accepted - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compaction: for every entry of ``accept_index`` (flattened) that is not -1, in order, the next entry of
    ``accept_out_cache_loc`` gets ``out_cache_loc[that index]``; -1 entries are skipped."""
    kept = accept_index.reshape(-1)
    kept = kept[kept != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Move KV slots in every layer's buffer: for each buffer b (base address ``data_ptrs[b]``, ``strides[b]``
    bytes per slot), the bytes of slot ``src_loc[j]`` go to slot ``tgt_loc[j]``. SGLang hands raw addresses (its
    GPU kernel walks them), so the buffers are viewed through ctypes. Like the tiled Triton kernel, all sources
    are read before any target is written, so overlapping moves are safe."""
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError(f"tgt_loc has {tgt_loc.numel()} slots, src_loc {src_loc.numel()}")
    if tgt_loc.numel() == 0:
        return
    src = src_loc.long()
    tgt = tgt_loc.long()
    slots = int(max(src.max(), tgt.max())) + 1
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (slots * stride)).from_address(base)
        view = torch.frombuffer(raw, dtype=torch.uint8).view(slots, stride)
        view[tgt] = view[src]  # advanced indexing gathers a copy first
