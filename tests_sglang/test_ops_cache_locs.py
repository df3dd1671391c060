"""The stand-in's KV-slot bookkeeping ops against hand-made cases and plain-Python restatements."""

from __future__ import annotations

import torch
from sgl_kernel import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)

POOL_LEN = 10


def table() -> torch.Tensor:
    """A req_to_token table whose entry (r, p) is 100 * r + p, so any misplaced copy shows."""
    return (torch.arange(4).view(-1, 1) * 100 + torch.arange(POOL_LEN)).int()


def test_assign_req_to_token_pool_writes_each_requests_range():
    req_to_token = torch.zeros(4, POOL_LEN, dtype=torch.int32)
    out_cache_loc = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)
    # request in row 2 gets positions 3..5, request in row 0 gets positions 0..1
    assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        req_to_token,
        torch.tensor([3, 0]),
        torch.tensor([6, 2]),
        out_cache_loc,
        POOL_LEN,
    )
    expected = torch.zeros(4, POOL_LEN, dtype=torch.int32)
    expected[2, 3:6] = torch.tensor([11, 12, 13])
    expected[0, 0:2] = torch.tensor([21, 22])
    assert torch.equal(req_to_token, expected)


def test_assign_extend_cache_locs_reads_ranges_back_in_order():
    out = torch.full((5,), -1, dtype=torch.int64)
    assign_extend_cache_locs_cpu(
        torch.tensor([3, 1]), table(), torch.tensor([2, 7]), torch.tensor([4, 10]), out, POOL_LEN
    )
    assert out.tolist() == [302, 303, 107, 108, 109]


def test_extend_cache_locs_is_the_inverse_of_assign_req_to_token_pool():
    generator = torch.Generator().manual_seed(3)
    starts, ends = torch.tensor([0, 4, 2]), torch.tensor([3, 9, 2])  # the last request has nothing new
    locs = torch.randperm(50, generator=generator)[: int((ends - starts).sum())]
    req_to_token = torch.zeros(4, POOL_LEN, dtype=torch.int32)
    indices = torch.tensor([1, 3, 0])
    assign_req_to_token_pool_cpu(indices, req_to_token, starts, ends, locs, POOL_LEN)
    back = torch.empty_like(locs)
    assign_extend_cache_locs_cpu(indices, req_to_token, starts, ends, back, POOL_LEN)
    assert torch.equal(back, locs)


def test_assign_draft_cache_locs_contiguous_copies_topk_times_steps_after_the_prefix():
    out = torch.zeros(2 * 2 * 2, dtype=torch.int64)
    # topk 2, 2 steps: each request's 4 reserved slots follow its seq_len
    assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([1, 3]), table(), torch.tensor([3, 5]), out, POOL_LEN, 2, 2
    )
    assert out.tolist() == [103, 104, 105, 106, 305, 306, 307, 308]


def test_build_draft_decode_metadata_gives_each_candidate_prefix_plus_its_draft_slots():
    topk, steps = 2, 2
    seq_lens = torch.tensor([3, 2])
    out = build_draft_decode_metadata_cpu(table(), torch.tensor([1, 2]), seq_lens, topk, steps, POOL_LEN)
    assert out.shape == (4, POOL_LEN) and out.dtype == torch.int32
    rows = [r[: s + steps] for r, s in zip(out.tolist(), [3, 3, 2, 2], strict=True)]
    assert rows == [
        [100, 101, 102, 103, 104],  # request row 1, candidate 0: drafts at seq_len + 0 * steps
        [100, 101, 102, 105, 106],  # candidate 1: drafts at seq_len + 1 * steps
        [200, 201, 202, 203],
        [200, 201, 204, 205],
    ]


def test_fill_bonus_tokens_takes_each_requests_last_accepted_token():
    accept_tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    bonus = torch.zeros(3, dtype=torch.int64)
    fill_bonus_tokens_cpu(accept_tokens, torch.tensor([1, 4, 2]), bonus, 4)
    assert bonus.tolist() == [5, 12, 14]


def test_fill_accept_out_cache_loc_compacts_accepted_slots_in_order():
    accept_index = torch.tensor([[0, 2, -1], [4, -1, -1], [6, 7, 8]])
    out_cache_loc = torch.arange(100, 109)
    out = torch.full((6,), -1, dtype=torch.int64)
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)
    # restatement: walk the flat list, keep what is not -1
    expected = [int(out_cache_loc[i]) for i in accept_index.flatten().tolist() if i != -1]
    assert out.tolist() == expected == [100, 102, 104, 106, 107, 108]


def test_copy_all_layer_kv_cache_moves_slots_in_every_buffer_reading_sources_first():
    layers = [torch.randn(12, 2, 4).to(dtype) for dtype in (torch.bfloat16, torch.float32, torch.float16)]
    before = [t.clone() for t in layers]
    data_ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)
    strides = torch.tensor([t.stride(0) * t.element_size() for t in layers])
    tgt, src = (
        torch.tensor([3, 5, 9]),
        torch.tensor([5, 9, 1]),
    )  # 5 and 9 are read before they are overwritten
    copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for after, orig in zip(layers, before, strict=True):
        expected = orig.clone()
        for t, s in zip(tgt.tolist(), src.tolist(), strict=True):
            expected[t] = orig[s]
        assert torch.equal(after, expected)
