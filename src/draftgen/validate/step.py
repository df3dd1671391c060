"""The validate step, whole: validate.ipynb (and any other face) calls ``run`` and then only shows its result.

``run`` checks every sample, writes the records and summary, and publishes the export only when the gate passed
(``finalize_export``); then, and only then, it marks the folder finished (``draftgen.rundir.run_folder``). A gate
that failed leaves the export staged and the folder unfinished, and ``require_fit_to_train`` (the notebook's gate
cell) raises with the reason, so papermill and ``draftgen run`` stop there (docs/validate.md, "Gate and export").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftgen.rundir import finish_run, open_run
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import ValidationResult, finalize_export, validate_generation


@dataclass(frozen=True)
class ValidateResult:
    """A validation: what every view reads, and the published export (None: the gate failed, nothing published)."""

    result: ValidationResult
    export_dir: Path | None


def run(config: ValidateConfig) -> ValidateResult:
    """Validate as ``config`` says and write the run folder, ``config.out_dir``; the export only past the gate."""
    out = open_run(config.out_dir, config.public_dict())
    result = validate_generation(config)
    if not result.passed:
        return ValidateResult(result, None)
    export_dir = finalize_export(result)
    finish_run(out)
    return ValidateResult(result, export_dir)
