"""The files a ``draftgen serve`` run leaves in its folder: ``servers.yaml`` and ``commands.sh``."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from draftgen.rundir import write_text
from draftgen.serve.launch import LaunchSpec, shell_line


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)


def write_servers_yaml(path: Path, urls: list[str], model: str) -> None:
    """Papermill parameters (``-f``): the ``servers`` list and the ``model`` name requests must use."""
    header = (
        f"# written by draftgen serve at {time.strftime('%Y-%m-%d %H:%M:%S')}; valid while it runs.\n"
        "# Use: papermill NOTEBOOK OUT -f params/YOUR.yaml -f THIS_FILE (the later -f wins).\n"
    )
    body = yaml.safe_dump({"servers": list(urls), "model": model}, sort_keys=False)
    _write_atomically(path, header + body)


def write_commands(path: Path, specs: list[LaunchSpec]) -> None:
    """The exact command lines of the run, for the record (the supervisor ran each in its own group)."""
    lines = ["# The processes draftgen serve started, one per line (not meant to be run as a script)."]
    lines += [shell_line(spec) for spec in specs]
    _write_atomically(path, "\n".join(lines) + "\n")
