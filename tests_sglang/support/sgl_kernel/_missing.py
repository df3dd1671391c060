"""The loud failure for an ``sgl_kernel`` name the stand-in does not provide."""

from __future__ import annotations


class MissingKernelError(NotImplementedError):
    """SGLang asked the stand-in for an op it does not have (write it, with a test, or find why it is reached)."""


def missing_attribute(module: str, name: str):
    """Module ``__getattr__`` body: dunder look-ups stay ordinary AttributeErrors (pickle, inspect, importlib
    probe those); any other name raises MissingKernelError naming ``module.name``."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    raise MissingKernelError(
        f"{module}.{name} is not provided by draftgen's CPU stand-in for sgl_kernel "
        f"(tests_sglang/support/sgl_kernel): SGLang reached an op it does not have"
    )
