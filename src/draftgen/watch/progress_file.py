"""The files a running generate writes for watchers: ``progress.json`` and ``progress-history.jsonl``.

``progress.json`` is one JSON object, rewritten every ``status_interval_s`` with ``draftgen.rundir.write``
(temporary name, fsync, rename), so a reader sees the previous version or the new one, never half of one. It says what the run is
doing now (counts, rates, ETA, servers, guard, last events), who writes it (host, pid) and when it last did
(``heartbeat_at``): a heartbeat older than ``stale_after_s`` means the writer is gone.

``progress-history.jsonl`` gains one line per interval, each written with a single ``write`` on a file opened
for appending; a reader skips a last line that has no newline yet (being written) or does not parse. Counters in
a line are cumulative within a session (``session``: the session's start time), so a lost line loses nothing.

``set_state`` is the one entry point for code outside the writer (e.g. a disk-full handler) to record how a run
stopped: ``set_state(out_dir, "interrupted", "disk full: /data/run")``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from draftgen.rundir import DiskFull, overwrite_in_place, write_bytes
from draftgen.rundir.layout import HISTORY, PROGRESS

FORMAT = "draftgen.progress/1"
STATES = ("running", "finished", "interrupted", "halted", "failed")
STALE_FACTOR = 4.0  # a heartbeat older than this many intervals (and STALE_MIN_S) is stale
STALE_MIN_S = 30.0
DETAIL_LIMIT = 2000


class ProgressFileError(ValueError):
    """progress.json exists but cannot be read; the message names the file."""


def stale_after_s(interval_s: float) -> float:
    return max(STALE_MIN_S, STALE_FACTOR * interval_s)


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux ``/proc``), or None if unknown/absent.

    Recorded beside the pid so that a later reader on the same host can tell the writer from an unrelated
    process that reused its pid.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; fields after the command name
    except (IndexError, ValueError):
        return None


def write_progress(out_dir: str | Path, data: dict[str, Any]) -> None:
    """Replace ``out_dir/progress.json`` atomically. When the disk is full the temporary file cannot be written:
    the file is then overwritten in place (a reader retries the rare torn read); ``DiskFull`` if even that fails."""
    path = Path(out_dir) / PROGRESS
    body = json.dumps(data, indent=1).encode()
    try:
        write_bytes(path, body)
    except DiskFull:
        if not overwrite_in_place(path, body, may_grow=True):  # the old file's blocks reused for the new text
            raise


def append_history(out_dir: str | Path, line: dict[str, Any]) -> None:
    """Append one line to progress-history.jsonl with a single write (O_APPEND)."""
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(Path(out_dir) / HISTORY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_progress(out_dir: str | Path, *, attempts: int = 3) -> dict[str, Any] | None:
    """progress.json as a dict, or None when the run folder has none (a run from before it existed)."""
    path = Path(out_dir) / PROGRESS
    error: Exception | None = None
    for attempt in range(attempts):
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # torn by an in-place write: read again
            error = exc
            time.sleep(0.05 * (attempt + 1))
            continue
        if not isinstance(data, dict):
            raise ProgressFileError(f"{path} does not hold a JSON object")
        return data
    raise ProgressFileError(
        f"{path} is not valid JSON ({error}); the running generate rewrites it every few s"
    )


def read_history(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete line of progress-history.jsonl (a last line still being written is skipped)."""
    path = Path(out_dir) / HISTORY
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line still being written
    records = []
    for raw in lines:
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
            record = json.loads(raw)
            if isinstance(record, dict):
                records.append(record)
    return records


def set_state(out_dir: str | Path, state: str, detail: str = "") -> dict[str, Any] | None:
    """Record in progress.json how the run stands (``state`` one of STATES) with a free-text ``detail``, e.g.
    ``set_state(out_dir, "interrupted", "disk full: /data/run")``. The heartbeat is renewed. Returns the new
    contents, or None when the run folder has no progress.json yet (nothing to amend)."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
    data = read_progress(out_dir)
    if data is None:
        return None
    now = time.time()
    data["state"] = state
    data["detail"] = detail[:DETAIL_LIMIT]
    data["heartbeat_at"] = now
    if state != "running":
        data["ended_at"] = now
    write_progress(out_dir, data)
    return data
