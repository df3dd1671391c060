"""A full disk is a clear stop, not a traceback: preflight refuses a run that cannot fit, and a disk that fills
anyway stops generate as an interrupt would (whole shards kept, manifest ``disk full`` with the path, one line),
after which ``--resume`` finishes every prompt exactly once.

The real-filesystem test mounts a 4 MB tmpfs (root needed: CI runs as root). It fails, never skips, when the
mount is impossible.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from generate_helpers import generate_here, row, run_command

from draftgen.generate import DiskFullStop, GenerateConfig, PreflightError, generate, preflight
from draftgen.generate.disk import BYTES_PER_TOKEN, ROW_OVERHEAD_BYTES, space_need
from draftgen.generate.run import _disk_full_in
from draftgen.generate.store import (
    MANIFEST,
    DiskFull,
    RunStore,
    read_done_ids,
    read_manifest,
    record_disk_full,
)
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.rundir import is_disk_full
from draftgen.watch.progress_file import read_progress

ENOSPC_POLARS = (
    "parquet: File out of specification: underlying IO error: No space left on device (os error 28)"
)


def config_for(urls: list[str], prompts: Path, out_dir: Path, **changes: object) -> GenerateConfig:
    values: dict[str, object] = {
        "servers": urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "max_tokens": 128,
        "concurrency_per_server": 8,
        "batch_save_size": 50,
        "max_truncated_rate": 1.0,
        "canary": False,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> list[str]:
    """Every parquet write after the first ``writes`` fails as polars fails on a full disk (after writing part
    of the file, as a real write does). Returns the paths it refused."""
    real = pl.DataFrame.write_parquet
    done: list[str] = []
    refused: list[str] = []

    def write(frame: pl.DataFrame, path: object, *args: object, **kwargs: object) -> None:
        if len(done) >= writes:
            Path(str(path)).write_bytes(b"PAR1 partial")
            refused.append(str(path))
            raise pl.exceptions.ComputeError(ENOSPC_POLARS)
        done.append(str(path))
        real(frame, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pl.DataFrame, "write_parquet", write)
    return refused


# ----- recognising a full disk -----------------------------------------------------------------------------------
def test_a_full_disk_is_recognised_however_it_is_reported():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(pl.exceptions.ComputeError(ENOSPC_POLARS))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("flush failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    notebook_error = RuntimeError("the kernel's error")
    notebook_error.ename = "DiskFullStop"  # type: ignore[attr-defined]  # as papermill reports a cell's error
    assert is_disk_full(notebook_error)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("bad row"))
    assert not is_disk_full(None)


def test_the_projection_states_its_numbers():
    need = space_need("/", prompts=1000, max_tokens=4096, mean_completion_tokens=None, prompt_bytes=300)
    assert need.needed_bytes == int(1000 * (4096 * BYTES_PER_TOKEN + 300 + ROW_OVERHEAD_BYTES))
    assert "max_tokens" in need.tokens_source and "1,000 prompts" in need.detail()
    planned = space_need("/", prompts=1000, max_tokens=4096, mean_completion_tokens=1800.0, prompt_bytes=300)
    assert planned.tokens_per_row == 1800 and "estimate" in planned.tokens_source
    huge = space_need("/", prompts=10**12, max_tokens=4096, mean_completion_tokens=None, prompt_bytes=0)
    assert not huge.fits and "but only" in huge.detail() and "free" in huge.detail()


# ----- ENOSPC injected -------------------------------------------------------------------------------------------
def test_a_shard_write_that_fills_the_disk_keeps_finished_shards_and_says_disk_full(tmp_path, monkeypatch):
    config = config_for(["http://127.0.0.1:1"], Path("synthetic"), tmp_path / "run", batch_save_size=3)
    store = RunStore.open(config)
    for name in "abc":
        store.add(row(name))  # shard 1 written
    refused = fill_disk_after(monkeypatch, writes=0)
    store.add(row("d"))
    store.add(row("e"))
    with pytest.raises(DiskFull) as caught:
        store.add(row("f"))
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained polars traceback
    assert "part-000002.parquet" in str(caught.value) and "no space left" in str(caught.value)
    assert caught.value._render_traceback_() == [f"DiskFull: {caught.value}"]
    shards = tmp_path / "run" / "shards"
    assert refused == [str(shards / ".part-000002.parquet.tmp")]
    assert not list(shards.glob(".*.tmp"))  # the half-written file is gone at once: its space is needed
    monkeypatch.undo()
    assert store.close_disk_full(caught.value)
    store.release()
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None and manifest["status"] == "disk full"
    assert manifest["disk_full"]["path"] == str(shards / "part-000002.parquet")
    assert manifest["disk_full"]["rows_not_written"] == 3
    assert manifest["sessions"][-1]["status"] == "disk full" and manifest["sessions"][-1]["completed"] == 3
    assert [p.name for p in shards.glob("*.parquet")] == ["part-000001.parquet"]
    with RunStore.open(config) as resumed:  # space freed: the three unwritten rows are simply to do again
        assert resumed.done_ids == {"a", "b", "c"}
        for name in "def":
            resumed.add(row(name))
        resumed.close("complete")
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None and manifest["status"] == "complete" and "disk_full" not in manifest
    assert sorted(read_done_ids(tmp_path / "run").to_list()) == list("abcdef")


def test_a_run_killed_before_it_could_say_so_is_recorded_by_draftgen_run(tmp_path):
    """Papermill failing to save the executed notebook on the full disk kills the kernel mid-run: ``draftgen
    run`` then marks the folder's manifest itself, but only while no process holds its lock."""
    config = config_for(["http://127.0.0.1:1"], Path("synthetic"), tmp_path / "run", batch_save_size=2)
    store = RunStore.open(config)
    store.add(row("a"))
    store.add(row("b"))  # shard 1 and a manifest saying "running"
    notebook = tmp_path / "run" / "generate.ipynb"
    assert not record_disk_full(
        tmp_path / "run", notebook, "OSError: [Errno 28]"
    )  # the writer still holds it
    store.release()  # the kernel is gone
    assert record_disk_full(tmp_path / "run", notebook, "OSError: [Errno 28] No space left on device")
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None and manifest["status"] == "disk full"
    assert manifest["disk_full"]["path"] == str(notebook) and manifest["counts"]["done"] == 2
    assert not record_disk_full(tmp_path / "run", notebook, "again")  # only a run still marked running


