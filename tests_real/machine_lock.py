"""One real-server tier at a time on a machine: a second one beside it waits instead of running out of memory.

The SGLang tier keeps up to six real SGLang servers up at once (each a tokenizer process, a scheduler and a
detokenizer, ~2.5 GiB together); measured alone it takes 11-16 GiB of the machine's memory for most of its run. The
vLLM tier's engine alone holds ~3.5 GiB, beside transformers serve and its own client. Two such tiers side by side on
a 24 GiB machine (two clones' CI runs, or a session's check beside CI), with a main suite's first pass beside them,
need more than that, and the kernel's OOM killer then SIGKILLs a server of either one mid-run. So each tier takes an
exclusive lock on a machine-wide file before it starts anything, and waits, saying for whom, while another holds it.
The lock is the kernel's (``flock``): it goes with the process that holds it, however that process ends. A waiter
polls every 0.2 s: a tier run in a loop needs seconds (make, ruff, pytest's start) to ask again, so a waiting tier
takes the lock before the looping one is back, and cannot be starved by it.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

MACHINE_LOCK = Path(
    "/tmp/draftgen-real-server-tier.lock"
)  # /tmp: every clone on this machine sees the same file
WAIT_LIMIT_S = 40 * 60.0  # a whole tier under load takes ~10 min: this is a hung holder, not a slow one
POLL_S = 0.2  # well under the seconds a looping tier needs to ask again


class TierLockTimeout(RuntimeError):
    """Another real-server tier held the machine's lock for longer than any tier runs."""


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "unknown"
    return text or "unknown"


def hold_machine_lock(
    path: Path = MACHINE_LOCK,
    *,
    wait_limit_s: float = WAIT_LIMIT_S,
    poll_s: float = POLL_S,
    say: Callable[[str], None] = print,
) -> int:
    """Take the machine's tier lock and return its open descriptor (closing it, or exiting, lets it go).

    Waits while another process holds it, saying once who that is and once how long it waited."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    started = time.monotonic()
    waiting = False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            waited = time.monotonic() - started
            if waited >= wait_limit_s:
                holder = _holder(path)
                os.close(descriptor)
                raise TierLockTimeout(
                    f"another real-server tier ({holder}) has held {path} for over {wait_limit_s / 60:.0f} min: "
                    "two tiers do not fit in this machine's memory: end that run, then start this one again"
                ) from None
            if not waiting:
                say(
                    f"waiting for another real-server tier (SGLang or vLLM) on this machine ({_holder(path)}) to end: "
                    f"two need more memory than this machine's {_memory_gib():.0f} GiB ({path})"
                )
                waiting = True
            time.sleep(poll_s)
    if waiting:
        say(
            f"the other real-server tier ended: this one starts after {time.monotonic() - started:.0f} s of waiting"
        )
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"pid {os.getpid()}, cwd {os.getcwd()}".encode(), 0)
    return descriptor


def hold_for_test_session(session: pytest.Session) -> None:
    """Both real-server tiers' ``pytest_sessionstart``: before any server starts, and outside any test's time limit
    (the wait is not a test's). The descriptor is a bare int, never closed until the process exits."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else (lambda line: print(line, file=sys.stderr))
    hold_machine_lock(say=say)
