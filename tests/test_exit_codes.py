"""The command line's conventions: one table of exit codes, by cause, for every command (draftgen.exit_codes); the
traceback behind an error's one line with --debug or DRAFTGEN_DEBUG=1; a run refused before any work leaves its
name free."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from draftgen.cli import main
from draftgen.exit_codes import MEANINGS, ExitCode, help_table, markdown_table
from draftgen.paths import ROOT_ENV
from draftgen.rundir.layout import REFUSED_MARKER
from draftgen.watch import progress_file

REPO = Path(__file__).resolve().parents[1]
DEAD_SERVER = '["http://127.0.0.1:9"]'  # the discard port: nothing listens there


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (ROOT_ENV, "DRAFTGEN_DEBUG")}


def draftgen(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftgen", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env or _env(),
    )


# ----- the table ----------------------------------------------------------------------------------------------
def test_the_codes_are_the_documented_ones_distinct_and_in_help():
    """Scripts depend on these numbers: a change is a change of the contract (docs/design.md, "Exit codes")."""
    assert {code.name: code.value for code in ExitCode} == {
        "OK": 0,
        "FAILED": 1,
        "USAGE": 2,
        "REFUSED": 3,
        "RUNNING": 4,
        "NOT_RESPONDING": 5,
        "INTERRUPTED": 130,
    }
    assert set(MEANINGS) == set(ExitCode)
    shown = draftgen("--help")
    assert shown.returncode == 0
    for code in ExitCode:
        assert f"{code.value:>3}  {MEANINGS[code][:40]}" in " ".join(shown.stdout.split("\n")), code
    assert help_table().splitlines()[0] in shown.stdout and "DRAFTGEN_DEBUG=1" in shown.stdout
    design = (REPO / "docs" / "design.md").read_text()
    assert f"<!-- exit codes -->\n{markdown_table()}<!-- end exit codes -->" in design


# ----- status: finished is 0 ------------------------------------------------------------------------------------
def _progress(folder: Path, **changes) -> Path:
    doc = {
        "state": "running",
        "heartbeat_at": __import__("time").time(),
        "interval_s": 5.0,
        "stale_after_s": 30.0,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": progress_file.process_start_ticks(os.getpid()),
    }
    folder.mkdir(parents=True, exist_ok=True)
    progress_file.write_progress(folder, doc | changes)
    return folder


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_exit_codes_by_verdict(tmp_path, capsys):
    cases = {
        "finished": (_progress(tmp_path / "f", state="finished", detail="complete"), 0),
        "running": (_progress(tmp_path / "r"), 4),
        "halted": (_progress(tmp_path / "h", state="halted", detail="guard"), 1),
        "gone": (_progress(tmp_path / "g", pid=_dead_pid(), pid_start=None), 1),
        "hung": (_progress(tmp_path / "n", heartbeat_at=1.0), 5),  # this very process: alive, heartbeat stale
    }
    for name, (folder, code) in cases.items():
        assert main(["status", str(folder)]) == code, name
    assert main(["status", str(tmp_path / "nowhere")]) == 2
    capsys.readouterr()


def test_status_and_next_goes_on_only_after_a_finished_run(tmp_path):
    finished = _progress(tmp_path / "f", state="finished", detail="complete")
    running = _progress(tmp_path / "r")
    status = f"{sys.executable} -m draftgen status"
    for folder, expected in ((finished, "next"), (running, "")):
        done = subprocess.run(
            ["sh", "-c", f"{status} {folder} >/dev/null && echo next"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert done.stdout.strip() == expected, done.stderr
    waited = subprocess.run(  # docs/generate.md's wait loop: waits while it sees 4, ends on anything else
        ["sh", "-c", f"while {status} {finished} >/dev/null; [ $? -eq 4 ]; do sleep 1; done; echo ended"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert waited.stdout.strip() == "ended", waited.stderr


# ----- --debug ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, env",
    [
        (["prompts", "--n", "0", "--out", "x.jsonl"], {}),
        (["--debug", "prompts", "--n", "0", "--out", "x.jsonl"], {}),
        (["prompts", "--n", "0", "--out", "x.jsonl", "--debug"], {}),
        (["prompts", "--n", "0", "--out", "x.jsonl"], {"DRAFTGEN_DEBUG": "1"}),
        (["prompts", "--n", "0", "--out", "x.jsonl"], {"DRAFTGEN_DEBUG": "0"}),
    ],
    ids=["plain", "global-flag", "after-the-command", "environment", "environment-off"],
)
def test_debug_shows_the_traceback_behind_the_one_line(argv, env, monkeypatch, capsys):
    monkeypatch.delenv("DRAFTGEN_DEBUG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "draftgen prompts: error: --n must be >= 1"
    wanted = "--debug" in argv or env.get("DRAFTGEN_DEBUG") == "1"
    assert ("Traceback (most recent call last)" in err) == wanted, err
    assert ("commands/prompts.py" in err) == wanted


# ----- a refusal leaves the name free -----------------------------------------------------------------------
@pytest.mark.slow  # started first (tests/long_first.py)
def test_a_refused_run_leaves_its_name_free_and_a_started_one_does_not(tmp_path):
    """benchmark against a server that is not there: refused before any work (exit 3). The same --name runs again
    without --resume (refused again: 3, not 2 for a taken name); a folder with work in it is never marked free.
    With --debug the kernel's traceback is shown too."""
    base = ["run", "benchmark", "-p", "model", "m", "--no-html", "--out-root", str(tmp_path), "--name", "b"]
    run_dir = tmp_path / "benchmark" / "b"
    first = draftgen(*base, "-p", "servers", DEAD_SERVER)
    assert first.returncode == 3, first.stderr[-2000:]
    assert "refused before any work" in first.stderr and "--name b is free" in first.stderr
    assert "127.0.0.1:9" in (run_dir / REFUSED_MARKER).read_text()
    assert "Traceback" not in first.stderr and "bench/run.py" not in first.stderr
    again = draftgen(*base, "-p", "servers", DEAD_SERVER, "--debug")
    assert again.returncode == 3, again.stderr[-2000:]
    assert "Traceback" in again.stderr and "bench/run.py" in again.stderr  # the kernel's own
    typo = draftgen(*base, "-p", "servers", DEAD_SERVER, "-p", "concurency_per_server", "8")
    assert typo.returncode == 2 and "concurency_per_server" in typo.stderr

    (run_dir / REFUSED_MARKER).unlink()  # as if the run had started: its folder holds work now
    (run_dir / "levels").mkdir(exist_ok=True)
    (run_dir / "levels" / "gpu0-c1.json").write_text("{}")
    taken = draftgen(*base, "-p", "servers", DEAD_SERVER)
    assert taken.returncode == 2 and "pass --resume" in taken.stderr
    resumed = draftgen(*base, "-p", "servers", DEAD_SERVER, "--resume")
    assert resumed.returncode == 3 and not (run_dir / REFUSED_MARKER).exists()
    assert (run_dir / "levels" / "gpu0-c1.json").exists()


def test_a_refused_tune_command_leaves_its_name_free(tmp_path):
    """draftgen tune (the step in this process): a busy port refuses it before any server starts."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        args = ["tune", "-f", "params/tune.yaml", "-p", "engine", "sim", "-p", "gpus", '"0"']
        args += ["-p", "base_port", str(port), "--out-root", str(tmp_path), "--name", "t"]
        first = draftgen(*args)
        assert first.returncode == 3 and f"port {port}" in first.stderr, first.stderr[-2000:]
        assert (tmp_path / "tune" / "t" / REFUSED_MARKER).exists()
        again = draftgen(*args)
        assert again.returncode == 3, again.stderr[-2000:]
