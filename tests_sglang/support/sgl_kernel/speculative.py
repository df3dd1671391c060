"""``sgl_kernel.speculative``: the one op NGRAM speculation imports from this submodule."""

from __future__ import annotations

from sgl_kernel._missing import missing_attribute
from sgl_kernel.tree import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]


def __getattr__(name: str):
    return missing_attribute(__name__, name)
