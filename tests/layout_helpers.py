"""A run folder against the declared layout (draftgen.rundir.layout): which declared entry each file is."""

from __future__ import annotations

from pathlib import Path

from draftgen.rundir.layout import NOTEBOOK_FILES, RUN_FILES, Entry
from draftgen.steps import Step

STEP_PLACEHOLDER = "<step>"  # NOTEBOOK_FILES names the executed notebook after its step


def declared(step: Step) -> list[Entry]:
    """Every entry a run folder of ``step`` may hold: its own files, every run's, a notebook run's."""
    return [*step.files, *RUN_FILES, *NOTEBOOK_FILES]


def files_in(folder: Path) -> list[str]:
    """Every file under ``folder``, as paths relative to it with ``/``."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _matches(entry: Entry, relative: str, step: Step) -> bool:
    return Entry(entry.path.replace(STEP_PLACEHOLDER, step.name), entry.what).matches(relative)


def layout_shape(folder: Path, step: Step) -> set[str]:
    """The declared entries (their paths) the files of ``folder`` are; a file no entry declares fails here."""
    shape, undeclared = set(), []
    for relative in files_in(folder):
        entry = next((e for e in declared(step) if _matches(e, relative, step)), None)
        if entry is None:
            undeclared.append(relative)
        else:
            shape.add(entry.path)
    assert not undeclared, f"{folder}: files the layout does not declare for {step.name}: {undeclared}"
    return shape


def missing(folder: Path, step: Step, *, notebook: bool) -> list[str]:
    """The entries every finished run writes (no ``when``) that ``folder`` lacks."""
    shape = layout_shape(folder, step)
    always = [*step.files, *RUN_FILES, *(NOTEBOOK_FILES if notebook else ())]
    return [e.path for e in always if not e.when and e.path not in shape]
