"""A full disk that stopped generate before generate could say so, recorded from outside the kernel.

Papermill could not save the executed notebook and stopped the kernel first; ``draftgen run`` (through the step
registry, ``draftgen.steps``) then marks the run folder as generate would have: the manifest ``disk full`` and
progress.json ``interrupted``, so ``draftgen status`` and ``--resume`` see what happened (docs/generate.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from draftgen.generate.store import record_disk_full
from draftgen.watch.progress_file import set_state


def record_after_kernel(out_dir: Path, executed: Path, detail: str) -> None:
    """Mark ``out_dir`` (still ``running``, its lock free) stopped by a full disk while ``executed`` was saved."""
    if record_disk_full(out_dir, executed, detail):
        with contextlib.suppress(OSError, ValueError):
            set_state(out_dir, "interrupted", f"disk full: {executed}")
