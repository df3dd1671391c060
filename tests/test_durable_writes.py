"""Every write durable: validate's export and the executed notebook, killed at each step of their writes.

A forked child performs the write with its file-system calls counted (open, fsync, rename, replace, rmtree, the
folder exchange) and SIGKILLs itself right after the Nth; the parent then looks at what is on disk. For every N
the old file (or folder) must be whole, or the new one; opening the run folder afterwards (its lease clears what
interrupted writes left) must leave a whole one and nothing else. The same harness run over papermill's own local
handler finds a torn notebook: the test can fail.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from papermill.iorw import LocalHandler, papermill_io, write_ipynb

from draftgen.rundir import DiskFull, RunFolderLease, clear_leftovers, notebook_io, publish
from draftgen.rundir.layout import EXPORT, EXPORT_STAGING, LOCK
from draftgen.rundir.publish import StreamedFile, previous_path, publish_folder
from draftgen.rundir.write import temporary_path
from draftgen.runner import RunPlan, execute
from draftgen.validate import export

HOOKED = ((os, "replace"), (os, "rename"), (os, "fsync"), (shutil, "rmtree"), (builtins, "open"))


def _counted(real: Callable[..., Any], counter: list[int], kill_after: int | None) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        counter[0] += 1
        if counter[0] == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return counted


def _in_child(
    operation: Callable[[], object], kill_after: int | None, tally: Path, extra: tuple[tuple[Any, str], ...]
) -> int:
    """Run ``operation`` in a forked child, every hooked call counted and the child SIGKILLed right after call
    number ``kill_after``; the child's exit code (-9: killed). ``tally`` gets the number of calls."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            counter = [0]
            for owner, name in HOOKED + extra:
                setattr(owner, name, _counted(getattr(owner, name), counter, kill_after))
            operation()
            fd = os.open(tally, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # os.open, os.write: not hooked
            os.write(fd, str(counter[0]).encode())
            os.close(fd)
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def kill_at_every_step(
    tmp_path: Path,
    setup: Callable[[Path], Callable[[], object]],
    check: Callable[[Path, int], str],
    extra: tuple[tuple[Any, str], ...] = (),
) -> list[str]:
    """For each N from 1 to the number of hooked calls the write makes: a fresh ``setup(folder)`` (returning the
    write), the write killed after call N, ``check(folder, N)`` naming the state found. The states, in order."""
    rehearsal = tmp_path / "rehearsal"
    tally = tmp_path / "tally"
    assert _in_child(setup(rehearsal), None, tally, extra) == 0
    calls = int(tally.read_text())
    assert calls >= 1, calls
    states = []
    for n in range(1, calls + 1):
        folder = tmp_path / f"kill-{n}"
        code = _in_child(setup(folder), n, tally, extra)
        assert code == -signal.SIGKILL, f"the write after call {n} of {calls} was not killed (exit {code})"
        states.append(check(folder, n))
    return states


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# ----- validate's export ------------------------------------------------------------------------------------------
OLD_EXPORT = {
    "train.jsonl": b'{"id": "old"}\n',
    "counts.json": b'{"out": 1}\n',
    "holdout/prompts.jsonl": b"o\n",
}
NEW_EXPORT = {
    "train.jsonl": b'{"id": "new"}\n' * 50,
    "counts.json": b'{"out": 50}\n',
    "holdout/prompts.jsonl": b"n\n",
    "tokens/part-00000.parquet": b"PAR1",
}


def _files(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _export_setup(folder: Path) -> Callable[[], None]:
    _files(folder / EXPORT, OLD_EXPORT)
    _files(folder / EXPORT_STAGING, NEW_EXPORT)
    return lambda: export.finalize(folder)


def _export_state(folder: Path, n: int) -> str:
    """old / new (export/ whole), or aside (export/ missing, the old one whole beside it) — then the open
    recovers a whole export/ and leaves nothing of the swap."""
    final, previous = folder / EXPORT, previous_path(folder / EXPORT)
    if final.is_dir():
        found = snapshot(final)
        state = "old" if found == OLD_EXPORT else "new" if found == NEW_EXPORT else "torn"
    elif previous.is_dir() and snapshot(previous) == OLD_EXPORT:
        state = "aside"
    else:
        state = "missing"
    with RunFolderLease.acquire(folder):
        pass
    assert snapshot(final) in (OLD_EXPORT, NEW_EXPORT), f"after call {n} and the open: {snapshot(final)}"
    assert not previous.exists(), f"after call {n}: the open left {previous}"
    return state


def test_an_export_published_by_exchange_is_whole_at_every_step_of_the_swap(tmp_path):
    for name in "ab":
        (tmp_path / name).mkdir()
    assert publish.exchange(tmp_path / "a", tmp_path / "b"), "this filesystem has no RENAME_EXCHANGE"
    states = kill_at_every_step(tmp_path, _export_setup, _export_state, extra=((publish, "exchange"),))
    assert set(states) == {"old", "new"}, states  # never torn, never missing, never aside
    assert states.index("new") > states.index("old") and states[-1] == "new"


def test_an_export_published_without_exchange_is_whole_or_recoverable_at_every_step(tmp_path, monkeypatch):
    """Where the kernel or filesystem has no RENAME_EXCHANGE: the old export renamed aside, the new one in."""
    monkeypatch.setattr(publish, "exchange", lambda first, second: False)
    states = kill_at_every_step(tmp_path, _export_setup, _export_state, extra=((publish, "exchange"),))
    assert set(states) == {"old", "aside", "new"}, states  # "aside": restored by the next open (checked)
    assert states[-1] == "new"


def test_a_first_export_is_renamed_into_place_whole(tmp_path):
    def setup(folder: Path) -> Callable[[], None]:
        _files(folder / EXPORT_STAGING, NEW_EXPORT)
        return lambda: export.finalize(folder)

    def state(folder: Path, n: int) -> str:
        if not (folder / EXPORT).exists():
            return "none"
        assert snapshot(folder / EXPORT) == NEW_EXPORT, f"after call {n}: a partial export"
        return "new"

    states = kill_at_every_step(tmp_path, setup, state)
    assert states[0] == "none" and states[-1] == "new"


def test_a_full_disk_while_publishing_is_disk_full_and_the_old_export_stays(tmp_path, monkeypatch):
    _export_setup(tmp_path)
    real = os.fsync

    def full(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("train.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFull, match=r"no space left .* while writing export"):
        export.finalize(tmp_path)
    assert snapshot(tmp_path / EXPORT) == OLD_EXPORT


def test_a_full_disk_while_streaming_an_export_file_is_disk_full_naming_it(tmp_path):
    (tmp_path / "train.jsonl").symlink_to("/dev/full")  # every write there ends in ENOSPC
    staged = StreamedFile(tmp_path / "train.jsonl")
    staged.write("x" * 100)  # buffered: the full disk shows when it is flushed
    with pytest.raises(DiskFull, match=r"while writing train\.jsonl"):
        staged.close()
    staged.close()  # closed all the same: a second close has nothing to do
    with pytest.raises(DiskFull, match=r"while writing train\.jsonl"):
        StreamedFile(tmp_path / "train.jsonl").write("y" * 100_000)  # past the buffer: at the write itself


def test_publishing_replaces_a_folder_and_the_open_finishes_an_interrupted_one(tmp_path):
    final = tmp_path / "export"
    _files(final, OLD_EXPORT)
    aside = previous_path(final)
    os.rename(final, aside)  # cut between the fallback's two renames
    assert clear_leftovers(tmp_path) == [final]
    assert snapshot(final) == OLD_EXPORT and not aside.exists()
    _files(tmp_path / "staged", NEW_EXPORT)
    publish_folder(tmp_path / "staged", final)
    assert snapshot(final) == NEW_EXPORT and not (tmp_path / "staged").exists() and not aside.exists()


def test_the_open_clears_every_subfolder_but_another_run_folders(tmp_path):
    run = tmp_path / "run"
    leftovers = [temporary_path(run / "a.json"), temporary_path(run / "plots" / "p.png")]
    leftovers.append(temporary_path(run / "export.partial" / "tokens" / "part-00001.parquet"))
    nested = run / "inner-run"
    theirs = temporary_path(nested / "their.json")
    for path in [*leftovers, theirs]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    (nested / LOCK).write_text("pid 1")  # another run folder: its temporary files are its writer's
    with RunFolderLease.acquire(run):
        assert [p for p in leftovers if p.exists()] == []
    assert theirs.exists()


# ----- the executed notebook --------------------------------------------------------------------------------------
def _notebook(text: str, cells: int) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"print({text!r})") for _ in range(cells)]
    return nb


OLD_NB, NEW_NB = nbformat.writes(_notebook("old", 1)), nbformat.writes(_notebook("new", 400))


def _notebook_state(folder: Path, n: int) -> str:
    text = (folder / "run.ipynb").read_text()
    state = {OLD_NB: "old", NEW_NB: "new"}.get(text, "torn")
    if state != "torn":
        nbformat.reads(text, as_version=4)  # a notebook papermill and the report read back
    with RunFolderLease.acquire(folder):
        assert not temporary_path(folder / "run.ipynb").exists()
    return state


def test_the_executed_notebook_saved_through_papermill_is_whole_at_every_step(tmp_path):
    notebook_io.register()
    assert isinstance(papermill_io.get_handler(str(tmp_path / "run.ipynb")), notebook_io.AtomicLocalHandler)

    def setup(folder: Path) -> Callable[[], None]:
        folder.mkdir(parents=True)
        (folder / "run.ipynb").write_text(OLD_NB)
        return lambda: write_ipynb(nbformat.reads(NEW_NB, as_version=4), str(folder / "run.ipynb"))

    states = kill_at_every_step(tmp_path, setup, _notebook_state)
    assert "torn" not in states and states[0] == "old" and states[-1] == "new", states


def test_papermills_own_handler_killed_mid_save_leaves_a_torn_notebook(tmp_path):
    """The control: the same kills over a plain open(path, "w") find the notebook neither old nor new."""

    def setup(folder: Path) -> Callable[[], None]:
        folder.mkdir(parents=True)
        (folder / "run.ipynb").write_text(OLD_NB)
        return lambda: LocalHandler().write(NEW_NB, str(folder / "run.ipynb"))

    states = kill_at_every_step(tmp_path, setup, _notebook_state)
    assert "torn" in states, states


def test_draftgen_run_saves_the_executed_notebook_through_the_atomic_write_and_opens_its_folder(
    tmp_path, monkeypatch
):
    written: list[Path] = []
    real = notebook_io.write_text
    monkeypatch.setattr(
        notebook_io, "write_text", lambda path, text: written.append(path) or real(path, text)
    )
    notebook = tmp_path / "probe.ipynb"
    nbformat.write(_notebook("hello", 2), notebook)
    run_dir = tmp_path / "outputs" / "probe" / "p"
    leftover = temporary_path(run_dir / "plots" / "a.png")
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half")
    plan = RunPlan(notebook=notebook, run_dir=run_dir, parameters={}, name="p")
    execute(plan, html=False, log_output=False)
    assert not leftover.exists()  # cleared when the run folder was opened
    assert (
        plan.executed_path in written and len(written) >= 3
    )  # papermill saves after each cell, then at the end
    executed = json.loads(plan.executed_path.read_text())
    assert "hello" in "".join(executed["cells"][-1]["outputs"][0]["text"])


def test_a_full_disk_while_saving_the_notebook_is_disk_full_and_the_old_notebook_stays(tmp_path, monkeypatch):
    notebook_io.register()
    path = tmp_path / "run.ipynb"
    path.write_text(OLD_NB)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(DiskFull, match=r"while writing run\.ipynb"):
        write_ipynb(nbformat.reads(NEW_NB, as_version=4), str(path))
    assert path.read_text() == OLD_NB and not temporary_path(path).exists()
