"""Run a draftgen notebook the production way: ``draftgen run NOTEBOOK --name RUN -p KEY VALUE ...``.

draftgen is the project's own venv's (``DRAFTGEN_BIN``), as an operator runs it beside an SGLang environment; this
pytest runs in the SGLang venv, so it never imports draftgen and reads the run folders' files itself. A run that
fails raises with draftgen's output and what the executed notebook printed. ``start_run`` leaves the run going
(for tests that kill its kernel, the client process, mid-run).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import polars as pl
import psutil

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 900  # a whole notebook on two shared cores, with SGLang servers beside it


class NotebookRunFailed(AssertionError):
    pass


def run_command(
    draftgen: str, notebook: str, out_root: Path, name: str, params: dict, *extra: str
) -> list[str]:
    command = [draftgen, "run", notebook, "--name", name, "--out-root", str(out_root), "--no-html", *extra]
    for key, value in params.items():
        command += ["-p", key, value if isinstance(value, str) else json.dumps(value)]
    return command


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def notebook_text(executed: Path) -> str:
    """Everything the executed notebook printed, displayed or raised."""
    nb = json.loads(executed.read_text())
    parts = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", "")))
            if output.get("ename"):
                parts.append(f"{output['ename']}: {output.get('evalue', '')}")
            for kind, value in output.get("data", {}).items():
                if kind.startswith("text/"):
                    parts.append("".join(value) if isinstance(value, list) else str(value))
    return "\n".join(parts)


def failure(notebook: str, run_dir: Path, code: int | None, output: str) -> NotebookRunFailed:
    executed = run_dir / f"{notebook}.ipynb"
    text = notebook_text(executed)[-6000:] if executed.exists() else "(no executed notebook)"
    return NotebookRunFailed(
        f"draftgen run {notebook} exited {code}\noutput:\n{output[-4000:]}\nnotebook output:\n{text}"
    )


def draftgen_run(draftgen: str, notebook: str, out_root: Path, name: str, params: dict, *extra: str) -> Path:
    """Execute ``notebook`` into ``out_root/<notebook>/<name>/`` and return that folder."""
    done = subprocess.run(
        run_command(draftgen, notebook, out_root, name, params, *extra),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=_env(),
        cwd=REPO,
    )
    run_dir = out_root / notebook / name
    if done.returncode != 0:
        raise failure(notebook, run_dir, done.returncode, done.stdout + done.stderr)
    return run_dir


def start_run(
    draftgen: str, notebook: str, out_root: Path, name: str, params: dict, *extra: str
) -> subprocess.Popen:
    """The same run, left going in its own session (stdout and stderr together)."""
    return subprocess.Popen(
        run_command(draftgen, notebook, out_root, name, params, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, notebook: str, run_dir: Path, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """Wait for a started run; its output, or NotebookRunFailed."""
    output, _ = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise failure(notebook, run_dir, proc.returncode, output)
    return output


def kernel_of(proc: subprocess.Popen, timeout_s: float = 120.0) -> psutil.Process:
    """The ipykernel process of a started run: the client, where generate's requests come from."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            if "ipykernel" in " ".join(child.cmdline()):
                return child
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before its kernel was seen:\n{proc.stdout.read()}")
        time.sleep(0.1)
    raise AssertionError("no kernel process found")


def shards(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "shards").glob("part-*.parquet"))


def wait_for_shards(run_dir: Path, count: int, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(shards(run_dir)) < count:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {count} shard(s):\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} shard(s) in {run_dir} after {timeout_s:.0f} s")
        time.sleep(0.05)


def wait_for_a_row_from(server: str, run_dir: Path, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    """Until a stored shard holds a row ``server`` answered (the first shard alone may be another server's)."""
    wait_for_rows_from(server, 1, run_dir, proc, timeout_s)


def wait_for_rows_from(
    server: str, count: int, run_dir: Path, proc: subprocess.Popen, timeout_s: float = 300.0
) -> None:
    """Until the stored shards hold ``count`` rows that ``server`` answered."""
    deadline = time.monotonic() + timeout_s
    read: set[Path] = set()
    found = 0
    while True:
        for shard in shards(run_dir):
            if shard not in read:
                read.add(shard)
                found += int((pl.read_parquet(shard, columns=["server"])["server"] == server).sum())
                if found >= count:
                    return
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended with {found} row(s) from {server} stored:\n{proc.stdout.read()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"{found} row(s) from {server} in {run_dir} after {timeout_s:.0f} s")
        time.sleep(0.05)


def stored_rows(run_dir: Path) -> pl.DataFrame:
    """Every stored row of a generate run folder (each shard whole and readable)."""
    found = shards(run_dir)
    assert found, f"no shards in {run_dir}"
    return pl.concat([pl.read_parquet(s) for s in found], how="diagonal_relaxed")


def failed_rows(run_dir: Path) -> pl.DataFrame:
    path = run_dir / "failed.parquet"
    return pl.read_parquet(path) if path.exists() else pl.DataFrame()


def assert_exactly_once(run_dir: Path, expected: list[str]) -> pl.DataFrame:
    rows = stored_rows(run_dir)
    ids = rows["id"].to_list()
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f"stored more than once: {twice}"
    assert set(ids) == set(expected), (
        f"missing {sorted(set(expected) - set(ids))}, unexpected {sorted(set(ids) - set(expected))}"
    )
    return rows
