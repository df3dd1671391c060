"""progress.json / progress-history.jsonl (writer and readers), draftgen status's verdicts, monitor's reads."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from draftgen.cli import main
from draftgen.generate.status_file import FleetSnapshot, ServerSnapshot, StatusWriter
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.watch import monitor, progress_file
from draftgen.watch.progress_file import HISTORY, PROGRESS, read_history, read_progress, set_state
from draftgen.watch.status import FINISHED, GONE, NOT_RESPONDING, RUNNING, STOPPED, judge, run_status

A, B = "http://127.0.0.1:30000", "http://127.0.0.1:30001"


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def snap(completed: int, tokens_a: int, tokens_b: int, *, accept_a=(0.0, 0), up_b=True, failed=0, events=()):
    servers = (
        ServerSnapshot(A, True, 8, completed // 2, tokens_a, accept_a[0], accept_a[1], 0, 0),
        ServerSnapshot(B, up_b, 0 if not up_b else 8, completed - completed // 2, tokens_b, 0.0, 0, 3, 1),
    )
    return FleetSnapshot(
        completed=completed,
        failed=failed,
        completion_tokens=tokens_a + tokens_b,
        retrying=2,
        servers=servers,
        guard_rates={"empty_answer": 0.01, "truncated": 0.2},
        guard_totals={"empty_answer": 1, "truncated": 20},
        guard_seen=completed,
        events=events,
    )


# ----- the writer ---------------------------------------------------------------------------------------------
def test_writer_rates_eta_servers_and_interval(tmp_path):
    clock = Clock()
    writer = StatusWriter(
        tmp_path, interval_s=5.0, total=1000, done_at_start=100, max_rates={"truncated": 0.5}, clock=clock
    )
    assert writer.update(snap(0, 0, 0))  # the first update writes at once
    clock.t += 2.0
    assert not writer.update(snap(10, 500, 500))  # inside the interval: remembered, not written
    clock.t += 8.0  # 10 s after the start: 100 more done, 4,000 + 2,000 tokens, server A accepted 3.0 on 40
    events = ((clock.t - 1, B, "marked down after 5 consecutive failures"),)
    assert writer.update(snap(100, 4000, 2000, accept_a=(120.0, 40), up_b=False, failed=4, events=events))
    data = read_progress(tmp_path)
    assert data["state"] == "running" and data["pid"] == os.getpid() and data["host"] == socket.gethostname()
    assert data["heartbeat_at"] == clock.t and data["interval_s"] == 5.0
    assert data["conversations"] == {
        "total": 1000,
        "done": 200,
        "done_at_start": 100,
        "session_done": 100,
        "failed": 4,
    }
    assert data["rate"]["conversations_per_s"] == pytest.approx(10.0)
    assert data["rate"]["tok_s"] == pytest.approx(600.0)
    assert data["eta_s"] == pytest.approx((1000 - 200 - 4) / 10.0)
    a, b = data["servers"]
    assert (a["label"], a["tok_s"], a["mean_accept"], a["mean_accept_window"]) == (":30000", 400.0, 3.0, 3.0)
    assert (b["up"], b["in_flight"], b["tok_s"], b["mean_accept"], b["errors"]) == (False, 0, 200.0, None, 3)
    assert data["guard"]["window_rates"]["truncated"] == 0.2 and data["guard"]["max_rates"] == {
        "truncated": 0.5
    }
    assert data["events"][-1]["what"].startswith("marked down") and data["events"][-1]["server"] == ":30001"
    assert data["retrying"] == 2
    assert "turns" not in data  # single-turn dispatch reports no turn count
    lines = read_history(tmp_path)
    assert len(lines) == 2  # one line per write, not per update
    assert lines[-1]["servers"][A] == [50, 4000, 120.0, 40, 8, 1] and lines[-1]["servers"][B][-1] == 0


def test_rates_cover_only_the_last_five_minutes(tmp_path):
    clock = Clock()
    writer = StatusWriter(tmp_path, interval_s=5.0, total=10**6, done_at_start=0, clock=clock)
    done = 0
    for _minute in range(10):  # 10/s for five minutes, then 1/s for five
        for _ in range(12):
            clock.t += 5.0
            done += 50 if _minute < 5 else 5
            writer.update(snap(done, done, 0))
    assert read_progress(tmp_path)["rate"]["conversations_per_s"] == pytest.approx(1.0, rel=0.05)


def test_finish_records_state_and_detail(tmp_path):
    clock = Clock()
    writer = StatusWriter(tmp_path, interval_s=5.0, total=10, done_at_start=0, clock=clock)
    writer.update(snap(4, 10, 10))
    clock.t += 1.0
    writer.finish("halted", "garbage guard: 90% empty answers")
    data = read_progress(tmp_path)
    assert (data["state"], data["detail"], data["ended_at"]) == (
        "halted",
        "garbage guard: 90% empty answers",
        clock.t,
    )
    assert data["conversations"]["done"] == 4
    with pytest.raises(ValueError, match="state must be one of"):
        writer.finish("exploded")


def test_a_failed_write_is_noted_once_and_never_raises(tmp_path):
    notes: list[str] = []
    writer = StatusWriter(tmp_path / "missing", interval_s=0.01, total=10, done_at_start=0, note=notes.append)
    assert not writer.update(snap(1, 1, 1))
    assert not writer.update(snap(2, 1, 1), force=True)
    assert (
        len(notes) == 1 and "progress.json could not be written" in notes[0] and "the run goes on" in notes[0]
    )


def test_disk_full_overwrites_in_place(tmp_path, monkeypatch):
    progress_file.write_progress(tmp_path, {"state": "running", "pad": "x" * 100})

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(progress_file.os, "replace", full)
    progress_file.write_progress(tmp_path, {"state": "interrupted"})
    assert read_progress(tmp_path) == {"state": "interrupted"}
    assert not list(tmp_path.glob(".*.tmp"))


def test_set_state_is_the_api_for_other_stoppers(tmp_path):
    assert set_state(tmp_path, "interrupted", "disk full: /x") is None  # no progress.json: nothing to amend
    progress_file.write_progress(tmp_path, {"state": "running", "heartbeat_at": 1.0, "pid": 1})
    data = set_state(tmp_path, "interrupted", "disk full: /data/run")
    assert read_progress(tmp_path) == data
    assert (
        data["state"] == "interrupted"
        and data["detail"] == "disk full: /data/run"
        and data["heartbeat_at"] > 1
    )
    with pytest.raises(ValueError, match="disk full"):
        set_state(tmp_path, "disk full")
    verdict, table = run_status(tmp_path)
    assert verdict.code == STOPPED and "disk full: /data/run" in table


def test_history_reader_skips_a_line_being_written_and_garbage(tmp_path):
    path = tmp_path / HISTORY
    path.write_text('{"t": 1, "servers": {}}\nnot json\n{"t": 2, "servers": {}}\n{"t": 3, "serv')
    assert [r["t"] for r in read_history(tmp_path)] == [1, 2]
    assert read_history(tmp_path / "nowhere") == []


def test_torn_progress_json_is_named(tmp_path):
    (tmp_path / PROGRESS).write_text('{"state": "runn')
    with pytest.raises(ValueError, match=r"progress\.json is not valid JSON"):
        read_progress(tmp_path, attempts=2)


# ----- verdicts ---------------------------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def progress_doc(**changes):
    doc = {
        "state": "running",
        "heartbeat_at": 1000.0,
        "interval_s": 5.0,
        "stale_after_s": 30.0,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": progress_file.process_start_ticks(os.getpid()),
    }
    doc.update(changes)
    return doc


def test_verdicts():
    here = socket.gethostname()
    assert judge(progress_doc(), now=1010.0).code == RUNNING
    stale = judge(progress_doc(), now=1100.0)  # this very process: alive, yet no heartbeat for 100 s
    assert stale.code == NOT_RESPONDING and "alive" in stale.sentence
    dead = judge(progress_doc(pid=_dead_pid(), pid_start=None), now=1001.0)  # fresh heartbeat, dead process
    assert dead.code == GONE and "killed or crashed" in dead.sentence
    reused = judge(progress_doc(pid_start=1), now=1001.0)  # our pid, but another process's start time
    assert reused.code == GONE
    elsewhere = progress_doc(host=here + "-other")
    assert judge(elsewhere, now=1010.0).code == RUNNING
    far = judge(elsewhere, now=1100.0)
    assert far.code == GONE and "cannot be checked" in far.sentence and "100 s ago" in far.sentence
    assert judge(progress_doc(state="finished", detail="complete"), now=2000.0).code == FINISHED
    for state in ("interrupted", "halted", "failed"):
        verdict = judge(progress_doc(state=state, detail="why"), now=2000.0)
        assert verdict.code == STOPPED and verdict.word == state.upper() and "--resume" in verdict.sentence


def test_status_command_table_and_exit_codes(tmp_path, capsys):
    clock = Clock(t=__import__("time").time())
    writer = StatusWriter(tmp_path, interval_s=5.0, total=1000, done_at_start=0, clock=clock)
    writer.update(snap(0, 0, 0))
    clock.t += 10
    writer.update(snap(100, 4000, 2000, events=((clock.t, B, "healthy again"),)))
    assert main(["status", str(tmp_path)]) == RUNNING
    out = capsys.readouterr().out
    for fragment in (
        "RUNNING",
        "100 / 1,000 conversations",
        "ETA",
        ":30000",
        ":30001",
        "healthy again",
        "guard",
    ):
        assert fragment in out, fragment
    writer.finish("finished", "complete")
    assert main(["status", str(tmp_path)]) == FINISHED
    assert "FINISHED" in capsys.readouterr().out
    assert main(["status", "--json", str(tmp_path)]) == FINISHED
    assert json.loads(capsys.readouterr().out)["verdict"]["word"] == "FINISHED"
    assert main(["status", str(tmp_path / "nope")]) == 2
    assert "no run folder" in capsys.readouterr().err


def test_status_falls_back_to_the_manifest(tmp_path, capsys):
    manifest = {
        "status": "running",
        "counts": {"done": 500, "failed": 1, "rejected": 0},
        "prompts": {"valid": 2000},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest | {"updated_at": 1.0}))
    (tmp_path / ".lock").write_text(f"pid {_dead_pid()}")
    assert main(["status", str(tmp_path)]) == GONE
    out = capsys.readouterr().out
    assert "no progress.json" in out and "500 / 2,000" in out and "is gone" in out
    (tmp_path / ".lock").write_text(f"pid {os.getpid()}")
    assert main(["status", str(tmp_path)]) == RUNNING
    (tmp_path / "manifest.json").write_text(json.dumps(manifest | {"status": "complete"}))
    assert main(["status", str(tmp_path)]) == FINISHED
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["status", str(empty)]) == 2
    assert "not a generate run folder" in capsys.readouterr().err


# ----- monitor reads -------------------------------------------------------------------------------------------
def write_shard(folder: Path, name: str, reasons: list[str], tokens: list[int]) -> None:
    rows = [
        {"id": f"{name}-{i}", "finish_reason": r, "completion_tokens": t}
        for i, (r, t) in enumerate(zip(reasons, tokens, strict=True))
    ]
    folder.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).cast({"completion_tokens": OUTPUT_SCHEMA["completion_tokens"]}).with_columns(
        pl.lit(None, dtype=pl.String).alias("content")
    ).write_parquet(folder / name)


def test_shards_read_only_under_final_names_and_a_vanishing_one_is_skipped(tmp_path, monkeypatch):
    shards = tmp_path / "shards"
    write_shard(shards, "part-000001.parquet", ["stop", "length"], [10, 20])
    write_shard(shards, "part-000002.parquet", ["stop"], [30])
    (shards / ".part-000003.parquet.tmp").write_bytes(b"PAR1 half a shard")  # being written
    rows = monitor.read_shard_columns(tmp_path)
    assert sorted(rows["completion_tokens"].to_list()) == [10, 20, 30]
    real = monitor.shard_files
    listings = iter([[*real(tmp_path), shards / "part-000009.parquet"]])  # listed, then gone before the read
    monkeypatch.setattr(monitor, "shard_files", lambda folder: next(listings, None) or real(folder))
    assert sorted(monitor.read_shard_columns(tmp_path)["completion_tokens"].to_list()) == [10, 20, 30]


def test_history_frame_rates_per_server_and_session(tmp_path):
    lines = [
        {"t": 0.0, "session": 0.0, "done": 0, "servers": {A: [0, 0, 0.0, 0, 8, 1]}},
        {"t": 10.0, "session": 0.0, "done": 10, "servers": {A: [10, 1000, 30.0, 10, 8, 1]}},
        {"t": 20.0, "session": 0.0, "done": 20, "servers": {A: [20, 3000, 70.0, 20, 8, 1]}},
        # a new session: counters restart, no negative rate across the boundary
        {"t": 100.0, "session": 100.0, "done": 20, "servers": {A: [0, 0, 0.0, 0, 8, 1]}},
        {"t": 110.0, "session": 100.0, "done": 30, "servers": {A: [10, 500, 20.0, 10, 8, 1]}},
    ]
    (tmp_path / HISTORY).write_text("".join(json.dumps(line) + "\n" for line in lines))
    frame = monitor.binned(monitor.history_frame(tmp_path), bins=11)  # 10 s bins over 0..110
    assert frame["tok_s"].to_list() == [100.0, 200.0, 50.0]
    assert frame["accept"].to_list() == [3.0, 4.0, 2.0]


def test_multi_turn_rows_count_each_turn_and_old_shards_still_read(tmp_path):
    shards = tmp_path / "shards"
    write_shard(shards, "part-000001.parquet", ["stop"], [10])  # before the turn_* columns existed
    multi = pl.DataFrame(
        {
            "id": ["m-1", "m-2"],
            "finish_reason": ["length", "stop"],
            "completion_tokens": [40, 5],
            "turn_finish_reason": [["stop", "length"], ["stop"]],
            "turn_completion_tokens": [[20, 40], [5]],
        },
        schema_overrides={k: OUTPUT_SCHEMA[k] for k in ("turn_finish_reason", "turn_completion_tokens")},
    )
    multi.write_parquet(shards / "part-000002.parquet")
    rows = monitor.read_shard_columns(tmp_path)
    assert sorted(zip(rows["finish_reason"], rows["completion_tokens"], strict=True)) == [
        ("length", 40),
        ("stop", 5),
        ("stop", 10),
        ("stop", 20),
    ]


def test_status_imports_only_its_own_command(tmp_path):
    """draftgen status must answer fast beside a huge run: no HTTP client, pydantic, polars or papermill import."""
    StatusWriter(tmp_path, interval_s=5.0, total=1, done_at_start=0).update(snap(0, 0, 0))
    script = (
        "import sys\nfrom draftgen.cli import main\n"
        f"code = main(['status', {str(tmp_path)!r}])\n"
        "print(code, sorted(m for m in ('aiohttp', 'httpx2', 'openai', 'pydantic', 'polars', 'papermill') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "4 []", result.stdout + result.stderr  # 4: still running


def test_multi_turn_runs_report_turns(tmp_path, capsys):
    writer = StatusWriter(tmp_path, interval_s=5.0, total=10, done_at_start=0)
    base = snap(4, 10, 10)
    writer.update(FleetSnapshot(**{**base.__dict__, "turns_completed": 9}))
    assert read_progress(tmp_path)["turns"] == {"session_done": 9, "done": None, "total": None}
    assert main(["status", str(tmp_path)]) == RUNNING
    assert "9 assistant turns answered this session" in capsys.readouterr().out
