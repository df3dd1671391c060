"""Start one server process in its own process group with its output in a log file; stop the whole group.

SGLang's launcher forks scheduler and detokenizer processes that hold GPU memory, so stopping the launcher
alone is not enough: every signal goes to the process group, and a group is only considered gone when no
member is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from draftgen.paths import project_root
from draftgen.serve.launch import LaunchSpec, shell_line

_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 64 * 1024


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM if draftgen serve itself is killed (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _open_log(spec: LaunchSpec, log_path: Path) -> BinaryIO:
    """The log, opened for appending, after a line saying which command starts now (restarts append)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # closed by spawn once the child holds it
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    log.write(f"==> draftgen serve {stamp}: {shell_line(spec)}\n".encode())
    log.flush()
    return log


async def spawn(spec: LaunchSpec, log_path: Path) -> asyncio.subprocess.Process:
    """Start ``spec`` in a new session (so its own process group), stdout and stderr appended to ``log_path``, in
    the project root (docs/design.md#paths)."""
    with _open_log(spec, log_path) as log:
        try:
            return await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **dict(spec.env)},
                cwd=project_root(),  # a relative --model or --python means what any relative path does
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise OSError(f"cannot start {spec.label}: {spec.argv[0]}: {exc.strerror or exc}") from None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL whatever is left after ``grace_s``; return when it is empty.

    Also right for a leader that already exited: its children, if any, are still in the group.
    """
    pgid = process.pid  # a new session's leader: pgid == pid
    signal_group(pgid, signal.SIGTERM)
    await _poll(lambda: process.returncode is not None and not group_alive(pgid), grace_s)
    if group_alive(pgid) or process.returncode is None:
        signal_group(pgid, signal.SIGKILL)
    await process.wait()
    # Members the kernel has not finished tearing down: wait briefly so the caller can rely on "gone".
    await _poll(lambda: not group_alive(pgid), 5.0)


async def _poll(done: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """Check ``done`` every ``interval`` for up to ``seconds`` (group membership has no event to await)."""
    for _ in range(max(1, math.ceil(seconds / interval))):
        if done():
            return True
        await asyncio.sleep(interval)
    return done()


def log_tail(path: Path, lines: int, since: int = 0) -> list[str]:
    """The last ``lines`` lines of a log file after byte offset ``since`` (reads only its end)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(since, size - _TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror or exc})"]
    return text.splitlines()[-lines:]
