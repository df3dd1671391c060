"""The stand-in's causal conv1d ops (prefill, decode, speculative verify) against a per-tap restatement.

The reference writes each output as ``bias + sum_j weight[c, j] * x[c, t - (W - 1) + j]`` with the inputs before a
request's first token taken from its conv state (or zeros), then SiLU; transformers' ``causal_conv1d_fn`` torch
and ``causal_conv1d_update`` reference implementations (used when the ``causal_conv1d`` package is absent) are a
second statement for prefill and decode.
"""

from __future__ import annotations

import torch
from sgl_kernel.mamba import causal_conv1d_fn_cpu, causal_conv1d_update_cpu

CHANNELS, WIDTH = 6, 4
HISTORY = WIDTH - 1


def rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def weights(seed: int):
    r = rng(seed)
    return torch.randn(CHANNELS, WIDTH, generator=r), torch.randn(CHANNELS, generator=r)


def reference(tokens: torch.Tensor, history: torch.Tensor, weight, bias, silu=True) -> torch.Tensor:
    """tokens [C, T], history [C, W - 1] (oldest first) -> [C, T]."""
    seq = torch.cat([history, tokens], dim=1).double()
    out = torch.zeros(tokens.shape, dtype=torch.float64)
    for c in range(CHANNELS):
        for t in range(tokens.shape[1]):
            total = float(bias[c]) if bias is not None else 0.0
            for j in range(WIDTH):
                total += float(weight[c, j]) * float(seq[c, t + j])
            out[c, t] = total / (1 + torch.exp(torch.tensor(-total)).item()) if silu else total
    return out


