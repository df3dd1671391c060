"""The lease on a run folder: the one process allowed to write it, from the moment it opens the folder to the end.

A lease is an exclusive ``flock`` on ``FOLDER/.lock`` (which records the holder's pid), held from ``acquire`` to
``release``; taking it also creates the folder and clears what interrupted writes left anywhere under it
(``clear_leftovers``: safe only because no one else is writing). generate's preflight takes it and hands it to the
run, so nothing can slip in between the checks and the writing; every step's ``run(config)`` takes it for a moment
when it opens its folder (``run_folder.open_run``), and ``draftgen run`` before a kernel starts, so every step's
folder is cleared when it is opened. A second lease on the same folder is
refused, by another process or by this one, with the holder's pid.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from draftgen.exit_codes import Refused
from draftgen.rundir.layout import LOCK
from draftgen.rundir.publish import recover_publishes_in
from draftgen.rundir.write import remove_leftovers


class RunFolderError(RuntimeError):
    """A run folder cannot be used as asked; the message names the file or folder and what to do."""


class RunFolderBusy(RunFolderError, Refused):
    """Another lease holds the folder (exit code REFUSED: wait for it, or stop it)."""


class RunFolderLease:
    """An exclusive hold on ``folder``; a context manager (released on exit)."""

    def __init__(self, folder: Path, handle: IO[str]):
        self.folder = folder
        self._handle: IO[str] | None = handle

    @classmethod
    def acquire(
        cls,
        folder: str | Path,
        *,
        subfolders: Iterable[str] = (),
        advice: str = "choose another folder",
        held_here: str = "",
    ) -> RunFolderLease:
        """Create ``folder`` (and ``subfolders`` in it), lock it, and clear what interrupted writes left under it
        (``clear_leftovers``).

        Raises ``RunFolderBusy`` when another lease holds it: its message names the holder's pid (with
        ``held_here``, what in this process may hold a lease, when the holder is this very process) and ends with
        ``advice``."""
        folder = Path(folder)
        inner = [folder / name for name in subfolders]
        try:
            for path in (folder, *inner):
                path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunFolderError(f"cannot create the run folder {folder}: {exc.strerror or exc}") from exc
        handle = open(folder / LOCK, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            same = f" — this process: {held_here}" if held_here and owner == f"pid {os.getpid()}" else ""
            raise RunFolderBusy(
                f"another process ({owner}{same}) is writing to {folder}; wait for it, stop it, or {advice}"
            ) from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}")
            handle.flush()
            clear_leftovers(folder)
        except BaseException:
            handle.close()
            raise
        return cls(folder, handle)

    @classmethod
    def acquire_existing(cls, folder: str | Path) -> RunFolderLease | None:
        """The lease of a folder that has one already, taken without writing anything (on a full disk: nothing to
        allocate, so nothing to fail); None when there is no lock file or another lease holds it. No clean-up."""
        try:
            handle = open(Path(folder) / LOCK)
        except OSError:
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        return cls(Path(folder), handle)

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Let go of the folder (idempotent)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> RunFolderLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def own_folders(folder: Path) -> Iterator[Path]:
    """``folder`` and every folder under it, except another run folder (one holding its own lock file) and what is
    under that: its writes are its own lease's to clear."""
    yield folder
    for parent, folders, _ in os.walk(folder):
        kept = [name for name in folders if not (Path(parent) / name / LOCK).exists()]
        folders[:] = kept
        yield from (Path(parent) / name for name in kept)


def clear_leftovers(folder: Path) -> list[Path]:
    """What interrupted writes left under ``folder``, cleared: temporary files (``write.remove_leftovers``) and a
    folder publish cut short (``publish.recover_published``: the old folder put back, or its remains removed).
    Only under a lease on ``folder``. Returns the temporary files removed and the folders recovered."""
    cleared = []
    for directory in own_folders(Path(folder)):
        cleared += remove_leftovers([directory]) + recover_publishes_in(directory)
    return cleared
