"""The one way draftgen writes a whole file: under a temporary name beside it, fsynced, renamed over the old file,
then the folder fsynced, so that a crash (even SIGKILL or a power cut) leaves the old file or the whole new one.

The temporary name is always ``.NAME.tmp`` in the same folder (``temporary_path``): a write interrupted before
its rename leaves at most one leftover per file name, the next write of that name starts by truncating it, and
``remove_leftovers`` (run when a run folder is opened under its lease) clears them by that one pattern.

A full disk (ENOSPC or EDQUOT, however it is reported) while writing removes the temporary file at once (its space
is needed for what is written next) and raises ``DiskFull`` naming the file, with no chained traceback. Any other
failure propagates as it is and leaves the temporary file for the clean-up.

Bytes, text, JSON and parquet have helpers; anything else passes ``replace_file`` a function that writes the
temporary path it is given (polars' ``sink_parquet``, matplotlib's ``savefig``, a tokenizer's ``save``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.rundir.disk import DiskFull, is_disk_full

if TYPE_CHECKING:  # polars is not imported to write bytes: draftgen status stays on the standard library
    import polars as pl

TEMPORARY_GLOB = ".*.tmp"
# Also removed as leftovers: the temporary names older draftgen versions used (.NAME.tmp-PID, NAME.json.partial).
LEFTOVER_GLOBS = (TEMPORARY_GLOB, ".*.tmp-*", "*.json.partial")


def temporary_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp")


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(".tmp")


def replace_file(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Write ``path`` atomically: ``write(temporary)``, fsync, rename over ``path``, fsync the folder.

    The folder must exist. Raises ``DiskFull`` on a full disk (the temporary file removed); other errors propagate.
    """
    path = Path(path)
    temporary = temporary_path(path)
    try:
        write(temporary)
        fsync_path(temporary)
        os.replace(temporary, path)
    except BaseException as exc:
        if not is_disk_full(exc):
            raise
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        if isinstance(exc, DiskFull):
            raise
        raise DiskFull(path, exc) from None
    fsync_path(path.parent)
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            handle.write(data)

    return replace_file(path, write)


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any, *, end: str = "", **dumps: Any) -> Path:
    """``json.dumps(data, **dumps) + end``, atomically."""
    return write_text(path, json.dumps(data, **dumps) + end)


def write_parquet(path: str | Path, frame: pl.DataFrame, **options: Any) -> Path:
    """``frame.write_parquet`` (with polars' ``options``), atomically."""
    return replace_file(path, lambda temporary: frame.write_parquet(temporary, **options))


def overwrite_in_place(path: str | Path, data: bytes, *, may_grow: bool = False) -> bool:
    """The fallback when a full disk leaves no room for a temporary file: rewrite ``path`` in its own blocks.

    Without ``may_grow`` only when ``data`` is no longer than the file (nothing to allocate, so nothing can fail
    half-way); with it, also when longer (a reader may then see a torn file and must read again). False when the
    file is absent, too short, or the write failed."""
    path = Path(path)
    try:
        if not path.exists() or (not may_grow and len(data) > path.stat().st_size):
            return False
        with open(path, "r+b") as handle:
            handle.write(data)
            handle.truncate()
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        return False
    return True


def remove_leftovers(folders: Iterable[Path]) -> list[Path]:
    """Delete the temporary files that writes interrupted before their rename left in ``folders``.

    Only for a folder this process holds the lease of: another writer's temporary file is its write in progress.
    """
    removed = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and any(fnmatch(entry.name, p) for p in LEFTOVER_GLOBS):
                leftover = Path(entry.path)
                leftover.unlink(missing_ok=True)
                removed.append(leftover)
    return removed


def fsync_path(path: Path) -> None:
    """fsync a file (its data) or a folder (the renames in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
