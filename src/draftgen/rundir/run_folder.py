"""A step's run folder opened and finished one way, whichever face runs the step (docs/design.md, "Run folders").

``open_run`` is the first thing a step's ``run(config)`` does with its folder: a finished run (``.complete``) is
refused, never overwritten; what interrupted writes left is cleared under the folder's lease; the parameters the
step runs with are recorded (``parameters.yaml``). ``finish_run`` marks the folder finished, the last thing
``run(config)`` does once the step's whole work is written. ``draftgen run`` (papermill), ``draftgen tune``, the
demo and a notebook run top to bottom in JupyterLab all reach the folder through these, so each leaves the same
shape; the runner adds only the executed notebook and its report. A new run that a check refused before any work
is marked ``.refused`` (``record_refusal``, by the runner): its name is free, and the next ``open_run`` there
removes the mark.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from draftgen.rundir.layout import COMPLETE_MARKER, PARAMETERS, REFUSED_MARKER
from draftgen.rundir.lease import RunFolderError, RunFolderLease
from draftgen.rundir.write import write_text

ADVICE = "set another out_dir (draftgen run: another --name)"


def is_finished(folder: str | Path) -> bool:
    """Whether ``folder`` holds a finished run (its ``.complete`` marker)."""
    return (Path(folder) / COMPLETE_MARKER).exists()


def refuse_finished(folder: str | Path, advice: str = ADVICE) -> None:
    """Raise ``RunFolderError`` when ``folder`` holds a finished run: finished runs are never overwritten."""
    if is_finished(folder):
        raise RunFolderError(f"run {folder} already finished; {advice} (finished runs are never overwritten)")


def open_run(folder: str | Path, parameters: Mapping[str, Any], *, advice: str = ADVICE) -> Path:
    """Open ``folder`` for one run of a step: refuse a finished run, clear what interrupted writes left (under the
    folder's lease, for that moment: ``RunFolderBusy`` while another process writes there), record
    ``parameters.yaml``. Returns the folder."""
    folder = Path(folder)
    refuse_finished(folder, advice)
    with RunFolderLease.acquire(folder, advice=advice):
        (folder / REFUSED_MARKER).unlink(
            missing_ok=True
        )  # a run is under way here now: no longer a free name
    record_parameters(folder, parameters)
    return folder


def was_refused(folder: str | Path) -> bool:
    """Whether ``folder`` holds only what a refused new run left (``.refused``): its name is free again."""
    return (Path(folder) / REFUSED_MARKER).exists()


def record_refusal(folder: str | Path, reason: str) -> None:
    """Mark ``folder``, new before a run that a check refused before any work, as free for the next run of its
    name (``.refused``, holding the time and the reason). Nothing is written where the folder was never made."""
    if Path(folder).is_dir():
        write_text(Path(folder) / REFUSED_MARKER, f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {reason}\n")


def record_parameters(folder: str | Path, parameters: Mapping[str, Any]) -> None:
    """``parameters.yaml``: the parameters of the run in ``folder``, keys sorted."""
    write_text(Path(folder) / PARAMETERS, yaml.safe_dump(dict(parameters), sort_keys=True))


def finish_run(folder: str | Path) -> None:
    """Mark the run in ``folder`` finished (``.complete``, holding the time): from now on it is only read."""
    write_text(Path(folder) / COMPLETE_MARKER, time.strftime("%Y-%m-%dT%H:%M:%S%z"))
