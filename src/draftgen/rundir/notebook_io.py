"""Papermill's notebook writes through ``write.replace_file``: the executed notebook is always a whole notebook.

Papermill saves the notebook it executes after every cell, and its own local handler writes with a plain
``open(path, "w")``: a process killed during a save leaves a truncated file, the one the runner reads back for the
headline and report.html. Papermill looks a path's handler up in its I/O registry (``papermill.iorw.papermill_io``);
``register`` adds ``AtomicLocalHandler`` there for absolute paths, which ``draftgen run`` gives it. (Registering it
under papermill's own scheme name "local" would not take effect: ``get_handler`` falls back to the "local" handler
registered first.)

A full disk during a save raises ``DiskFull`` with the old notebook whole (papermill's own handler would have
truncated it first); papermill then stops the kernel, and ``draftgen run`` records the full disk for the step.
"""

from __future__ import annotations

import os
from pathlib import Path

from papermill.iorw import LocalHandler, papermill_io

from draftgen.rundir.write import write_text

SCHEME = os.sep  # the handler answers for every absolute local path


class AtomicLocalHandler(LocalHandler):
    """Papermill's local handler, with writes through ``replace_file`` (reads and listings are papermill's)."""

    def write(self, buf: str, path: str) -> None:
        target = Path(path)
        if not target.parent.is_dir():  # papermill's own handler refuses a missing folder the same way
            raise FileNotFoundError(f"output folder {target.parent} doesn't exist.")
        write_text(target, buf)


def register() -> None:
    """Route papermill's writes of absolute paths through ``AtomicLocalHandler`` (once per process)."""
    if not isinstance(papermill_io.get_handler(SCHEME), AtomicLocalHandler):
        papermill_io.register(SCHEME, AtomicLocalHandler())
