"""Do the generation folders together hold every prompt of their prompt file, each exactly once?

The expected ids are what the folders' runs selected from the prompt file named in their manifests: every valid
row (malformed rows are generate's ``rejected.parquet``, and so are duplicate conversations unless the runs kept
them: ``keep_duplicates``, read the same way), split by ``shard_of`` as ``shard: "i/n"`` does, the
first ``limit`` of each shard when a limit was set. Each shard index no folder holds is named; missing ids are
counted (per shard, and how many sit in a folder's ``failed.parquet``, i.e. a resume would retry them) with
examples. Ids stored more than once — across folders or within one — are listed with the folders that hold them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from draftgen.generate.length_cap import BELOW_FLOOR, NO_ROOM, SET_ASIDE, set_aside_kind
from draftgen.generate.store import FAILED, REJECTED
from draftgen.prompts.rows import PromptFileError, PromptRow, iter_prompts, shard_of
from draftgen.sampling_plan import Arm, samples
from draftgen.validate.folders import FolderInfo, GenerationSet
from draftgen.validate.hashes import candidate_ids, id_hashes
from draftgen.validate.reader import read_shard

MISSING_EXAMPLES = 10
DUPLICATE_SCHEMA = {"id": pl.String, "copies": pl.UInt32, "folders": pl.List(pl.String)}


@dataclass(frozen=True)
class Coverage:
    prompt_file: str | None
    checked: bool  # False: the prompt file was not available (``note`` says why)
    note: str
    stored: int  # distinct ids stored across the folders
    duplicates: pl.DataFrame  # id, copies, folders (in order; the first one's row is the one kept)
    missing_shards: tuple[str, ...] = ()  # "1/2": shard indices no folder holds (folders split one way)
    expected: int = 0  # ids the folders should hold together
    missing: int = 0
    missing_failed: int = 0  # of the missing ids, those in some folder's failed.parquet
    set_aside: int = 0  # selected ids generate set aside (prompt past the trainer's max_length): not expected
    missing_by_shard: dict[str, int] = field(default_factory=dict)
    missing_examples: tuple[str, ...] = ()
    unexpected: int = 0  # stored ids the prompt file's selection does not hold

    @property
    def complete(self) -> bool:
        return self.checked and self.missing == 0

    @property
    def duplicated_ids(self) -> int:
        return self.duplicates.height

    def line(self) -> str:
        """One sentence for the notebook and the gate message."""
        parts = []
        if self.checked:
            parts.append(
                f"{self.expected - self.missing:,} of {self.expected:,} prompt ids present"
                + (f", {self.missing:,} missing" if self.missing else ", none missing")
            )
            if self.set_aside:
                parts.append(
                    f"{self.set_aside:,} more set aside by generate, their first prompt leaving too little room "
                    "under the trainer's max_length (rejected.parquet)"
                )
            if self.missing_failed:
                parts.append(
                    f"{self.missing_failed:,} of the missing failed every attempt (resume retries them)"
                )
            if self.missing_examples:
                parts.append("e.g. " + ", ".join(self.missing_examples[:3]))
        else:
            parts.append(f"prompt-file coverage not checked ({self.note})")
        if self.missing_shards:
            parts.append(f"no folder holds shard {', '.join(self.missing_shards)}")
        if self.duplicated_ids:
            parts.append(f"{self.duplicated_ids:,} ids stored more than once")
        if self.unexpected:
            parts.append(f"{self.unexpected:,} stored ids are not in the prompt file's selection")
        return "Coverage: " + "; ".join(parts) + "."

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_file": self.prompt_file,
            "checked": self.checked,
            "note": self.note,
            "stored": self.stored,
            "expected": self.expected,
            "missing": self.missing,
            "missing_failed": self.missing_failed,
            "set_aside": self.set_aside,
            "missing_by_shard": self.missing_by_shard,
            "missing_examples": list(self.missing_examples),
            "missing_shards": list(self.missing_shards),
            "unexpected": self.unexpected,
            "duplicated_ids": self.duplicated_ids,
            "duplicate_examples": self.duplicates.head(MISSING_EXAMPLES).to_dicts(),
        }


def stored_ids(generation: GenerationSet) -> pl.Series:
    """The ``id`` of every stored row, in folder then shard order (reads one column per shard)."""
    parts = [read_shard(shard, ["id"])["id"] for shard in generation.shards]
    return pl.concat(parts) if parts else pl.Series("id", [], dtype=pl.String)


def duplicate_ids(generation: GenerationSet) -> tuple[pl.DataFrame, int]:
    """Every id stored more than once — how many copies and which folders hold them (first: the kept one) — and
    how many rows are such later copies. Found from id hashes; only the rows whose hash repeats are read again."""
    shards = generation.shards
    folder_of = [
        label for label, o in zip(generation.labels, generation.outputs, strict=True) for _ in o.shards
    ]
    candidates = candidate_ids(id_hashes(shards), shards)
    repeated = (
        candidates.filter(pl.col("id").is_duplicated())
        .group_by("id", maintain_order=True)
        .agg(pl.len().alias("copies"), pl.col("shard").alias("folders"))
    )
    folders = [[folder_of[n] for n in held] for held in repeated["folders"].to_list()]  # few: repeated ids
    frame = repeated.with_columns(pl.Series("folders", folders, dtype=pl.List(pl.String)))
    return frame.cast(DUPLICATE_SCHEMA), int(frame["copies"].sum()) - frame.height


def _common_split(folders: Iterable[FolderInfo]) -> int | None:
    counts = {f.shard[1] if f.shard else 1 for f in folders}
    return counts.pop() if len(counts) == 1 else None


def _limit(limits: list[int]) -> int:
    """Folders holding one shard with different limits: 0 (all) wins, else the largest."""
    return 0 if not limits or 0 in limits else max(limits)


def _failed_ids(generation: GenerationSet) -> pl.Series:
    parts = []
    for directory in generation.directories:
        path = directory / FAILED
        if path.exists():
            try:
                parts.append(pl.read_parquet(path, columns=["id"])["id"].cast(pl.String))
            except Exception:  # a damaged failed.parquet only costs the "resume retries them" count
                continue
    return pl.concat(parts) if parts else pl.Series("id", [], dtype=pl.String)


def _set_aside_ids(generation: GenerationSet) -> pl.Series:
    """Ids generate set aside, not sent: their prompt alone reached the trainer's max_length (rejected.parquet)."""
    parts = []
    for directory in generation.directories:
        path = directory / REJECTED
        if path.exists():
            try:
                frame = pl.read_parquet(path, columns=["id", "reason"])
            except Exception:  # a damaged rejected.parquet: those prompts count as missing
                continue
            parts.append(frame.filter(pl.col("reason").str.starts_with(SET_ASIDE))["id"].cast(pl.String))
    return pl.concat(parts) if parts else pl.Series("id", [], dtype=pl.String)


