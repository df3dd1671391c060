"""The run folder's one owner (draftgen.rundir): one atomic write, one temporary-name pattern cleaned on open, one
lease from preflight into the run, and a full disk as one error type.

The crash tests kill a real child process (SIGKILL) while it is blocked between writing the temporary file and
renaming it, then look at what is left on disk. The full-disk test on a real filesystem mounts a 1 MB tmpfs (root
needed: CI runs as root) and fails, never skips, when the mount is impossible.
"""

from __future__ import annotations

import ast
import asyncio
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from fnmatch import fnmatch
from pathlib import Path

import polars as pl
import pytest
from generate_helpers import URL, row

from draftgen.generate import GenerateConfig, PreflightError, generate, preflight
from draftgen.generate import store as store_module
from draftgen.generate.preflight import Plan, PromptScan
from draftgen.generate.session import session_store
from draftgen.generate.store import RunStore, StoreError, read_done_ids, read_manifest
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.rundir import (
    DiskFull,
    RunFolderBusy,
    RunFolderLease,
    is_disk_full,
    overwrite_in_place,
    replace_file,
    temporary_path,
    write,
    write_bytes,
    write_json,
    write_parquet,
    write_text,
)
from draftgen.rundir.layout import (
    ACCEPTANCE,
    FAILED,
    LOCK,
    MANIFEST,
    PROGRESS,
    REJECTED,
    SHARDS,
    shard_name,
    shard_paths,
)

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "draftgen"


