"""CPU paths for the SGLang 0.5.23 kernels the ``qwen3_5`` hybrid's MTP path reaches and SGLang has only for GPUs.

Not ``sgl_kernel`` ops (those are the stand-in's, ``sgl_kernel/``): these are SGLang's own Triton kernels in
``sglang/kernels``, whose Python wrappers refuse CPU tensors or ask CUDA for device properties, so stock SGLang
0.5.23 cannot serve a Gated DeltaNet hybrid with NEXTN on any CPU:

* ``sglang/kernels/ops/mamba/mamba_state_scatter_triton.py``: after each speculative verify,
  ``scatter_mamba_states_after_mtp_verify`` (called by ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``
  from ``commit_mamba_states_after_verify`` in ``srt/speculative/spec_utils.py``) copies the accepted step's
  recurrent state and conv window into the request's slot with ``fused_mamba_state_scatter_with_mask`` and
  ``fused_conv_window_scatter_with_mask`` / ``_multi``, which raise "only supports CUDA/XPU tensors";
* ``sglang/kernels/ops/attention/fla/layernorm_gated.py``: ``RMSNormGated`` (the GDN output norm) runs the CPU op
  ``fused_rmsnorm_gated_cpu`` only when the CPU has AMX, else a Triton kernel that needs CUDA.

``support/sitecustomize.py`` installs these (``REPLACEMENTS``) in the server's processes as each module is
imported; the arithmetic is the wrappers' docstrings restated in torch, and ``tests_sglang/test_ops_mamba_state.py``
checks it. Everything around them (when to commit, which step, which slot) stays SGLang's.
"""

from __future__ import annotations

import torch


def scatter_accepted_steps(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: torch.Tensor | None = None,
) -> None:
    """``dst[:, dst_indices[i]] = src[:, src_rows[i], steps[i]]`` for every i whose step is >= 0 (a negative step:
    nothing accepted to commit); ``src_rows`` defaults to 0, 1, 2, ...; out-of-range rows are skipped, as the
    kernels' bounds checks skip them. ``dst`` ``[layers, slots, *state]``, ``src`` ``[layers, rows, steps,
    *state]`` (any strides: the conv windows' source is an overlapping view)."""
    steps = step_indices_raw.tolist()
    if not steps:
        return
    if dst.shape[0] != src.shape[0] or dst.shape[2:] != src.shape[3:]:
        raise ValueError(f"state shapes differ: dst {tuple(dst.shape)}, src {tuple(src.shape)}")
    targets = dst_indices_raw.tolist()
    rows = src_indices_raw.tolist() if src_indices_raw is not None else list(range(len(steps)))
    if not len(targets) == len(rows) == len(steps):
        raise ValueError(f"index lengths differ: {len(targets)}, {len(rows)}, {len(steps)}")
    for target, row, step in zip(targets, rows, steps, strict=True):
        if (
            step < 0
            or not (0 <= target < dst.shape[1])
            or not (0 <= row < src.shape[1])
            or step >= src.shape[2]
        ):
            continue
        dst[:, target] = src[:, row, step].to(dst.dtype)


def scatter_accepted_windows(
    pairs,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    dst_indices2_raw: torch.Tensor | None = None,
    step_indices2_raw: torch.Tensor | None = None,
) -> None:
    """The multi-pair variant: for each ``(conv states, windows)`` pair, the accept commit, then the optional
    second set (the radix cache's track slots)."""
    for dst, src in pairs:
        scatter_accepted_steps(dst, src, dst_indices_raw, step_indices_raw)
        if step_indices2_raw is not None:
            scatter_accepted_steps(dst, src, dst_indices2_raw, step_indices2_raw)


def _use_the_cpu_op(module) -> None:
    module._use_cpu = True


def _scatters_on_cpu(module) -> None:
    module.fused_mamba_state_scatter_with_mask = scatter_accepted_steps
    module.fused_conv_window_scatter_with_mask = scatter_accepted_steps
    module.fused_conv_window_scatter_multi = scatter_accepted_windows


# module -> what to do to it once it has executed (before any other module imports names from it)
REPLACEMENTS = {
    "sglang.kernels.ops.attention.fla.layernorm_gated": _use_the_cpu_op,
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton": _scatters_on_cpu,
}
