"""What ``draftgen status RUN_DIR`` says: a verdict (is the run alive, finished, stopped, gone?) and a table.

The verdict comes from progress.json: its ``state``, and for a run that says ``running`` the heartbeat's age
and, on the writer's own host, whether its pid is still that process. A folder without progress.json (a run
made before draftgen wrote one) is judged from manifest.json and the pid in its ``.lock`` file. The figures are
read once (``RunFigures``): the command prints them as text, monitor.ipynb shows the same as formatted tables
(``watch.status_tables``). Standard library only, so the command answers in a fraction of a second even beside a
million-row run.
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
from draftgen.exit_codes import ExitCode
from draftgen.rundir.layout import LOCK, MANIFEST
from draftgen.watch.progress_file import process_start_ticks, read_progress, stale_after_s

# The verdicts' exit codes (draftgen.exit_codes: one table for every command). A finished run is 0, so
# `draftgen status RUN && next-step` goes on only after it; one still going is 4, so a script waits while it sees 4.
FINISHED = ExitCode.OK  # the run finished (every prompt done or failed)
STOPPED = (
    ExitCode.FAILED
)  # the run stopped early and said so: interrupted, halted (guard, servers down, disk full)
GONE = ExitCode.FAILED  # the run says running but its process is gone (killed, crashed, machine down)
RUNNING = ExitCode.RUNNING  # the writer is alive and its heartbeat fresh
NOT_RESPONDING = ExitCode.NOT_RESPONDING  # alive, heartbeat stale (hung event loop, stopped with SIGSTOP)


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


@dataclass(frozen=True)
class ServerFigures:
    """One server's line of progress.json, tok/s on the servers' clock."""

    label: str
    up: bool
    in_flight: int
    answered: int  # requests answered this session (a multi-turn conversation asks once per turn)
    tok_s: float | None
    accept_window: float | None  # mean acceptance length over the rate window
    accept_session: float | None
    errors: int
    cached_share: float | None = (
        None  # prompt tokens its prefix cache served, of the answers that reported it
    )


@dataclass(frozen=True)
class GuardRate:
    name: str  # a defect, e.g. "truncated"
    rate: float  # its share over the guard's window
    limit: float | None  # the share above which the guard halts the run (None: not guarded)


@dataclass(frozen=True)
class Event:
    at: float
    server: str
    what: str


@dataclass(frozen=True)
class RunFigures:
    """progress.json's figures with rates and times on the servers' clock: what ``draftgen status`` prints as text
    and monitor.ipynb shows as tables (one reading, so the two never disagree)."""

    total: int
    done: int
    failed: int
    session_done: int
    turns_done: int | None  # None: not reported (turns_session None too: a run without a turn count)
    turns_total: int | None
    turns_session: int | None
    conversations_per_s: float | None
    tok_s: float | None  # completion tok/s over the rate window
    window_s: float  # the rate window
    clock: str | None  # "simulated B200 clock, sim ×5" (None: real servers)
    trained_tokens: int | None
    gpu_s_per_million: float | None  # GPU-seconds per million trained tokens (None: none trained yet)
    eta_s: float | None  # None: not running, or no completions in the window yet
    eta_at: float | None
    running: bool
    guard: tuple[GuardRate, ...]
    guard_seen: int
    cut_at_max_length: (
        int  # turns cut where the trainer's max_length set the budget: expected, outside the guard
    )
    retrying: int
    servers: tuple[ServerFigures, ...]
    events: tuple[Event, ...]  # the last EVENTS_SHOWN
    # The prefix cache's share of prompt tokens: over every answer that reported it, and per turn index over the
    # conversations stored this session (docs/generate.md, "Prefix affinity"); None / () where none did.
    cached_share: float | None = None
    cached_share_by_turn: tuple[float | None, ...] = ()


EVENTS_SHOWN = 10


def run_figures(run_dir: Path, progress: dict[str, Any], verdict: Verdict, *, now: float) -> RunFigures:
    conv = progress.get("conversations", {})
    turns = progress.get("turns") or {}
    rate = progress.get("rate", {})
    factor, hardware = _clock(progress, run_dir)
    per_s, tok_s = rate.get("conversations_per_s"), rate.get("tok_s")
    servers = progress.get("servers", [])
    trained = progress.get("trained_tokens")
    gpu_s_per_million = None
    if trained:
        until = progress.get("ended_at") or progress.get("heartbeat_at") or now
        gpu_s = (
            max(0.0, until - float(progress.get("session_started_at") or until))
            * factor
            * max(1, len(servers))
        )
        gpu_s_per_million = gpu_s / trained * 1e6
    running = verdict.code == RUNNING
    eta = progress.get("eta_s") if running else None
    cache_prompt = sum(server.get("cache_prompt_tokens") or 0 for server in servers)
    cached = sum(server.get("cached_tokens") or 0 for server in servers)
    guard = progress.get("guard", {})
    limits = guard.get("max_rates", {})
    return RunFigures(
        total=conv.get("total", 0),
        done=conv.get("done", 0),
        failed=conv.get("failed", 0),
        session_done=conv.get("session_done", 0),
        turns_done=turns.get("done"),
        turns_total=turns.get("total"),
        turns_session=turns.get("session_done", 0) if turns else None,
        conversations_per_s=per_s / factor if per_s is not None else None,
        tok_s=tok_s / factor if tok_s is not None else None,
        window_s=(rate.get("window_s") or 0.0) * factor,
        clock=hardware,
        trained_tokens=trained,
        gpu_s_per_million=gpu_s_per_million,
        eta_s=eta,
        eta_at=now + eta if eta is not None else None,
        running=running,
        guard=tuple(
            GuardRate(name, value, limits.get(name)) for name, value in guard.get("window_rates", {}).items()
        ),
        guard_seen=guard.get("seen", 0),
        cut_at_max_length=(guard.get("totals") or {}).get("cut_at_max_length", 0),
        retrying=progress.get("retrying") or 0,
        servers=tuple(
            ServerFigures(
                label=server.get("label", server.get("url", "?")),
                up=bool(server.get("up")),
                in_flight=server.get("in_flight", 0),
                answered=server.get("completed", 0),
                tok_s=server["tok_s"] / factor if server.get("tok_s") is not None else None,
                accept_window=server.get("mean_accept_window"),
                accept_session=server.get("mean_accept"),
                errors=server.get("errors", 0),
                cached_share=_share(server.get("cached_tokens"), server.get("cache_prompt_tokens")),
            )
            for server in servers
        ),
        cached_share=_share(cached, cache_prompt),
        cached_share_by_turn=tuple(
            _share(hit, prompt) for prompt, hit in progress.get("cache_by_turn") or ()
        ),
        events=tuple(
            Event(float(e.get("at", 0)), e.get("server", ""), e.get("what", ""))
            for e in progress.get("events", [])[-EVENTS_SHOWN:]
        ),
    )


def _share(cached: int | None, prompt: int | None) -> float | None:
    return cached / prompt if cached is not None and prompt else None


def cache_text(f: RunFigures) -> str | None:
    """ "31.4% of prompt tokens from the servers' prefix caches (by turn: 1st 0.2%, 2nd 88.0%)", or None."""
    if f.cached_share is None:
        return None
    turns = ", ".join(
        f"{_ordinal(i + 1)} {'—' if share is None else f'{share:.1%}'}"
        for i, share in enumerate(f.cached_share_by_turn)
    )
    return f"{f.cached_share:.1%} of prompt tokens from the servers' prefix caches" + (
        f" (by turn, stored conversations: {turns})" if turns else ""
    )


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def format_progress(run_dir: Path, progress: dict[str, Any], verdict: Verdict, *, now: float) -> str:
    """The table: counts, rates, ETA, guard, servers, last events."""
    return figures_text(run_dir, verdict, run_figures(run_dir, progress, verdict, now=now))


def figures_text(run_dir: Path, verdict: Verdict, f: RunFigures) -> str:
    """``draftgen status``'s text table of one reading."""
    lines = [f"run       {run_dir}", f"state     {verdict.word} — {verdict.sentence}"]
    share = f" ({f.done / f.total:.1%})" if f.total else ""
    lines.append(
        f"done      {f.done:,} / {f.total:,} conversations{share}; this session {f.session_done:,}, "
        f"failed {f.failed:,}"
    )
    if f.turns_session is not None:
        text = f"{f.turns_session:,} assistant turns answered this session"
        if f.turns_done is not None and f.turns_total:
            text = f"{f.turns_done:,} / {f.turns_total:,} assistant turns; {f.turns_session:,} answered this session"
        lines.append(f"turns     {text}")
    on = f" ({f.clock})" if f.clock else ""
    lines.append(
        f"rate      {_fmt(f.conversations_per_s, ',.2f')} conversations/s, {_fmt(f.tok_s)} completion tok/s over "
        f"the last {duration(f.window_s)}{on}"
    )
    if f.trained_tokens is not None:
        per_m = _fmt(f.gpu_s_per_million)
        lines.append(
            f"trained   {f.trained_tokens:,} trained tokens this session (each turn's up to the trainer's "
            f"max_length); {per_m} GPU-seconds per million trained tokens{on}"
        )
    if (cache := cache_text(f)) is not None:
        lines.append(f"cache     {cache}")
    if f.running:
        eta_text = "unknown (no completions in the window yet)"
        if f.eta_s is not None and f.eta_at is not None:
            eta_text = f"{duration(f.eta_s)} (at {_at(f.eta_at)}) at the current rate (wall clock)"
        lines.append(f"ETA       {eta_text}")
    if f.guard:
        parts = [
            f"{g.name.replace('_', ' ')} {g.rate:.1%}"
            + (f" (halts > {g.limit:.0%})" if g.limit is not None else "")
            for g in f.guard
        ]
        lines.append("guard     " + " · ".join(parts) + f"  [{f.guard_seen:,} results seen]")
    if f.cut_at_max_length:
        lines.append(f"expected  {f.cut_at_max_length:,} turns cut at the trainer's max_length (not guarded)")
    if f.retrying:
        lines.append(f"retrying  {f.retrying:,} requests waiting out a backoff")
    if f.servers:
        header = (
            "server",
            "state",
            "in flight",
            "answered",
            "tok/s",
            "accept (window)",
            "accept (session)",
            "errors",
            "cached",
        )
        rows = [header]
        for s in f.servers:
            rows.append(
                (
                    s.label,
                    "up" if s.up else "DOWN",
                    f"{s.in_flight:,}",
                    f"{s.answered:,}",
                    _fmt(s.tok_s),
                    _fmt(s.accept_window, ".2f"),
                    _fmt(s.accept_session, ".2f"),
                    f"{s.errors:,}",
                    _fmt(s.cached_share, ".1%"),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines.append("")
        for row in rows:
            lines.append(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )
    if f.events:
        lines.append("")
        lines.append("last events")
        for event in f.events:
            lines.append(f"  {event_stamp(event.at)}  {event.server}: {event.what}")
    return "\n".join(lines)


def event_stamp(epoch: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(epoch))


def _lock_pid(run_dir: Path) -> int | None:
    try:
        text = (run_dir / LOCK).read_text().strip()
    except OSError:
        return None
    word, _, number = text.partition(" ")
    return int(number) if word == "pid" and number.isdigit() else None


@dataclass(frozen=True)
class ManifestFigures:
    """A run folder without progress.json: its manifest's counts."""

    done: int
    valid: int  # prompts
    failed: int
    rejected: int
    shards: int


MANIFEST_NOTE = "no progress.json (a run from before draftgen wrote one): figures from manifest.json, updated at each shard"


@dataclass(frozen=True)
class StatusReport:
    """What ``draftgen status`` found: the verdict, its text table, and the figures behind it (for monitor)."""

    run_dir: Path
    verdict: Verdict
    text: str
    figures: RunFigures | ManifestFigures


def manifest_status(run_dir: Path, *, now: float) -> tuple[Verdict, str]:
    """For a run folder without progress.json: the manifest's status and counts, and the lock file's pid."""
    report = _manifest_report(run_dir, now=now)
    return report.verdict, report.text


def _manifest_report(run_dir: Path, *, now: float) -> StatusReport:
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
    figures = ManifestFigures(
        done=counts.get("done", 0),
        valid=prompts.get("valid", 0),
        failed=counts.get("failed", 0),
        rejected=counts.get("rejected", 0),
        shards=len(manifest.get("shards", [])),
    )
    lines = [
        f"run       {run_dir}",
        f"state     {verdict.word} — {verdict.sentence}",
        f"note      {MANIFEST_NOTE}",
        f"done      {figures.done:,} / {figures.valid:,} prompts; failed {figures.failed:,}, rejected "
        f"{figures.rejected:,}",
        f"shards    {figures.shards:,}",
    ]
    return StatusReport(run_dir, verdict, "\n".join(lines), figures)


def run_status(run_dir: str | Path, *, now: float | None = None) -> tuple[Verdict, str]:
    """(verdict, table) for a generate run folder."""
    report = status_report(run_dir, now=now)
    return report.verdict, report.text


def status_report(run_dir: str | Path, *, now: float | None = None) -> StatusReport:
    """The verdict, the text table and the figures behind it, for a generate run folder."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    progress = read_progress(run_dir)
    if progress is None:
        return _manifest_report(run_dir, now=now)
    verdict = judge(progress, now=now)
    figures = run_figures(run_dir, progress, verdict, now=now)
    return StatusReport(run_dir, verdict, figures_text(run_dir, verdict, figures), figures)