def test_prefill_of_several_requests_with_and_without_a_state():
    weight, bias = weights(1)
    lengths, slots, initial = [5, 2, 4], [2, 0, 3], [False, True, True]
    x = torch.randn(CHANNELS, sum(lengths), generator=rng(2))
    states = torch.randn(5, CHANNELS, HISTORY, generator=rng(3))
    before = states.clone()
    cu = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    out = causal_conv1d_fn_cpu(
        x,
        weight,
        bias,
        activation="silu",
        conv_states=states,
        has_initial_state=torch.tensor(initial),
        cache_indices=torch.tensor(slots, dtype=torch.int32),
        query_start_loc=cu,
        seq_lens_cpu=lengths,
    )
    assert out.shape == x.shape
    for slot, start, begin, end in zip(slots, initial, cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        history = before[slot] if start else torch.zeros(CHANNELS, HISTORY)
        torch.testing.assert_close(
            out[:, begin:end].double(),
            reference(x[:, begin:end], history, weight, bias),
            rtol=1e-5,
            atol=1e-6,
        )
        # the state now holds the last W - 1 inputs (the old state's tail for the 2-token request)
        torch.testing.assert_close(states[slot], torch.cat([history, x[:, begin:end]], dim=1)[:, -HISTORY:])
    assert torch.equal(states[[1, 4]], before[[1, 4]])


def test_prefill_then_decode_agree_with_transformers_own_conv1d():
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn, causal_conv1d_update

    weight, bias = weights(4)
    x = torch.randn(CHANNELS, 9, generator=rng(5))
    states = torch.zeros(1, CHANNELS, HISTORY)
    out = causal_conv1d_fn_cpu(
        x[:, :6],
        weight,
        bias,
        activation="silu",
        conv_states=states,
        has_initial_state=torch.tensor([False]),
        cache_indices=torch.tensor([0]),
        query_start_loc=torch.tensor([0, 6]),
        seq_lens_cpu=[6],
    )
    torch.testing.assert_close(
        out, causal_conv1d_fn(x[:, :6].unsqueeze(0), weight, bias, activation="silu")[0], rtol=1e-5, atol=1e-6
    )
    theirs = x[:, 3:6].unsqueeze(0).clone()  # transformers' decode state: the last W - 1 inputs
    for t in range(6, 9):
        ours = causal_conv1d_update_cpu(x[:, t].unsqueeze(0), states, weight, bias, "silu", torch.tensor([0]))
        want = causal_conv1d_update(
            x[:, t : t + 1].unsqueeze(0).clone(), theirs, weight, bias, activation="silu"
        )
        torch.testing.assert_close(ours[0], want[0, :, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(states, theirs)


def test_a_padding_row_is_skipped():
    weight, bias = weights(6)
    x = torch.randn(CHANNELS, 3, generator=rng(7))
    states = torch.randn(2, CHANNELS, HISTORY, generator=rng(8))
    before = states.clone()
    out = causal_conv1d_fn_cpu(
        x,
        weight,
        bias,
        activation=None,
        conv_states=states,
        has_initial_state=torch.tensor([True, True]),
        cache_indices=torch.tensor([-1, 1]),
        query_start_loc=torch.tensor([0, 1, 3]),
        seq_lens_cpu=[1, 2],
    )
    assert torch.equal(states[0], before[0]) and not torch.equal(states[1], before[1])
    torch.testing.assert_close(
        out[:, 1:].double(), reference(x[:, 1:], before[1], weight, bias, silu=False), rtol=1e-5, atol=1e-6
    )


def test_decode_continues_prefill_exactly():
    weight, bias = weights(9)
    x = torch.randn(CHANNELS, 8, generator=rng(10))
    whole, stepped = torch.zeros(1, CHANNELS, HISTORY), torch.zeros(1, CHANNELS, HISTORY)
    args = dict(activation="silu", has_initial_state=torch.tensor([False]), cache_indices=torch.tensor([0]))
    full = causal_conv1d_fn_cpu(
        x, weight, bias, conv_states=whole, query_start_loc=torch.tensor([0, 8]), **args
    )
    causal_conv1d_fn_cpu(
        x[:, :5], weight, bias, conv_states=stepped, query_start_loc=torch.tensor([0, 5]), **args
    )
    for t in range(5, 8):
        out = causal_conv1d_update_cpu(x[:, t].unsqueeze(0), stepped, weight, bias, "silu", torch.tensor([0]))
        assert out.shape == (1, CHANNELS)
        torch.testing.assert_close(out[0], full[:, t], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stepped, whole)


def test_verify_rolls_the_state_by_every_draft_and_stores_each_window():
    weight, bias = weights(11)
    batch, drafts = 2, 4
    x = torch.randn(batch, CHANNELS, drafts, generator=rng(12))
    states = torch.randn(3, CHANNELS, HISTORY, generator=rng(13))
    before = states.clone()
    windows = torch.full((4, drafts, CHANNELS, HISTORY), 9.0)
    slots, rows = [2, 0], [3, 1]
    out = causal_conv1d_update_cpu(
        x,
        states,
        weight,
        bias,
        "silu",
        conv_state_indices=torch.tensor(slots),
        intermediate_conv_window=windows,
        intermediate_state_indices=torch.tensor(rows),
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_parent_token=None,
    )
    assert out.shape == x.shape
    for i, (slot, row) in enumerate(zip(slots, rows, strict=True)):
        torch.testing.assert_close(
            out[i].double(), reference(x[i], before[slot], weight, bias), rtol=1e-5, atol=1e-6
        )
        seq = torch.cat([before[slot], x[i]], dim=1)
        for t in range(drafts):
            assert torch.equal(
                windows[row, t], seq[:, t + 1 : t + 1 + HISTORY]
            )  # the W - 1 inputs ending at t
        assert torch.equal(states[slot], seq[:, -HISTORY:])
    assert bool((windows[[0, 2]] == 9.0).all()) and torch.equal(states[1], before[1])


def test_verify_of_a_draft_tree_convolves_along_each_tokens_ancestors():
    """Tree 0 -> {1, 2}, 1 -> 3 as EAGLE's links: first child 0->1, 1->3; next sibling 1->2."""
    weight, bias = weights(14)
    x = torch.randn(1, CHANNELS, 4, generator=rng(15))
    states = torch.randn(1, CHANNELS, HISTORY, generator=rng(16))
    before = states.clone()
    windows = torch.zeros(1, 4, CHANNELS, HISTORY)
    parents = torch.full((1, 4), -5, dtype=torch.int64)
    out = causal_conv1d_update_cpu(
        x,
        states,
        weight,
        bias,
        "silu",
        conv_state_indices=torch.tensor([0]),
        intermediate_conv_window=windows,
        intermediate_state_indices=torch.tensor([0]),
        retrieve_next_token=torch.tensor([[1, 3, -1, -1]]),
        retrieve_next_sibling=torch.tensor([[-1, 2, -1, -1]]),
        retrieve_parent_token=parents,
    )
    assert parents.tolist() == [[-1, 0, 0, 1]]
    for token, path in {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3]}.items():
        want = reference(x[0][:, path], before[0], weight, bias)[:, -1]
        torch.testing.assert_close(out[0, :, token].double(), want, rtol=1e-5, atol=1e-6)
        lineage = torch.cat([before[0], x[0][:, path]], dim=1)
        assert torch.equal(windows[0, token], lineage[:, -HISTORY:])
