"""Relative path parameters resolve against the project root, wherever the kernel runs.

JupyterLab starts a notebook's kernel in ``notebooks/``, papermill and ``draftgen run`` in the directory they
are given: the same ``out_dir: outputs/generate/x`` would land in two places if each kernel read it against its
own working directory. Every path parameter is therefore resolved once, when the config is built, by one rule:

1. an absolute path (or ``~/...``) is used as given;
2. a relative path is joined to the **project root**, which is
   a. ``$DRAFTGEN_ROOT`` when set (an installed draftgen with notebooks kept elsewhere: point it at that folder),
   b. else the nearest directory at or above the working directory that holds a ``notebooks/`` folder beside a
      ``pyproject.toml`` or a ``params/`` folder (this checkout, from the root, ``notebooks/`` or any folder below),
   c. else the working directory itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT_ENV = "DRAFTGEN_ROOT"
# A project root holds notebooks/ and at least one of these beside it.
ROOT_MARKERS = ("pyproject.toml", "params")


def project_root(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The directory relative path parameters are resolved against (rule in the module docstring)."""
    environ = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else Path(cwd).absolute()
    explicit = environ.get(ROOT_ENV, "").strip()
    if explicit:
        return Path(os.path.normpath(here / Path(explicit).expanduser()))
    for folder in (here, *here.parents):
        if (folder / "notebooks").is_dir() and any((folder / m).exists() for m in ROOT_MARKERS):
            return folder
    return here


def resolve_path(path: str | Path, root: Path | None = None) -> Path:
    """``path`` as given when absolute, else joined to ``root`` (default: ``project_root()``), normalized."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        return Path(os.path.normpath(candidate))
    base = project_root() if root is None else root
    return Path(os.path.normpath(base / candidate))


def resolve_parameter(value: str) -> str:
    """A config validator for a path parameter: "" stays "" (unset), anything else becomes absolute."""
    return str(resolve_path(value)) if value else value


def root_note(value: str | Path) -> str:
    """For error messages: where a relative ``value`` was looked for ("" for an absolute one)."""
    if not value or Path(value).expanduser().is_absolute():
        return ""
    return f"; relative paths are read from the project root {project_root()}"