def test_generate_stops_on_a_full_disk_as_on_an_interrupt_and_resumes(instant_fleet, tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 400, seed=5)
    fleet = instant_fleet(2)
    config = config_for(fleet.urls, prompts, tmp_path / "run")
    plan = asyncio.run(preflight(config))
    assert any(c.check == "disk space" and c.status == "ok" for c in plan.checks)
    fill_disk_after(monkeypatch, writes=2)  # two shards, then the disk is full
    with pytest.raises(DiskFullStop) as caught:
        asyncio.run(generate(config, plan, progress=False))
    stop = caught.value
    assert (
        stop.__context__ is None and stop.__cause__ is None
    )  # a notebook shows the one line, nothing chained
    assert stop._render_traceback_() == [f"DiskFullStop: {stop}"] and "\n" not in str(stop)
    assert "--resume" in str(stop), str(stop)
    assert "100 rows are safe in 2 shards" in str(stop), str(stop)
    monkeypatch.undo()
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None and manifest["status"] == "disk full"
    assert manifest["disk_full"]["path"].endswith("part-000003.parquet")
    progress = read_progress(tmp_path / "run")
    assert progress is not None and progress["state"] == "interrupted"
    assert progress["detail"] == f"disk full: {manifest['disk_full']['path']}"
    assert read_done_ids(tmp_path / "run").len() == 100
    plan = asyncio.run(preflight(config))
    result = asyncio.run(generate(config, plan, progress=False))
    assert result.status == "complete"
    ids = read_done_ids(tmp_path / "run")
    assert ids.len() == ids.n_unique() == 400