def set_aside_counts(generation: GenerationSet) -> dict[str, dict[str, int]]:
    """What generate set aside for too little room under the trainer's max_length, by why (length_cap.NO_ROOM,
    BELOW_FLOOR): ``prompts`` whose first turn was never sent (rejected.parquet) and ``turns`` after the last stored
    one of a stored conversation (its ``turns_set_aside``)."""
    counts = {why: {"prompts": 0, "turns": 0} for why in (NO_ROOM, BELOW_FLOOR)}
    for output in generation.outputs:
        path = output.directory / REJECTED
        if path.exists():
            try:
                reasons = pl.read_parquet(path, columns=["reason"])["reason"].to_list()
            except Exception:  # a damaged rejected.parquet: coverage says so; nothing counted here
                reasons = []
            for reason in reasons:
                why = set_aside_kind(reason or "")
                if why is not None:
                    counts[why]["prompts"] += 1
        for shard in output.shards:
            try:
                frame = pl.read_parquet(shard, columns=["turns_set_aside", "turns_set_aside_by"])
            except Exception:  # shards written before the cause was recorded: their turns count as no room
                try:
                    frame = pl.read_parquet(shard, columns=["turns_set_aside"]).with_columns(
                        pl.lit(None, dtype=pl.String).alias("turns_set_aside_by")
                    )
                except Exception:
                    continue
            grouped = frame.group_by(pl.col("turns_set_aside_by").fill_null(NO_ROOM)).agg(
                pl.col("turns_set_aside").fill_null(0).sum()
            )
            for why, turns in grouped.iter_rows():
                counts.setdefault(why, {"prompts": 0, "turns": 0})["turns"] += int(turns)
    return counts


def _chunks(items: Iterator[tuple[str, int]], size: int = 65_536) -> Iterator[pl.DataFrame]:
    """(id, shard index) pairs gathered into frames of ``size`` rows: a prompt file's ids held as one polars
    column, not as a Python set of strings (~100 bytes an id)."""
    ids: list[str] = []
    shards: list[int] = []
    for prompt_id, index in items:
        ids.append(prompt_id)
        shards.append(index)
        if len(ids) >= size:
            yield pl.DataFrame({"id": ids, "index": shards}, schema={"id": pl.String, "index": pl.UInt32})
            ids, shards = [], []
    if ids:
        yield pl.DataFrame({"id": ids, "index": shards}, schema={"id": pl.String, "index": pl.UInt32})


