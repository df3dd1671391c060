"""The one way draftgen publishes a whole folder: a staged folder, fsynced file by file, takes the place of the
final one so that at every instant the final name holds a whole folder, the old one or the new one.

``write.replace_file`` does this for one file; a folder written over many batches (validate's export) is staged
under a name of its own (its files written whole, or in parts through ``StreamedFile``), then published here. Where the kernel and filesystem offer it (Linux 3.15+: ext4, xfs,
btrfs, tmpfs, overlayfs) the two folders are swapped by one ``renameat2(RENAME_EXCHANGE)``, atomic like a file's
rename. Elsewhere (another OS, NFS) the old folder is renamed aside to ``.NAME.previous`` and the new one renamed in:
for the moment between the two renames only ``.NAME.previous`` holds a whole folder, and ``recover_published``
(run before each publish and whenever a run folder is opened under its lease) renames it back. Either way the old
folder is then moved to ``.NAME.previous`` and removed.

A symlink swap was not chosen: copying a run folder (``cp -r``, rsync without ``-L``, an upload) would copy the link,
not the data, and an existing folder cannot be replaced by a link atomically.

A full disk (ENOSPC/EDQUOT) while fsyncing or renaming is raised as ``DiskFull``, the old folder left in place.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from draftgen.rundir.disk import DiskFull, is_disk_full
from draftgen.rundir.write import fsync_path

AT_FDCWD = -100
RENAME_EXCHANGE = 2
# What renameat2 answers where the exchange is not offered: no such call, or not on this filesystem.
NO_EXCHANGE = frozenset({errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})
PREVIOUS_SUFFIX = ".previous"
T = TypeVar("T")


def previous_path(final: Path) -> Path:
    """Where the old folder waits while it is swapped out and removed: ``.NAME.previous`` beside it."""
    return final.with_name(f".{final.name}{PREVIOUS_SUFFIX}")


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder``, deepest first, then ``folder`` itself: written through open
    handles or not, its contents are on disk before it is published."""
    for parent, _, files in os.walk(folder, topdown=False):
        for name in sorted(files):
            fsync_path(Path(parent) / name)
        fsync_path(Path(parent))


def exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths atomically (``renameat2(RENAME_EXCHANGE)``); False where this system cannot."""
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:
        return False
    if rename(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(second))


def recover_published(final: Path) -> bool:
    """Finish a publish of ``final`` that was interrupted: put ``.NAME.previous`` back when ``final`` is missing
    (the moment between the fallback's two renames), else remove it. True when anything was done."""
    previous = previous_path(final)
    if not previous.is_dir():
        return False
    if final.exists():
        shutil.rmtree(previous)
    else:
        os.rename(previous, final)
        fsync_path(final.parent)
    return True


def recover_publishes_in(folder: Path) -> list[Path]:
    """``recover_published`` for every folder a publish in ``folder`` was interrupted on; the ones recovered."""
    recovered = []
    for entry in list(os.scandir(folder)):
        name = entry.name
        if name.startswith(".") and name.endswith(PREVIOUS_SUFFIX) and entry.is_dir(follow_symlinks=False):
            final = Path(folder) / name[1:].removesuffix(PREVIOUS_SUFFIX)
            if recover_published(final):
                recovered.append(final)
    return recovered


def publish_folder(staged: str | Path, final: str | Path) -> Path:
    """Make the whole folder ``staged`` be ``final``, replacing an older ``final``; ``staged`` is gone after.

    Raises ``DiskFull`` on a full disk (the old ``final`` still whole); other errors propagate."""
    staged, final = Path(staged), Path(final)
    previous = previous_path(final)
    try:
        recover_published(final)
        fsync_tree(staged)
        if not final.exists():
            os.rename(staged, final)
            fsync_path(final.parent)
            return final
        if exchange(staged, final):
            fsync_path(final.parent)
            os.rename(staged, previous)  # the old folder, now under the staged name
        else:
            os.rename(final, previous)
            fsync_path(final.parent)
            os.rename(staged, final)
        fsync_path(final.parent)
    except OSError as exc:
        if is_disk_full(exc) and not isinstance(exc, DiskFull):
            raise DiskFull(final, exc) from None
        raise
    shutil.rmtree(previous)
    return final


class StreamedFile:
    """A text file of a staged folder written in parts through one handle (a whole file is ``replace_file``'s):
    a full disk while writing or closing it is raised as ``DiskFull`` naming it, and closing it fsyncs it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._handle = self._guarded(lambda: open(self.path, "w", encoding="utf-8"))

    def write(self, text: str) -> None:
        self._guarded(lambda: self._handle.write(text))

    def close(self) -> None:
        if self._handle.closed:
            return

        def finish() -> None:
            try:
                self._handle.flush()
                os.fsync(self._handle.fileno())
            finally:
                self._handle.close()

        self._guarded(finish)

    def _guarded(self, step: Callable[[], T]) -> T:
        try:
            return step()
        except OSError as exc:
            if is_disk_full(exc) and not isinstance(exc, DiskFull):
                raise DiskFull(self.path, exc) from None
            raise