# ----- a real 4 MB filesystem ------------------------------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path):  # type: ignore[no-untyped-def]
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(
            f"cannot mount a 4 MB tmpfs at {mount_point} ({done.stderr.strip() or done.returncode}): this test "
            "needs root (CI runs as root) to fill a real filesystem"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def draftgen_run(out_root: Path, name: str, params: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        run_command(out_root, name, params, "--no-html", *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # started first (tests/long_first.py)
def test_a_real_full_filesystem(instant_fleet, tmp_path, tiny_fs):
    fleet = instant_fleet(2)
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 600, seed=3)

    # 1. Preflight: 600 prompts at max_tokens 4096 cannot fit in 4 MB: a FAIL row with the numbers.
    big = config_for(fleet.urls, prompts, tiny_fs / "big", max_tokens=4096)
    with pytest.raises(PreflightError) as refused:
        asyncio.run(preflight(big))
    message = str(refused.value)
    assert "FAIL  disk space" in message and "600 prompts" in message and "but only" in message

    # 2. It fits at max_tokens 128, but another process fills the disk once the first shard is written.
    params = {
        "servers": fleet.urls,
        "prompts": str(prompts),
        "max_tokens": 128,
        "batch_save_size": 100,
        "concurrency_per_server": 8,
        "max_truncated_rate": 1.0,
    }
    run_dir = tiny_fs / "generate" / "full"
    process = draftgen_run(tiny_fs, "full", params)
    deadline = time.monotonic() + 240
    while not (run_dir / "shards" / "part-000001.parquet").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no shard written in 240 s"
        time.sleep(0.1)
    ballast = tiny_fs / "ballast"
    with open(ballast, "wb") as handle:  # leave ~150 KB: a few shards' worth, then the disk is full
        handle.write(b"\0" * max(0, os.statvfs(tiny_fs).f_bavail * os.statvfs(tiny_fs).f_frsize - 150_000))
    out, err = process.communicate(timeout=300)
    assert process.returncode == 1, (out[-2000:], err[-3000:])
    assert "Traceback" not in out + err, err
    stopped = [
        line for line in err.splitlines() if line.startswith("draftgen run: generate stopped: disk full")
    ]
    assert len(stopped) == 1 and "--resume" in stopped[0], err[-3000:]
    manifest = json.loads((run_dir / MANIFEST).read_text())
    assert manifest["status"] == "disk full", (
        manifest,
        [line for line in err.splitlines() if "generate:" not in line][-40:],
    )
    assert manifest["disk_full"]["path"].startswith(str(run_dir))
    progress = read_progress(run_dir)
    assert progress is not None and progress["detail"].startswith("disk full: "), progress
    kept = read_done_ids(run_dir)
    assert 100 <= kept.len() < 600 and kept.len() % 100 == 0  # whole shards only
    assert not list((run_dir / "shards").glob(".*.tmp"))

    # 3. Space freed: the resume (generate's run(config) on the same folder, here in the test's process: draftgen run
    # --resume is tested in test_generate_notebook.py) finishes every prompt exactly once.
    ballast.unlink()
    assert generate_here(run_dir, params).result.status == "complete"
    ids = read_done_ids(run_dir)
    assert ids.len() == ids.n_unique() == 600
    manifest = json.loads((run_dir / MANIFEST).read_text())
    # The stopped session is in the list when the kernel recorded it, not when papermill's failing notebook save
    # killed the kernel first (then draftgen run recorded the disk full, without the session's counts).
    assert manifest["status"] == "complete" and manifest["sessions"][-1]["status"] == "complete"
    assert [s["status"] for s in manifest["sessions"][:-1]] in ([], ["disk full"])


def test_disk_full_is_found_behind_an_exception_chain_that_loops_back_to_its_group():
    # Seen in a full run: a worker's DiskFull inside the dispatcher's group, acceptance.parquet failing on the same
    # disk while that was handled, and a group member whose context leads back to the group. The search must end.
    disk_full = DiskFull(Path("/runs/x/shards/part-000004.parquet"), OSError(errno.ENOSPC, "No space left"))
    sibling = RuntimeError("worker stopped")
    group = ExceptionGroup("workers", [sibling, disk_full])
    sibling.__context__ = group  # the loop
    later = OSError(errno.ENOSPC, "acceptance.parquet")
    later.__context__ = group
    assert _disk_full_in(later) is disk_full
    assert _disk_full_in(ExceptionGroup("only", [RuntimeError("a worker bug")])) is None
