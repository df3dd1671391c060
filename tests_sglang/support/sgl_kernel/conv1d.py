"""Causal depthwise conv1d over SGLang's per-request conv state: the short convolution of a Gated DeltaNet layer.

SGLang 0.5.23's GDN backend (``sglang/srt/layers/attention/linear/gdn_backend.py``) imports
``causal_conv1d_fn_cpu`` (prefill) and ``causal_conv1d_update_cpu`` (decode and speculative verify) from
``sgl_kernel.mamba`` when it runs on the CPU; their meaning is that of the Triton kernels of the same names in
``sglang/kernels/ops/mamba/causal_conv1d_triton.py``, restated here:

* each channel c of ``x`` is convolved on its own with ``weight[c]`` (width W, 4 for Qwen3.5/3.6), causally: the
  output at a token is ``bias[c] + sum_j weight[c, j] * window[j]`` where the window holds the W - 1 inputs
  before the token and the token itself, oldest first; then SiLU when ``activation`` is "silu"/"swish"/True;
* a request's conv state (``conv_states[slot]``, ``[channels, W - 1]``) holds its last W - 1 inputs, oldest
  first; the inputs before a request's first token are that state when it has one (``has_initial_state``), else
  zeros; after the call the state holds the last W - 1 inputs seen (state included when the call saw fewer);
* a slot of ``pad_slot_id`` (-1) marks a padding row: not computed, no state touched.

``causal_conv1d_update_cpu`` with ``intermediate_conv_window`` is the speculative verify step: ``x`` is
``[batch, channels, draft_tokens]``, the state rolls by all draft tokens (SGLang then restores the window after
the accepted token from the intermediate buffer), and ``intermediate_conv_window[intermediate_state_indices[i],
t]`` receives the W - 1 inputs ending at draft token t. With a draft tree (``retrieve_next_token`` /
``retrieve_next_sibling``, topk > 1) a token's window runs through its ancestors instead of the tokens before
it, and ``retrieve_parent_token`` receives each token's parent (as the Triton kernel's fused output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1


def _activate(values: torch.Tensor, activation: bool | str | None) -> torch.Tensor:
    if activation is True or activation in ("silu", "swish"):
        return F.silu(values)
    if activation in (None, False):
        return values
    raise ValueError(f"causal conv1d: activation {activation!r} (silu, swish, True or None)")


def _convolve(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``window`` [channels, T + W - 1] (W - 1 history columns first) -> [channels, T] float32, before activation."""
    width = weight.shape[1]
    out = F.conv1d(window.float().unsqueeze(0), weight.float().unsqueeze(1), groups=weight.shape[0]).squeeze(
        0
    )
    if out.shape[1] != window.shape[1] - width + 1:
        raise AssertionError("conv1d produced an unexpected length")
    if bias is not None:
        out = out + bias.float().view(-1, 1)
    return out


def causal_conv1d_fn_cpu(
    mixed_qkv_transposed: torch.Tensor,
    conv_weights: torch.Tensor,
    bias: torch.Tensor | None,
    activation: bool | str | None,
    conv_states: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    cache_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: list[int] | None = None,
    **_: object,
) -> torch.Tensor:
    """Prefill: ``mixed_qkv_transposed`` is ``[channels, tokens]``, requests one after another
    (``query_start_loc``); returns ``[channels, tokens]`` and leaves each request's last inputs in its state."""
    x = mixed_qkv_transposed
    width = conv_weights.shape[1]
    history = width - 1
    out = torch.zeros_like(x)
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist()
    initial = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    for i, slot in enumerate(slots):
        if slot == PAD_SLOT_ID:
            continue
        begin, end = starts[i], starts[i + 1]
        tokens = x[:, begin:end]
        state = conv_states[slot]
        before = state[:, :history].to(x.dtype) if initial[i] else x.new_zeros(x.shape[0], history)
        window = torch.cat([before, tokens], dim=1)
        out[:, begin:end] = _activate(_convolve(window, conv_weights, bias), activation).to(x.dtype)
        state[:, :history] = window[:, -history:].to(state.dtype)
    return out


def _ancestors(count: int, next_token: torch.Tensor | None, next_sibling: torch.Tensor | None) -> list[int]:
    """Each draft token's parent within the draft (-1: the token before the draft), from EAGLE's first-child /
    next-sibling links; a chain (no links) is token t - 1."""
    if next_token is None:
        return list(range(-1, count - 1))
    parent = [-1] * count
    children, siblings = next_token.tolist(), next_sibling.tolist()
    for token in range(count):
        child = children[token]
        if child != -1:
            parent[child] = token
        sibling = siblings[token]
        if sibling != -1:
            parent[sibling] = parent[token]
    return parent


def causal_conv1d_update_cpu(
    mixed_qkv: torch.Tensor,
    conv_states: torch.Tensor,
    conv_weights: torch.Tensor,
    bias: torch.Tensor | None,
    activation: bool | str | None,
    conv_state_indices: torch.Tensor,
    intermediate_conv_window: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    retrieve_next_token: torch.Tensor | None = None,
    retrieve_next_sibling: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    **_: object,
) -> torch.Tensor:
    """Decode (``[batch, channels]``, one token each) or verify (``[batch, channels, draft_tokens]``): returns the
    same shape, rolls each request's state by its tokens, and in verify stores every token's window."""
    single = mixed_qkv.dim() == 2
    x = mixed_qkv.unsqueeze(-1) if single else mixed_qkv
    width = conv_weights.shape[1]
    history = width - 1
    count = x.shape[2]
    out = torch.zeros_like(x)
    slots = conv_state_indices.tolist()
    windows_at = intermediate_state_indices.tolist() if intermediate_state_indices is not None else None
    for i, slot in enumerate(slots):
        if slot == PAD_SLOT_ID:
            continue
        state = conv_states[slot]
        before = state[:, :history].to(x.dtype)
        tokens = x[i]
        links = (
            (retrieve_next_token[i], retrieve_next_sibling[i])
            if retrieve_next_token is not None
            else (None, None)
        )
        parent = _ancestors(count, *links)
        if retrieve_parent_token is not None:
            retrieve_parent_token[i, :count] = torch.tensor(parent, dtype=retrieve_parent_token.dtype)
        for t in range(count):
            column, lineage = t, []
            while (
                len(lineage) < width and column >= 0
            ):  # the token, its parent, grandparent, ... in the draft
                lineage.append(tokens[:, column])
                column = parent[column]
            lineage.reverse()
            window = torch.cat(
                [before[:, len(lineage) - 1 :], torch.stack(lineage, dim=1)], dim=1
            )  # [channels, W]
            out[i, :, t] = _activate(_convolve(window, conv_weights, bias), activation)[:, 0].to(x.dtype)
            if intermediate_conv_window is not None and windows_at[i] >= 0:
                intermediate_conv_window[windows_at[i], t, :, :history] = window[:, 1:].to(
                    intermediate_conv_window.dtype
                )
        rolled = torch.cat([before, tokens], dim=1)[:, -history:]
        state[:, :history] = rolled.to(state.dtype)
    return out.squeeze(-1) if single else out
