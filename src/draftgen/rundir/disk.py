"""The filesystem under a run folder: a full disk as one error type, recognised however it is reported, and the
room left on it.

``write.replace_file`` turns every ENOSPC/EDQUOT it meets into ``DiskFull`` (naming the file), so the code that
stops a run catches one type. ``is_disk_full`` recognises a full disk in errors raised elsewhere: polars reports
it as text, the OS as an errno, papermill by the name of the notebook's error.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_TEXT = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
# draftgen's own errors, as a notebook's error names them (papermill's ename)
DISK_FULL_NAMES = ("DiskFull", "DiskFullStop")


class DiskFull(OSError):
    """The filesystem holding ``path`` is full (or the user's quota spent) while writing ``path``.

    An ``OSError`` (ENOSPC), so code that tolerates a failed write keeps tolerating this one; one line in a
    notebook, not a traceback. Finished files are whole: free space and run again.
    """

    def __init__(self, path: Path, cause: BaseException):
        text = str(cause).strip()
        reason = text.splitlines()[0][:200] if text else type(cause).__name__
        self.path = Path(path)
        self.reason = reason  # the system's own words, without the file
        self.message = f"no space left on the filesystem holding {self.path.parent} while writing {self.path.name} ({reason})"
        super().__init__(errno.ENOSPC, self.message, str(self.path))

    def __str__(self) -> str:
        return self.message

    def _render_traceback_(self) -> list[str]:  # IPython/Jupyter: one line, not a traceback
        return [f"{type(self).__name__}: {self}"]


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
