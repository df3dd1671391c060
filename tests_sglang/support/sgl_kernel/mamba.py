"""``sgl_kernel.mamba``: the three Gated DeltaNet ops SGLang 0.5.23 imports from this submodule on the CPU."""

from __future__ import annotations

from sgl_kernel._missing import missing_attribute
from sgl_kernel.conv1d import causal_conv1d_fn_cpu, causal_conv1d_update_cpu
from sgl_kernel.gated_delta import chunk_gated_delta_rule_cpu

__all__ = ["causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu"]


def __getattr__(name: str):
    return missing_attribute(__name__, name)
