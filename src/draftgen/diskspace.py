"""A full disk, recognised however it is reported, and the room left on a filesystem."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_TEXT = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
# generate's own errors, as a notebook error names them (papermill's ename)
DISK_FULL_NAMES = ("DiskFull", "DiskFullStop")


def is_disk_full(exc: BaseException | None) -> bool:
    """True if ``exc`` or anything it was raised from is ENOSPC/EDQUOT (polars reports it as text, the OS as errno)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if type(exc).__name__ in DISK_FULL_NAMES or getattr(exc, "ename", None) in DISK_FULL_NAMES:
            return True
        if any(text in str(exc).lower() for text in DISK_FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_bytes(path: str | Path) -> int:
    """Bytes free for this user on the filesystem holding ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")
