"""draftgen status and monitor.ipynb on a real generate run (generate's run(config) in a client process on the
simulator): mid-run, finished, and killed with SIGKILL (the stale heartbeat / dead pid is reported). monitor.ipynb
runs through draftgen run mid-run; finished and killed, its step's run(config) is read here, as its cells show it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
from generate_helpers import kill_client, start_client, wait_for_shards
from test_generate_notebook import RUN_TIMEOUT_S, base_params

from draftgen.prompts.synthetic import write_synthetic
from draftgen.watch import step as monitor_step
from draftgen.watch.monitor import MonitorConfig
from draftgen.watch.progress_file import read_history, read_progress
from draftgen.watch.status import FINISHED, GONE, RUNNING


def status(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftgen", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )


def monitor(run_dir: Path, out_root: Path, name: str) -> str:
    """Run monitor.ipynb through draftgen run; return everything it displayed (and assert no error)."""
    command = [sys.executable, "-m", "draftgen", "run", "monitor", "-p", "run_dir", str(run_dir)]
    result = subprocess.run(
        [*command, "--name", name, "--out-root", str(out_root), "--no-html"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    nb = json.loads((out_root / "monitor" / name / "monitor.ipynb").read_text())
    texts, images = [], 0
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", output
            data = output.get("data", {})
            images += "image/png" in data
            texts.append("".join(data.get("text/plain", "")) + "".join(output.get("text", "")))
    # throughput+acceptance, progress/ETA, finish reasons, lengths, acceptance by category
    assert images == 5, f"{images} figures"
    return "\n".join(texts)


def monitor_here(run_dir: Path) -> str:
    """What monitor.ipynb's cells show as text, from its step's run(config) in this process."""
    snapshot = monitor_step.run(MonitorConfig(run_dir=str(run_dir)))
    shown = (snapshot.headline, snapshot.status, snapshot.throughput, snapshot.progress)
    read = f"{snapshot.rows.height:,} generated turns read from the finished shards"  # the notebook's print
    return "\n".join([*map(repr, shown), read, repr(snapshot.breakdowns)])


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "run ended"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def server_process(fleet, index: int) -> psutil.Process:
    """The simulated server process on ``fleet.port(index)`` (a child of this test process)."""
    port = str(fleet.port(index))
    for child in psutil.Process().children(recursive=True):
        if port in child.cmdline():
            return child
    raise AssertionError(f"no sim process for port {port}")


@pytest.mark.slow  # started first (tests/long_first.py)
def test_status_and_monitor_mid_run_then_finished(sim_fleet, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 200, seed=11)
    fleet = sim_fleet(servers=3, profile="b200-mtp", speed=5.0)
    params = base_params(fleet, prompts, max_truncated_rate=1.0, status_interval_s=0.5)
    run_dir = tmp_path / "run"
    proc = start_client(run_dir, params)
    # Two servers are frozen (SIGSTOP) once a shard is written: their requests stay in flight, so the run cannot
    # finish while it is read, and the third server keeps completing prompts and writing shards meanwhile.
    frozen = [server_process(fleet, 1), server_process(fleet, 2)]
    try:
        wait_for_shards(run_dir, 1, proc)
        for server in frozen:
            server.send_signal(signal.SIGSTOP)
        wait_for(lambda: len(read_history(run_dir)) >= 3, proc)
        mid = status(run_dir)
        assert mid.returncode == RUNNING, mid.stdout + mid.stderr
        assert "RUNNING" in mid.stdout and "/ 200 conversations" in mid.stdout and "ETA" in mid.stdout
        for url in fleet.urls:
            assert ":" + url.rsplit(":", 1)[1] in mid.stdout
        text = monitor(run_dir, tmp_path / "out", "mid")
        assert "RUNNING" in text
        read = re.search(r"([\d,]+) generated turns read from the finished shards", text)
        assert read, text[-2000:]
        stored = int(read.group(1).replace(",", ""))
        assert 100 <= stored < 200
        assert proc.poll() is None  # it was read mid-run
        for server in frozen:
            server.send_signal(signal.SIGCONT)
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        for server in frozen:
            with contextlib.suppress(psutil.Error):
                server.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    done = status(run_dir)
    assert done.returncode == FINISHED and "FINISHED" in done.stdout and "200 / 200" in done.stdout
    progress = read_progress(run_dir)
    assert progress["state"] == "finished" and progress["conversations"]["done"] == 200
    assert all(s["mean_accept"] and s["mean_accept"] > 1 for s in progress["servers"])  # sglext acceptance
    history = read_history(run_dir)
    assert history[-1]["done"] == 200 and len({line["session"] for line in history}) == 1
    turns = (  # multi-turn prompts: one completion per generated turn
        pl.scan_parquet(sorted((run_dir / "shards").glob("*.parquet")))
        .select(pl.col("turn_finish_reason").list.len().sum())
        .collect()
        .item()
    )
    assert turns > 200 and progress["turns"]["session_done"] == turns
    text = monitor_here(run_dir)
    assert "FINISHED" in text and f"{turns:,} generated turns read from the finished shards" in text
    assert f"{turns:,} assistant turns" in done.stdout


def test_status_and_monitor_on_a_killed_run(sim_fleet, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 500, seed=12)
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=5.0)
    params = base_params(fleet, prompts, max_truncated_rate=1.0, status_interval_s=0.5)
    run_dir = tmp_path / "run"
    proc = start_client(run_dir, params)
    try:
        wait_for_shards(run_dir, 1, proc)
        assert status(run_dir).returncode == RUNNING
        kill_client(proc)  # no goodbye: progress.json still says running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert read_progress(run_dir)["state"] == "running"
    gone = status(run_dir)
    assert gone.returncode == GONE, gone.stdout
    assert (
        "GONE" in gone.stdout and f"process {proc.pid}" in gone.stdout and "killed or crashed" in gone.stdout
    )
    text = monitor_here(run_dir)
    assert "GONE" in text and "killed or crashed" in text
    assert "when will it end? (gone)" in text  # no ETA projected for a dead run
