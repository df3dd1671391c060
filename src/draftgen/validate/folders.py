"""Several generation folders read as one corpus: the n shards (``shard: "i/n"``) of one prompt file.

Each client node writes its own generate ``out_dir``. ``open_generations`` opens every folder (schemas checked
as for one), then checks from their manifests that they belong together — the same generation parameters (the
fingerprint without ``shard``) and the same prompt file — and raises ``GenerationDataError`` naming the folders
and the values that disagree (folders that split the file in different ways are a warning). Whether their ids are disjoint and
cover the prompt file is ``coverage.py``'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgen.generate.config import FINGERPRINT_FIELDS, FINGERPRINT_SINCE, parse_shard
from draftgen.validate.reader import GenerationDataError, GenerationOutput, open_generation


@dataclass(frozen=True)
class FolderInfo:
    """What one folder's manifest says about the data in it (None: not recorded)."""

    label: str  # the folder as given: the ``folder`` column of the records
    shard: tuple[int, int] | None  # (i, n); None = the whole prompt file
    limit: int
    prompt_file: str | None
    generation: dict[str, Any] | None  # the fingerprint fields except shard


@dataclass(frozen=True)
class GenerationSet:
    """One or more generation folders validated as one corpus, in the order given."""

    outputs: tuple[GenerationOutput, ...]
    folders: tuple[FolderInfo, ...]
    prompt_file: str | None  # the prompt file the folders were generated from (or the override)
    warnings: tuple[str, ...]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(f.label for f in self.folders)

    @property
    def rows(self) -> int:
        return sum(o.rows for o in self.outputs)

    @property
    def shards(self) -> tuple[Path, ...]:
        return tuple(s for o in self.outputs for s in o.shards)

    @property
    def directories(self) -> tuple[Path, ...]:
        return tuple(o.directory for o in self.outputs)

    @property
    def manifests(self) -> tuple[dict[str, Any] | None, ...]:
        return tuple(o.manifest for o in self.outputs)

    def describe(self) -> str:
        """``3 folders (0/3, 1/3, 2/3)`` or the one folder's path."""
        if len(self.outputs) == 1:
            return str(self.outputs[0].directory)
        parts = ", ".join(_shard_text(f.shard) for f in self.folders)
        return f"{len(self.outputs)} folders ({parts})"


def _shard_text(shard: tuple[int, int] | None) -> str:
    return "whole file" if shard is None else f"{shard[0]}/{shard[1]}"


def folder_info(output: GenerationOutput) -> FolderInfo:
    """Read shard, limit, prompt file and generation parameters from a folder's manifest (if any)."""
    label = str(output.directory)
    manifest = output.manifest
    if manifest is None:
        return FolderInfo(label=label, shard=None, limit=0, prompt_file=None, generation=None)
    parameters = manifest.get("parameters") if isinstance(manifest.get("parameters"), dict) else {}
    fields = manifest.get("fingerprint_fields")
    if not isinstance(fields, dict):  # an older manifest: the same values are among the parameters
        fields = {k: parameters[k] for k in (*FINGERPRINT_FIELDS, "shard") if k in parameters} or None
    try:
        shard = parse_shard((fields or {}).get("shard", parameters.get("shard")))
    except ValueError as exc:
        raise GenerationDataError(f"{output.directory}/manifest.json: shard is unreadable ({exc})") from None
    prompts = manifest.get("prompts")
    prompt_file = prompts.get("path") if isinstance(prompts, dict) else None
    limit = parameters.get("limit", 0)
    return FolderInfo(
        label=label,
        shard=shard,
        limit=limit if isinstance(limit, int) and limit > 0 else 0,
        prompt_file=str(prompt_file) if prompt_file else None,
        # a field added to the fingerprint later (turns) is absent from older manifests: its value then was the default
        generation={**FINGERPRINT_SINCE, **{k: v for k, v in fields.items() if k != "shard"}}
        if fields
        else None,
    )


def _disagreement(name: str, values: dict[str, Any]) -> str:
    lines = "\n".join(f"  {label}: {value!r}" for label, value in values.items())
    return f"the folders disagree on {name}:\n{lines}"


def check_together(folders: Sequence[FolderInfo], prompt_override: str | None) -> list[str]:
    """Problems that make the folders not one dataset (empty when they belong together)."""
    problems = []
    generations = {f.label: f.generation for f in folders}
    keys = sorted({k for g in generations.values() if g for k in g})
    for key in keys:
        values = {label: (g or {}).get(key) for label, g in generations.items()}
        if len({repr(v) for v in values.values()}) > 1:
            problems.append(
                _disagreement(f"{key} (generation parameters: mixing them mixes datasets)", values)
            )
    if prompt_override is None:
        files = {f.label: f.prompt_file for f in folders}
        if len(set(files.values())) > 1:
            problems.append(
                _disagreement("the prompt file", files)
                + "\n  (if these paths name copies of one file, pass prompt_file=PATH)"
            )
    return problems


def open_generations(paths: Sequence[str | Path], prompt_file: str = "") -> GenerationSet:
    """Open every folder, check that they belong together; raise GenerationDataError naming what does not."""
    outputs = tuple(open_generation(p) for p in paths)
    folders = tuple(folder_info(o) for o in outputs)
    override = prompt_file or None
    warnings = [w for o in outputs for w in o.warnings]
    if len(outputs) > 1:
        unlabelled = [f.label for f in folders if f.generation is None]
        if unlabelled:
            raise GenerationDataError(
                "several generation folders are checked against each other through their manifest.json, "
                f"and {', '.join(unlabelled)} has none readable: validate it on its own, or restore its manifest"
            )
        problems = check_together(folders, override)
        if problems:
            raise GenerationDataError(
                "these generation folders are not the shards of one dataset — " + "; ".join(problems)
            )
        if len({f.shard[1] if f.shard else 1 for f in folders}) > 1:
            splits = ", ".join(f"{f.label}: {_shard_text(f.shard)}" for f in folders)
            warnings.append(
                f"the folders split the prompt file in different ways ({splits}): their ids may overlap "
                "(repeats are flagged duplicate_id) and missing shards cannot be named"
            )
    named = {f.prompt_file for f in folders if f.prompt_file}
    return GenerationSet(
        outputs=outputs,
        folders=folders,
        prompt_file=override or (named.pop() if len(named) == 1 else None),
        warnings=tuple(warnings),
    )
