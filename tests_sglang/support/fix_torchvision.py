"""Make ``import torchvision`` work in the SGLang tier's venv (run once after install; safe to run again).

Why: torchvision 0.28.0 is installed with ``--no-deps`` (otherwise pip swaps our CPU torch 2.13.0 for CUDA torch
and 15 ``nvidia-*`` packages). Its compiled ops are built against CUDA torch, so they do not load here, and
``torchvision/_meta_registrations.py`` then fails at import: it registers fake kernels for ``torchvision::nms``
and ``torchvision::qnms`` unconditionally, and those operators do not exist. SGLang imports torchvision (image
processors), so the server would not start.

The fix: guard those two registrations with ``torchvision.extension._has_ops()``, as the file already does for
its other meta kernels (its ``register_meta`` helper). A marker comment makes the script idempotent; it refuses
to touch a file whose shape it does not recognise, so a torchvision upgrade shows up here instead of silently.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MARKER = "# draftgen tests_sglang: fake kernels only when torchvision's C++ ops loaded"
DECORATOR = '@torch.library.register_fake("torchvision::'
GUARDED = '@_draftgen_register_fake_if_ops("torchvision::'
HELPER = f"""

{MARKER}
def _draftgen_register_fake_if_ops(name):
    def wrapper(fn):
        if torchvision.extension._has_ops():
            return torch.library.register_fake(name)(fn)
        return fn

    return wrapper
"""
ANCHOR = "import torchvision.extension  # noqa: F401\n"


def meta_registrations_path() -> Path:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("fix_torchvision: torchvision is not installed in this interpreter")
    return Path(next(iter(spec.submodule_search_locations))) / "_meta_registrations.py"


def patch(text: str) -> str:
    """The fixed file text; unchanged when already fixed. Raises ValueError on an unknown layout."""
    if MARKER in text:
        return text
    if ANCHOR not in text or DECORATOR not in text:
        raise ValueError("unexpected _meta_registrations.py layout (torchvision changed?): not patched")
    text = text.replace(ANCHOR, ANCHOR + HELPER, 1)
    return text.replace(DECORATOR, GUARDED)


def main() -> int:
    path = meta_registrations_path()
    text = path.read_text()
    try:
        fixed = patch(text)
    except ValueError as exc:
        print(f"fix_torchvision: {path}: {exc}", file=sys.stderr)
        return 1
    if fixed == text:
        print(f"fix_torchvision: {path} already fixed")
        return 0
    # a new file renamed over the old: uv installs files as hard links to its cache, which must stay as released
    replacement = path.with_name(path.name + ".fixed")
    replacement.write_text(fixed)
    replacement.replace(path)
    print(f"fix_torchvision: guarded {text.count(DECORATOR)} fake registrations in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