def make_config(out_dir: Path, **changes: object) -> GenerateConfig:
    values: dict[str, object] = {
        "servers": [URL],
        "model": "m",
        "prompts": "synthetic",
        "out_dir": str(out_dir),
        "batch_save_size": 3,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


# ----- a writer killed between the temporary file and the rename --------------------------------------------------
# The child blocks in os.replace (after the temporary file is written and fsynced) and says so; the parent kills it.
BLOCK_IN_REPLACE = """
import os, sys, time
def blocked(source, target):
    print("between", source, flush=True)
    time.sleep(600)
os.replace = blocked
"""

CHILD_BYTES = """
from pathlib import Path
from draftgen.rundir import write_bytes
target = Path(sys.argv[1])
write_bytes(target, b"new " * 50_000)
"""

CHILD_STORE = """
from pathlib import Path
from draftgen.generate.store import RunStore
from generate_helpers import row
from test_rundir import make_config
store = RunStore.open(make_config(Path(sys.argv[1])))
store.add(row("d")); store.add(row("e")); store.add(row("f"))  # the fourth shard's write blocks in the rename
"""


def _kill_between_write_and_rename(child: str, argument: Path) -> Path:
    """Run ``child`` with os.replace blocked; SIGKILL it once it is between the two. The temporary file's path."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", BLOCK_IN_REPLACE + child, str(argument)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the child is between write and rename (or dies)
        assert line.startswith("between "), (line, process.communicate(timeout=30))
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    return Path(line.split(" ", 1)[1].strip())


def test_a_writer_killed_before_its_rename_leaves_the_old_file_whole_and_the_next_open_cleans_up(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    target = folder / "notes.json"
    write_json(target, {"version": "old"})
    temporary = _kill_between_write_and_rename(CHILD_BYTES, target)
    assert temporary == temporary_path(target) == folder / ".notes.json.tmp"
    assert temporary.read_bytes() == b"new " * 50_000  # written whole and fsynced before the rename
    assert json.loads(target.read_text()) == {"version": "old"}  # the old file, whole
    with RunFolderLease.acquire(folder):
        assert not temporary.exists()  # the leftover is gone on the next open
    assert json.loads(target.read_text()) == {"version": "old"}


def test_a_store_killed_while_renaming_a_shard_keeps_every_whole_shard_and_resumes(tmp_path):
    config = make_config(tmp_path / "run")
    with RunStore.open(config) as store:
        for name in "abc":
            store.add(row(name))  # shard 1 and the manifest
    manifest_before = (tmp_path / "run" / MANIFEST).read_bytes()
    temporary = _kill_between_write_and_rename(CHILD_STORE, tmp_path / "run")
    shards = tmp_path / "run" / SHARDS
    assert temporary == shards / f".{shard_name(2)}.tmp" and temporary.exists()
    assert shard_paths(tmp_path / "run") == [shards / shard_name(1)]
    assert pl.read_parquet(shards / shard_name(1))["id"].to_list() == ["a", "b", "c"]  # whole
    assert (tmp_path / "run" / MANIFEST).read_bytes() == manifest_before  # never half-written
    with RunStore.open(config) as resumed:  # the lock died with the process; the leftover is removed
        assert not temporary.exists()
        assert resumed.done_ids == {"a", "b", "c"}
        for name in "def":
            resumed.add(row(name))
        resumed.close("complete")
    assert sorted(read_done_ids(tmp_path / "run").to_list()) == list("abcdef")


# ----- one temporary-name pattern, cleaned on open ----------------------------------------------------------------
def test_every_temporary_file_a_run_folder_can_hold_is_removed_when_it_is_opened(tmp_path):
    folder = tmp_path / "run"
    (folder / SHARDS).mkdir(parents=True)
    leftovers = [
        temporary_path(folder / name) for name in (MANIFEST, FAILED, REJECTED, ACCEPTANCE, PROGRESS)
    ] + [
        temporary_path(folder / SHARDS / shard_name(7)),
        folder / ".acceptance.parquet.tmp-4242",  # the names earlier versions gave their temporary files
        folder / ".progress.json.tmp-4242",
    ]
    for path in leftovers:
        path.write_bytes(b"half")
    kept = [folder / "notes.txt", folder / ".hidden", folder / SHARDS / "part-000001.parquet.bak"]
    for path in kept:
        path.write_bytes(b"mine")
    with RunStore.open(make_config(folder)):
        assert [p for p in leftovers if p.exists()] == []
    assert all(p.read_bytes() == b"mine" for p in kept)  # only temporary names are touched


def test_a_whole_run_writes_temporary_files_only_under_the_one_pattern_the_open_removes(
    instant_fleet, tmp_path, monkeypatch
):
    """Every temporary path a real generate session (and preflight) uses matches the pattern the lease clears,
    in a folder it clears: so a crash at any write leaves nothing a resume would not remove."""
    used: list[Path] = []
    real = write.temporary_path

    def recording(path: Path) -> Path:
        used.append(real(path))
        return used[-1]

    monkeypatch.setattr(write, "temporary_path", recording)
    fleet = instant_fleet()
    config = make_config(
        tmp_path / "run",
        servers=fleet.urls,
        model="Qwen/Qwen3.6-27B",
        limit=40,
        batch_save_size=10,
        max_tokens=64,
        max_truncated_rate=1.0,
        canary=False,
        status_interval_s=0.05,
        acceptance_interval_s=0.05,
    )

    async def run() -> None:
        await generate(config, await preflight(config), progress=False)

    asyncio.run(run())
    monkeypatch.undo()
    folder = tmp_path / "run"
    names = {p.name for p in used}
    assert {f".{MANIFEST}.tmp", f".{REJECTED}.tmp", f".{PROGRESS}.tmp", f".{shard_name(1)}.tmp"} <= names, (
        names
    )
    assert all(fnmatch(p.name, write.TEMPORARY_GLOB) for p in used), names
    assert {p.parent for p in used} <= {folder, folder / SHARDS}
    for path in used:  # a crash at any of these writes ...
        path.write_bytes(b"half")
    with RunStore.open(config):
        assert [p for p in used if p.exists()] == []  # ... is cleaned up by the next open


def test_one_module_renames_files_into_place_and_every_whole_file_write_goes_through_it():
    """``os.replace`` stands once in the package, and no module outside draftgen.rundir writes a whole file
    itself: the only write calls elsewhere write the temporary path ``replace_file`` hands them (or memory)."""
    replaces, direct = [], []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if (
                node.func.attr == "replace"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "os"
            ):
                replaces.append(relative)
            writes = ("write_text", "write_bytes", "write_parquet", "sink_parquet", "savefig", "copyfile")
            if node.func.attr in writes and not relative.startswith(("rundir/", "sim/")):
                target = node.args[-1] if node.func.attr == "copyfile" else (node.args or [None])[0]
                if not (isinstance(target, ast.Name) and target.id in ("temporary", "buffer")):
                    direct.append(f"{relative}:{node.lineno} {node.func.attr}")
    assert replaces == ["rundir/write.py"]
    assert direct == []


# ----- the lease --------------------------------------------------------------------------------------------------
class LockProbe:
    """A second opener, trying the folder's lock every millisecond from another thread until stopped."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.tries = 0
        self.got_it: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with open(self.folder / LOCK) as handle:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.got_it.append(time.monotonic())  # closing the handle lets go at once
                except BlockingIOError:
                    pass
            self.tries += 1
            time.sleep(0.001)

    def __enter__(self) -> LockProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_preflight_hands_its_lease_to_the_run_and_a_second_opener_is_refused_the_whole_time(
    instant_fleet, tmp_path, monkeypatch
):
    fleet = instant_fleet()
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 60, seed=4)
    config = make_config(
        tmp_path / "run",
        servers=fleet.urls,
        model="Qwen/Qwen3.6-27B",
        prompts=str(prompts),
        batch_save_size=20,
        max_tokens=64,
        max_truncated_rate=1.0,
        canary=False,
    )
    acquired, scanned = [], []
    real_acquire, real_scan = RunFolderLease.acquire.__func__, store_module.read_done_ids  # type: ignore[attr-defined]
    monkeypatch.setattr(
        RunFolderLease,
        "acquire",
        classmethod(lambda cls, *a, **k: acquired.append(a) or real_acquire(cls, *a, **k)),
    )
    monkeypatch.setattr(
        store_module, "read_done_ids", lambda out_dir: scanned.append(out_dir) or real_scan(out_dir)
    )
    released: list[float] = []  # when the run let go of the folder (at the end of generate)
    real_release = RunFolderLease.release
    monkeypatch.setattr(
        RunFolderLease, "release", lambda lease: released.append(time.monotonic()) or real_release(lease)
    )

    async def run():
        plan = await preflight(config)
        with LockProbe(tmp_path / "run") as probe:
            with pytest.raises(StoreError, match="another process"):
                RunStore.open(config)
            with pytest.raises(PreflightError, match="another process"):
                await preflight(config)
            await asyncio.sleep(0.3)  # the moment between the notebook's two cells
            result = await generate(config, plan, progress=False)
        return result, probe

    result, probe = asyncio.run(run())
    assert result.status == "complete" and result.stored == 60
    assert probe.tries > 50 and released
    # never free from preflight to the run's end (the probe may catch the folder between that and its own stop)
    assert [t for t in probe.got_it if t < released[0]] == []
    # One lease and one id scan for preflight and the run together (the two refused openers took none).
    assert len(scanned) == 1 and len(acquired) == 3
    monkeypatch.undo()
    RunStore.open(config).release()  # free once the run ended


