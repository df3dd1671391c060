"""The machine's tier lock (machine_lock.py): a second tier waits for the first, says for whom, and goes
on when the first ends however it ends; a hung holder ends the wait with an error naming it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from machine_lock import TierLockTimeout, hold_machine_lock

HERE = Path(__file__).resolve().parent
HOLDER = (
    "import sys; from pathlib import Path; from machine_lock import hold_machine_lock; "
    "hold_machine_lock(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()"
)


def _holding(path: Path) -> subprocess.Popen[str]:
    """Another tier: a process that holds the lock on ``path`` until its stdin closes."""
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _until(condition, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time limit"
        time.sleep(0.02)


@pytest.mark.parametrize("ending", ["exits", "is SIGKILLed"])
def test_a_second_tier_waits_for_the_first_and_starts_once_it_ends(tmp_path: Path, ending: str) -> None:
    path = tmp_path / "tier.lock"
    holder = _holding(path)
    said: list[str] = []
    taken: list[int] = []
    waiter = threading.Thread(
        target=lambda: taken.append(hold_machine_lock(path, poll_s=0.02, say=said.append))
    )
    waiter.start()
    try:
        _until(lambda: said)
        assert f"pid {holder.pid}" in said[0] and "waiting for another real-server tier" in said[0]
        assert waiter.is_alive() and not taken  # still waiting: the holder has not let go
        if ending == "exits":
            assert holder.stdin is not None
            holder.stdin.close()
        else:
            holder.send_signal(signal.SIGKILL)
        waiter.join(30)
        assert not waiter.is_alive() and len(taken) == 1
        assert said[-1].startswith("the other real-server tier ended")
        assert path.read_text().startswith(f"pid {os.getpid()},")  # the next waiter is told who holds it now
    finally:
        holder.kill()
        holder.wait()
        waiter.join(5)
        for descriptor in taken:
            os.close(descriptor)


def test_a_hung_holder_ends_the_wait_with_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "tier.lock"
    holder = _holding(path)
    try:
        with pytest.raises(TierLockTimeout, match=f"pid {holder.pid}"):
            hold_machine_lock(path, wait_limit_s=0.3, poll_s=0.02, say=lambda line: None)
    finally:
        holder.kill()
        holder.wait()


def test_an_unheld_lock_is_taken_at_once_and_names_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "tier.lock"
    said: list[str] = []
    descriptor = hold_machine_lock(path, say=said.append)
    try:
        assert said == []
        assert path.read_text() == f"pid {os.getpid()}, cwd {os.getcwd()}"
    finally:
        os.close(descriptor)
