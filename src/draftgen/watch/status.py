"""What ``draftgen status RUN_DIR`` says: a verdict (is the run alive, finished, stopped, gone?) and a table.

The verdict comes from progress.json: its ``state``, and for a run that says ``running`` the heartbeat's age
and, on the writer's own host, whether its pid is still that process. A folder without progress.json (a run
made before draftgen wrote one) is judged from manifest.json and the pid in its ``.lock`` file. Standard library
only, so the command answers in a fraction of a second even beside a million-row run.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgen.display.humanize import duration
from draftgen.rundir.layout import LOCK, MANIFEST
from draftgen.watch.progress_file import process_start_ticks, read_progress, stale_after_s

# Exit codes of ``draftgen status`` (documented in docs/generate.md).
RUNNING = 0  # the writer is alive and its heartbeat fresh
FINISHED = 1  # the run finished (every prompt done or failed)
USAGE = 2  # not a run folder (the CLI's usual error code)
STOPPED = 3  # the run stopped early and said so: interrupted, halted (guard, servers down, disk full), failed
GONE = 4  # the run says running but its process is gone (killed, crashed, machine down)
NOT_RESPONDING = 5  # the process is alive but its heartbeat is stale (hung event loop, stopped with SIGSTOP)


@dataclass(frozen=True)
class Verdict:
    code: int
    word: str  # RUNNING, FINISHED, INTERRUPTED, HALTED, FAILED, GONE, NOT RESPONDING
    sentence: str


def pid_state(pid: int, start_ticks: int | None) -> bool | None:
    """On this host: True if ``pid`` is alive (and, when ``start_ticks`` is known, is the same process), False if
    not, None if that cannot be told."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return None
    if start_ticks is not None:
        now_ticks = process_start_ticks(pid)
        if now_ticks is not None and now_ticks != start_ticks:
            return False  # the pid was reused by another process
    return True


def judge(
    progress: dict[str, Any],
    *,
    now: float | None = None,
    host: str | None = None,
    alive: Callable[[int, int | None], bool | None] = pid_state,
) -> Verdict:
    """The verdict on one progress.json."""
    now = time.time() if now is None else now
    host = socket.gethostname() if host is None else host
    state = progress.get("state", "running")
    detail = progress.get("detail") or ""
    age = now - float(progress.get("heartbeat_at", 0.0))
    if state == "finished":
        return Verdict(FINISHED, "FINISHED", f"finished {_ago(age)}" + (f": {detail}" if detail else ""))
    if state in ("interrupted", "halted", "failed"):
        said = f"{state} {_ago(age)}" + (f": {detail}" if detail else "")
        return Verdict(STOPPED, state.upper(), said + " — finished shards are kept; --resume continues")
    pid = int(progress.get("pid", 0))
    where = str(progress.get("host", "?"))
    limit = float(progress.get("stale_after_s") or stale_after_s(float(progress.get("interval_s", 5.0))))
    process = alive(pid, progress.get("pid_start")) if where == host and pid > 0 else None
    if process is False:
        return Verdict(
            GONE,
            "GONE",
            f"the run is not running: process {pid} on {where} is gone (killed or crashed) and the last "
            f"heartbeat was {_ago(age)}; finished shards are kept, --resume continues",
        )
    if age <= limit:
        return Verdict(RUNNING, "RUNNING", f"running: heartbeat {_ago(age)} (pid {pid} on {where})")
    if process is True:
        return Verdict(
            NOT_RESPONDING,
            "NOT RESPONDING",
            f"process {pid} on {where} is alive but its last heartbeat was {_ago(age)} (expected every "
            f"{float(progress.get('interval_s', 0)):g} s): it may be hung or stopped",
        )
    return Verdict(
        GONE,
        "GONE",
        f"heartbeat stale: last written {_ago(age)} (expected every {float(progress.get('interval_s', 0)):g} s) "
        f"by pid {pid} on {where}; the process is presumed gone (from {host} its pid cannot be checked)",
    )


def _ago(seconds: float) -> str:
    return "just now" if seconds < 1 else f"{duration(seconds, digits=0 if seconds < 120 else 1)} ago"