def _selection(
    prompt_file: Path,
    count: int | None,
    per_index: dict[int, int],
    arms: Sequence[Arm] = (),
    keep_duplicates: bool = False,
) -> Iterator[tuple[str, int]]:
    """The ids the folders' runs selected from the prompt file, in file order, with the shard index of each;
    with a sampling plan, each selected prompt's sample ids (``draftgen.sampling_plan``)."""
    taken = dict.fromkeys(per_index, 0)
    for item in iter_prompts(prompt_file, keep_duplicates=keep_duplicates):
        if not isinstance(item, PromptRow):
            continue
        index = shard_of(item.id, count) if count else 0
        if per_index[index] and taken[index] >= per_index[index]:
            continue
        taken[index] += 1
        for sample in samples(item.id, arms):
            yield sample.id, index


def _plan(generation: GenerationSet) -> list[Arm]:
    """The sampling plan the folders ran (they agree on it: it is in the fingerprint); [] without one."""
    manifest = next((o.manifest for o in generation.outputs if o.manifest), None) or {}
    return [Arm.model_validate(a) for a in (manifest.get("parameters") or {}).get("sampling_plan") or []]


def _keeps_duplicates(generation: GenerationSet) -> bool:
    """Whether the folders' runs sent duplicate conversations (they agree: it is in the fingerprint; a run from
    before the parameter did)."""
    return any((f.generation or {}).get("keep_duplicates", True) for f in generation.folders)


def check_coverage(generation: GenerationSet) -> Coverage:
    """Compare the stored ids with the prompt file's selection; list ids stored more than once."""
    duplicates, copies = duplicate_ids(generation)
    count = _common_split(generation.folders)
    missing_shards: tuple[str, ...] = ()
    if count is not None:
        held = {f.shard[0] if f.shard else 0 for f in generation.folders}
        missing_shards = tuple(f"{i}/{count}" for i in range(count) if i not in held)
    distinct = generation.rows - copies
    base = {"prompt_file": generation.prompt_file, "stored": distinct, "duplicates": duplicates}
    if generation.prompt_file is None:
        note = "no manifest names the prompt file; pass prompt_file=PATH to check it"
        return Coverage(checked=False, note=note, missing_shards=missing_shards, **base)
    limits = [f.limit for f in generation.folders]
    if count is None and any(limits):
        note = (
            "the folders split the prompt file in different ways and set a limit: the selection is ambiguous"
        )
        return Coverage(checked=False, note=note, **base)
    per_index = {
        i: _limit([f.limit for f in generation.folders if (f.shard[0] if f.shard else 0) == i])
        if any((f.shard[0] if f.shard else 0) == i for f in generation.folders)
        else _limit(limits)
        for i in range(count or 1)
    }
    try:
        selection = _selection(
            Path(generation.prompt_file), count, per_index, _plan(generation), _keeps_duplicates(generation)
        )
        chunks = list(_chunks(selection))
    except (PromptFileError, OSError) as exc:
        note = f"{exc}; pass prompt_file=PATH where the file is on this machine"
        return Coverage(checked=False, note=note, missing_shards=missing_shards, **base)
    expected = pl.concat(chunks) if chunks else pl.DataFrame(schema={"id": pl.String, "index": pl.UInt32})
    aside = _set_aside_ids(generation)
    set_aside = expected.filter(pl.col("id").is_in(aside.implode()))["id"].n_unique()
    expected = expected.filter(~pl.col("id").is_in(aside.implode()))
    stored = stored_ids(generation)  # the strings, only here: whether an id is present must be exact
    missing = expected.filter(~pl.col("id").is_in(stored.implode()))  # in file order
    failed = _failed_ids(generation)
    by_shard = {
        (f"{index}/{count}" if count and count > 1 else "all"): n
        for index, n in missing.group_by("index").len().iter_rows()
    }
    selection = "every valid row" if not any(per_index.values()) else "the first `limit` valid rows"
    selection += " of each shard" if count and count > 1 else ""
    return Coverage(
        checked=True,
        note=f"{selection} of {generation.prompt_file}",
        missing_shards=missing_shards,
        expected=expected["id"].n_unique(),
        missing=missing.height,
        missing_failed=int(missing["id"].is_in(failed.implode()).sum()),
        set_aside=set_aside,
        missing_by_shard=dict(sorted(by_shard.items())),
        missing_examples=tuple(missing["id"].head(MISSING_EXAMPLES).to_list()),
        unexpected=stored.filter(~stored.is_in(expected["id"].implode())).n_unique(),
        **base,
    )