def test_a_plan_not_run_lets_go_with_release_and_a_spent_plan_opens_the_folder_again(tmp_path):
    config = make_config(tmp_path / "run")
    plan = Plan(
        config=config,
        servers=[],
        checks=[],
        scan=PromptScan(),
        fingerprint=config.fingerprint(),
        store=RunStore.open(config),
    )
    with pytest.raises(RunFolderBusy, match="this process: a plan from an earlier preflight"):
        RunStore.open(config)  # the same process holds it: the message says what to do
    other = make_config(tmp_path / "run", max_tokens=99)
    with pytest.raises(ValueError, match="another config than preflight checked"):
        session_store(other, plan)
    store = session_store(config, plan)
    assert store is plan.store and store.holds_lease
    store.add(row("a"))
    store.close("interrupted")
    plan.release()
    assert not store.holds_lease
    again = session_store(config, plan)  # a plan whose session ended: the folder is opened anew
    assert again is not plan.store and again.holds_lease and again.done_ids == {"a"}
    again.release()


def test_a_lease_of_an_existing_folder_writes_nothing_and_is_refused_while_held(tmp_path):
    assert RunFolderLease.acquire_existing(tmp_path / "none") is None  # no lock file: no run folder
    with RunFolderLease.acquire(tmp_path / "run") as lease:
        assert lease.held and RunFolderLease.acquire_existing(tmp_path / "run") is None
        with pytest.raises(RunFolderBusy, match=rf"another process \(pid {os.getpid()}\)"):
            RunFolderLease.acquire(tmp_path / "run")
    before = (tmp_path / "run" / LOCK).read_bytes()
    existing = RunFolderLease.acquire_existing(tmp_path / "run")
    assert existing is not None and existing.held
    existing.release()
    assert (tmp_path / "run" / LOCK).read_bytes() == before


# ----- a full disk: one error type from the one write ------------------------------------------------------------
def _enospc_in_write(temporary: Path) -> None:
    temporary.write_bytes(b"half")
    raise OSError(errno.ENOSPC, "No space left on device")


def _edquot_in_write(temporary: Path) -> None:
    temporary.write_bytes(b"half")
    raise OSError(errno.EDQUOT, "Disk quota exceeded")