def _fmt(value: float | None, spec: str = ",.0f", empty: str = "—") -> str:
    return empty if value is None else format(value, spec)


def _at(epoch: float) -> str:
    return time.strftime("%a %H:%M %Z", time.localtime(epoch))


def _clock(progress: dict[str, Any], run_dir: Path) -> tuple[float, str | None]:
    """(factor, label) of the servers' clock, as every report states it: progress.json's, else the manifest's
    (runs written before progress.json carried it), times the share of it the simulator kept once a session has
    recorded it; (1.0, None) on real servers."""
    clock = progress.get("clock")
    manifest: dict[str, Any] = {}
    if not isinstance(clock, dict) or not clock or progress.get("ended_at"):
        try:
            manifest = json.loads((run_dir / MANIFEST).read_text())
        except (OSError, ValueError):
            manifest = {}
        if not isinstance(clock, dict) or not clock:
            clock = manifest.get("clock")
    if not isinstance(clock, dict):
        return 1.0, None
    factor = clock.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        return 1.0, None
    # A finished session recorded the share of its clock the simulator kept: the reports state its time with it.
    sessions = manifest.get("sessions") or []
    kept = sessions[-1].get("clock_kept") if sessions and isinstance(sessions[-1], dict) else None
    label = f"simulated {clock.get('hardware')} clock, sim ×{factor:g}" if clock.get("hardware") else None
    if isinstance(kept, (int, float)) and 0 < kept <= 1:
        factor *= kept
        label = f"{label}, {kept:.0%} of it kept" if label else None
    return float(factor), label


