"""Which notebook cell wrote which file: an audit hook in every kernel, for the tests that a cell other than the
step's ``run(config)`` writes nothing.

``kernel_env(tmp, root)`` is an environment whose kernels (IPython reads ``$IPYTHONDIR/profile_default/startup``)
install a ``sys.addaudithook`` hook before the first cell. It records every event that changes the file system
under ``root`` — an ``open`` for writing, appending or creating, a rename or replace, a remove, a mkdir or rmdir, a
truncate, shutil's tree and copy operations — with the execution count of the cell being run, one JSON line each,
to a log. Every way the package writes a file passes at least one of them (``replace_file`` opens a temporary
name for writing and renames it; polars' own writers write to that temporary name, and a folder publish stages
its files by ``open``), and so do a cell's own ``open``, ``Path.write_text``, ``savefig``. ``cell_writes`` maps
the events back to the executed notebook's cells by their execution counts.
"""

from __future__ import annotations

import json
from pathlib import Path

STARTUP = r"""
import json, os, sys

_LOG = open(os.environ["DRAFTGEN_WRITE_AUDIT_LOG"], "a", buffering=1)
_ROOT = os.path.realpath(os.environ["DRAFTGEN_WRITE_AUDIT_ROOT"])
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    "os.rename": 2, "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.truncate": 1, "os.link": 2,
    "os.symlink": 2, "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.copytree": 2, "shutil.move": 2,
}

try:
    from IPython import get_ipython as _ipython
except ImportError:
    _ipython = lambda: None


def _under_root(path):
    if isinstance(path, int):
        return False
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    return os.path.realpath(os.path.abspath(text)).startswith(_ROOT + os.sep)


def _record(event, paths):
    shell = _ipython()
    # IPython counts the cell being run as execution_count - 1 (the count is raised when a cell starts)
    count = shell.execution_count - 1 if shell is not None else None
    _LOG.write(json.dumps({"event": event, "paths": [os.fsdecode(os.fspath(p)) for p in paths], "cell": count}) + "\n")


def _audit(event, args, _paths=_PATH_EVENTS, _flags=_WRITE_FLAGS):
    try:
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _flags)
            if writes and _under_root(path):
                _record(event, [path])
        elif event in _paths:
            paths = [p for p in args[: _paths[event]] if p is not None and not isinstance(p, int)]
            if any(_under_root(p) for p in paths):
                _record(event, paths)
    except Exception:  # at interpreter shutdown the module's names are gone: nothing is written then
        pass


sys.addaudithook(_audit)
"""


def kernel_env(tmp: Path, root: Path, base: dict[str, str]) -> tuple[dict[str, str], Path]:
    """(an environment whose kernels log every write under ``root``, the log's path)."""
    ipython_dir = tmp / "ipython-audit"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-write-audit.py").write_text(STARTUP)
    log = tmp / "writes.jsonl"
    log.touch()
    env = {
        **base,
        "IPYTHONDIR": str(ipython_dir),
        "DRAFTGEN_WRITE_AUDIT_LOG": str(log),
        "DRAFTGEN_WRITE_AUDIT_ROOT": str(root),
    }
    return env, log


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def cell_writes(log: Path, executed: Path) -> dict[str, list[dict]]:
    """The events of ``log`` that fall in the cells of the executed notebook ``executed``, by cell source (the
    source of the cell whose execution count the kernel had when the event happened)."""
    cells = json.loads(executed.read_text())["cells"]
    by_count = {
        cell["execution_count"]: "".join(cell["source"])
        for cell in cells
        if cell["cell_type"] == "code" and cell.get("execution_count") is not None
    }
    found: dict[str, list[dict]] = {}
    for event in events(log):
        if event["cell"] in by_count:
            found.setdefault(by_count[event["cell"]], []).append(event)
    return found