def _polars_text_in_write(temporary: Path) -> None:
    temporary.write_bytes(b"PAR1 half")
    raise pl.exceptions.ComputeError("parquet: underlying IO error: No space left on device (os error 28)")


@pytest.mark.parametrize("failing", [_enospc_in_write, _edquot_in_write, _polars_text_in_write])
def test_a_full_disk_however_reported_is_one_error_naming_the_file(tmp_path, failing):
    target = tmp_path / "acceptance.parquet"
    write_bytes(target, b"old")
    with pytest.raises(DiskFull) as caught:
        replace_file(target, failing)
    error = caught.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.path == target
    assert "acceptance.parquet" in str(error) and "no space left" in str(error)
    assert error.__cause__ is None and error.__suppress_context__  # one line, no chained traceback
    assert error._render_traceback_() == [f"DiskFull: {error}"]
    assert is_disk_full(error)
    assert (
        target.read_bytes() == b"old" and not temporary_path(target).exists()
    )  # its space given back at once


def test_a_full_disk_at_the_fsync_or_the_rename_is_the_same_error(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    write_text(target, "old")
    for name in ("fsync", "replace"):

        def full(*args: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr(os, name, full)
            with pytest.raises(DiskFull, match=r"manifest\.json"):
                write_text(target, "new")
        assert target.read_text() == "old" and not temporary_path(target).exists()


def test_other_failures_propagate_as_they_are_and_leave_the_temporary_file_to_the_clean_up(tmp_path):
    def broken(temporary: Path) -> None:
        temporary.write_bytes(b"half")
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        replace_file(tmp_path / "x.json", broken)
    assert temporary_path(tmp_path / "x.json").exists() and not (tmp_path / "x.json").exists()


def test_the_in_place_fallback_never_grows_a_file_unless_told_to(tmp_path):
    path = tmp_path / "manifest.json"
    write_text(path, "0123456789")
    assert not overwrite_in_place(path, b"0123456789-longer")  # would need room: refused, file untouched
    assert path.read_text() == "0123456789"
    assert overwrite_in_place(path, b"short") and path.read_text() == "short"
    assert overwrite_in_place(path, b"grown past the old size", may_grow=True)
    assert path.read_text() == "grown past the old size"
    assert not overwrite_in_place(tmp_path / "absent.json", b"x")


def test_a_real_full_filesystem_raises_disk_full_and_keeps_the_old_file(tmp_path):
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(
            f"cannot mount a 1 MB tmpfs at {mount_point} ({done.stderr.strip() or done.returncode}): this test "
            "needs root (CI runs as root) to fill a real filesystem"
        )
    try:
        target = mount_point / "results.parquet"
        write_parquet(target, pl.DataFrame({"x": [1, 2, 3]}))
        old = target.read_bytes()
        ballast = mount_point / "ballast"
        with open(ballast, "wb") as handle:  # leave ~20 KB
            stats = os.statvfs(mount_point)
            handle.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - 20_000))
        big = pl.DataFrame({"text": [os.urandom(64).hex() for _ in range(20_000)]})  # ~2.6 MB, incompressible
        with pytest.raises(DiskFull, match=r"results\.parquet"):
            write_parquet(target, big, compression="uncompressed")
        assert target.read_bytes() == old and not temporary_path(target).exists()
        with pytest.raises(DiskFull, match=r"notes\.txt"):
            write_text(mount_point / "notes.txt", "x" * 200_000)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_store_on_a_full_disk_records_it_through_the_in_place_manifest(tmp_path, monkeypatch):
    """When not even the manifest's temporary file fits, the manifest is rewritten in its own blocks."""
    config = make_config(tmp_path / "run", batch_save_size=1)
    store = RunStore.open(config)
    # 30 shards: the indented manifest leaves room for the compact one that records the ending
    for index in range(30):
        store.add(row(f"p{index}"))

    def full(path: Path, writer: object) -> Path:  # not even a temporary file fits
        raise DiskFull(Path(path), OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(write, "replace_file", full)
    with pytest.raises(DiskFull) as caught:
        store.add(row("last"))
    size = (tmp_path / "run" / MANIFEST).stat().st_size
    assert store.close_disk_full(caught.value)
    monkeypatch.undo()
    store.release()
    assert (tmp_path / "run" / MANIFEST).stat().st_size <= size  # rewritten in its own blocks
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None and manifest["status"] == "disk full"
    assert manifest["disk_full"]["path"].endswith(shard_name(31)) and manifest["counts"]["done"] == 30
    assert manifest["sessions"][-1]["status"] == "disk full"