def format_progress(run_dir: Path, progress: dict[str, Any], verdict: Verdict, *, now: float) -> str:
    """The table: counts, rates, ETA, guard, servers, last events."""
    lines = [f"run       {run_dir}", f"state     {verdict.word} — {verdict.sentence}"]
    conv = progress.get("conversations", {})
    total, done, failed = conv.get("total", 0), conv.get("done", 0), conv.get("failed", 0)
    share = f" ({done / total:.1%})" if total else ""
    lines.append(
        f"done      {done:,} / {total:,} conversations{share}; this session {conv.get('session_done', 0):,}, "
        f"failed {failed:,}"
    )
    turns = progress.get("turns")
    if turns:
        done_turns, total_turns = turns.get("done"), turns.get("total")
        text = f"{turns.get('session_done', 0):,} assistant turns answered this session"
        if done_turns is not None and total_turns:
            text = f"{done_turns:,} / {total_turns:,} assistant turns; " + text.replace(
                " assistant turns", ""
            )
        lines.append(f"turns     {text}")
    rate = progress.get("rate", {})
    factor, hardware = _clock(progress, run_dir)
    on = f" ({hardware})" if hardware else ""
    window = (rate.get("window_s") or 0.0) * factor
    per_s, tok_s = rate.get("conversations_per_s"), rate.get("tok_s")
    lines.append(
        f"rate      {_fmt(per_s / factor if per_s is not None else None, ',.2f')} conversations/s, "
        f"{_fmt(tok_s / factor if tok_s is not None else None)} completion tok/s over the last "
        f"{duration(window)}{on}"
    )
    trained = progress.get("trained_tokens")
    if trained is not None:
        servers_n = max(1, len(progress.get("servers", [])))
        until = progress.get("ended_at") or progress.get("heartbeat_at") or now
        gpu_s = max(0.0, until - float(progress.get("session_started_at") or until)) * factor * servers_n
        per_m = f"{gpu_s / trained * 1e6:,.0f}" if trained else "—"
        lines.append(
            f"trained   {trained:,} trained tokens this session (each turn's up to the trainer's max_length); "
            f"{per_m} GPU-seconds per million trained tokens{on}"
        )
    if verdict.code == RUNNING:
        eta = progress.get("eta_s")
        eta_text = "unknown (no completions in the window yet)"
        if eta is not None:
            eta_text = f"{duration(eta)} (at {_at(now + eta)}) at the current rate (wall clock)"
        lines.append(f"ETA       {eta_text}")
    guard = progress.get("guard", {})
    rates, limits = guard.get("window_rates", {}), guard.get("max_rates", {})
    if rates:
        parts = [
            f"{name.replace('_', ' ')} {value:.1%}"
            + (f" (halts > {limits[name]:.0%})" if name in limits else "")
            for name, value in rates.items()
        ]
        lines.append("guard     " + " · ".join(parts) + f"  [{guard.get('seen', 0):,} results seen]")
    if progress.get("retrying"):
        lines.append(f"retrying  {progress['retrying']:,} requests waiting out a backoff")
    servers = progress.get("servers", [])
    if servers:
        header = (
            "server",
            "state",
            "in flight",
            "answered",  # requests answered this session (a multi-turn conversation asks once per turn)
            "tok/s",
            "accept (window)",
            "accept (session)",
            "errors",
        )
        rows = [header]
        for server in servers:
            rows.append(
                (
                    server.get("label", server.get("url", "?")),
                    "up" if server.get("up") else "DOWN",
                    f"{server.get('in_flight', 0):,}",
                    f"{server.get('completed', 0):,}",
                    _fmt(server["tok_s"] / factor if server.get("tok_s") is not None else None),
                    _fmt(server.get("mean_accept_window"), ".2f"),
                    _fmt(server.get("mean_accept"), ".2f"),
                    f"{server.get('errors', 0):,}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines.append("")
        for row in rows:
            lines.append(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )
    events = progress.get("events", [])
    if events:
        lines.append("")
        lines.append("last events")
        for event in events[-10:]:
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(event.get("at", 0)))
            lines.append(f"  {stamp}  {event.get('server', '')}: {event.get('what', '')}")
    return "\n".join(lines)


def _lock_pid(run_dir: Path) -> int | None:
    try:
        text = (run_dir / LOCK).read_text().strip()
    except OSError:
        return None
    word, _, number = text.partition(" ")
    return int(number) if word == "pid" and number.isdigit() else None


def manifest_status(run_dir: Path, *, now: float) -> tuple[Verdict, str]:
    """For a run folder without progress.json: the manifest's status and counts, and the lock file's pid."""
    path = run_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{run_dir} holds neither progress.json nor manifest.json: not a generate run folder"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    status = str(manifest.get("status", "unknown"))
    counts = manifest.get("counts", {})
    prompts = manifest.get("prompts", {})
    age = now - float(manifest.get("updated_at", now))
    if status in ("complete", "complete_with_failures"):
        verdict = Verdict(FINISHED, "FINISHED", f"manifest says {status.replace('_', ' ')} ({_ago(age)})")
    elif status in ("interrupted", "halted", "failed"):
        verdict = Verdict(
            STOPPED, status.upper(), f"manifest says {status} ({_ago(age)}); --resume continues"
        )
    else:
        pid = _lock_pid(run_dir)
        alive = pid_state(pid, None) if pid else None
        if alive:
            verdict = Verdict(RUNNING, "RUNNING", f"manifest says running; pid {pid} (from .lock) is alive")
        else:
            verdict = Verdict(
                GONE,
                "GONE",
                f"manifest says running but was last updated {_ago(age)} and "
                + (f"pid {pid} (from .lock) is gone" if pid else "no writer pid is recorded")
                + ": presumed killed; --resume continues",
            )
    lines = [
        f"run       {run_dir}",
        f"state     {verdict.word} — {verdict.sentence}",
        "note      no progress.json (a run from before draftgen wrote one): figures from manifest.json, "
        "updated at each shard",
        f"done      {counts.get('done', 0):,} / {prompts.get('valid', 0):,} prompts; failed "
        f"{counts.get('failed', 0):,}, rejected {counts.get('rejected', 0):,}",
        f"shards    {len(manifest.get('shards', [])):,}",
    ]
    return verdict, "\n".join(lines)


def run_status(run_dir: str | Path, *, now: float | None = None) -> tuple[Verdict, str]:
    """(verdict, table) for a generate run folder."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    progress = read_progress(run_dir)
    if progress is None:
        return manifest_status(run_dir, now=now)
    verdict = judge(progress, now=now)
    return verdict, format_progress(run_dir, progress, verdict, now=now)
