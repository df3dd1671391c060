"""The run folder on disk: parquet shards written atomically, manifest.json, failed/rejected rows, resume.

Layout of ``out_dir``::

    manifest.json        fingerprint, parameters, counts, shard list, sessions (rewritten atomically)
    shards/part-NNNNNN.parquet   one row per finished prompt id, ~batch_save_size rows each
    failed.parquet       prompts that exhausted their attempts, with the last error (retried on resume)
    rejected.parquet     malformed prompt rows with the reason
    .lock                held (flock) by the lease of the process that writes here

Every file is written with ``draftgen.rundir.write`` (temporary name, fsync, rename), so a crash (even SIGKILL)
leaves either the old file or the new one, never half of one; the names are ``draftgen.rundir.layout``'s. The
shard files are the truth; the manifest is a summary of them. The folder is held by one ``RunFolderLease`` from
``open`` to ``release``: generate's preflight opens the store and hands it to the run.

A full disk while writing any of them raises ``DiskFull`` naming the file: the half-written temporary file is
already removed (its space is needed for the manifest), the shards already renamed stay, and
``close_disk_full`` records ``disk full`` in the manifest as far as space allows.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from draftgen.client.clock import WALL, HardwareClock
from draftgen.client.entropy import FIELDS as ENTROPY_FIELDS
from draftgen.client.records import Capabilities
from draftgen.generate.config import FINGERPRINT_SINCE, GenerateConfig
from draftgen.rundir import (
    DiskFull,
    RunFolderError,
    RunFolderLease,
    free_bytes,
    overwrite_in_place,
    write_bytes,
    write_parquet,
)
from draftgen.rundir.layout import FAILED, MANIFEST, REJECTED, SHARDS, shard_name, shard_paths, shard_seq

FORMAT = "draftgen.generate/1"
# What a second opener of the same folder is told.
BUSY_ADVICE = "choose another out_dir (with shard, give each process its own out_dir)"
HELD_HERE = (
    "a plan from an earlier preflight that generate has not run; run generate with it, or call plan.release()"
)

MESSAGES = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
LOOP = pl.Struct(
    {
        "period": pl.Int64,  # the cycle's length, in pieces (client.loops: about one token each)
        "start": pl.Int64,  # pieces of the answer before the cycle first began
        "kept": pl.Int64,  # pieces stored: up to the end of the cycle's first repetition
        "received": pl.Int64,  # pieces read when the loop was found
        "start_char": pl.Int64,  # the same three as character offsets in reasoning + answer
        "kept_chars": pl.Int64,
        "received_chars": pl.Int64,
        "live": pl.Boolean,  # found while streaming: the request was ended there (else found in the whole answer)
        "max_tokens": pl.Int64,  # what the request asked for: a loop runs to it, left alone
    }
)
# A turn's top-k entropy summary (draftgen.client.entropy: the tokens read, then the mean and quantiles, nats)
ENTROPY = pl.Struct({name: pl.Int64 if name == "tokens" else pl.Float64 for name in ENTROPY_FIELDS})
OUTPUT_SCHEMA = pl.Schema(
    {
        "id": pl.String,
        "messages": MESSAGES,
        "reasoning_content": pl.String,
        "content": pl.String,
        "finish_reason": pl.String,
        "prompt_tokens": pl.Int64,
        "completion_tokens": pl.Int64,
        "spec_accept_length": pl.Float64,
        "spec_verify_ct": pl.Int64,
        "server": pl.String,
        "latency_s": pl.Float64,
        "attempts": pl.Int64,
        "response_id": pl.String,
        "started_at": pl.Float64,
        "usage_reported": pl.Boolean,
        "ttft_s": pl.Float64,
        "source_row": pl.Int64,
        "category": pl.String,  # the prompt row's category or source field (draftgen.prompts.rows.row_category)
        # With a sampling plan (draftgen.sampling_plan): ``id`` is the sample's ({prompt_id}#s{k}), and
        # these say whose and which; null without a plan (``id`` is then the prompt's).
        "prompt_id": pl.String,
        "arm": pl.String,
        "sample": pl.Int64,
        # Per generated turn, in order (draftgen.training.conversation; single-turn rows hold one element). Shards
        # written before these columns existed are read as single-turn rows by conversation.assemble.
        "turn_after": pl.List(pl.Int64),  # index in messages of the last source message before the answer
        "turn_reasoning": pl.List(pl.String),
        "turn_content": pl.List(pl.String),
        "turn_finish_reason": pl.List(pl.String),
        "turn_prompt_tokens": pl.List(pl.Int64),
        "turn_completion_tokens": pl.List(pl.Int64),
        "turn_spec_accept_length": pl.List(pl.Float64),
        "turn_spec_verify_ct": pl.List(pl.Int64),
        "turn_latency_s": pl.List(pl.Float64),  # each turn's request, sent to answered (its last attempt)
        "turns_mode": pl.String,  # "all": every assistant turn generated; "last": only the final one
        # The target's own token ids per generated turn, as its server reported them (null element: that turn's
        # server sent none). Prompt ids are stored compactly (draftgen.training.token_ids): turn k's prompt is
        # (prompt[k-1] + output[k-1])[:turn_prompt_shared[k]] + turn_prompt_ids[k].
        "turn_output_ids": pl.List(pl.List(pl.UInt32)),
        "turn_prompt_ids": pl.List(pl.List(pl.UInt32)),
        "turn_prompt_shared": pl.List(pl.Int32),
        # Per generated turn: the repetition loop that ended it (finish reason "repetition_loop"), null element
        # where none did (draftgen.client.records.LoopEnd; docs/generate.md, "Repetition loops").
        "turn_loop": pl.List(LOOP),
        # The max_tokens each turn was sent with: the run's, or less where the trainer's max_length capped it
        # (draftgen.generate.length_cap); null in shards written before the cap existed.
        "turn_max_tokens": pl.List(pl.Int64),
        # Which limit set each turn's max_tokens: "max_tokens" (the run's or its arm's) or "max_length" (the room
        # the trainer's max_length left after its prompt). A turn cut at the latter is an expected cut; null in
        # shards written before this column existed.
        "turn_budget_by": pl.List(pl.String),
        # Answer points after the last stored one that were not generated: their prompt left no room under the
        # trainer's max_length, or less than min_turn_budget (``messages`` then ends at the last answered point);
        # 0 otherwise; and why ("max_length" or "min_turn_budget"; null when none).
        "turns_set_aside": pl.Int64,
        "turns_set_aside_by": pl.String,
        # Agentic conversations (docs/generate.md#agentic-conversations; training.conversation writes and reads
        # them): per message of ``messages``, its other fields (tool_calls, tool_call_id, name) as a JSON object,
        # null where none (the whole list null when no message has any); the row's tool schemas (a JSON list);
        # per generated turn, the target's tool calls (a JSON list, null element where it called nothing; the list
        # null when no turn did); and where the target's calls were not the source's, the divergence that ended the
        # conversation (a JSON object: turn, after, reason, original and target calls, turns_left). Null in shards
        # written before they existed.
        "message_extras": pl.List(pl.String),
        "tools": pl.String,
        "turn_tool_calls": pl.List(pl.String),
        "tool_divergence": pl.String,
        # Per generated turn: the server that answered it, and the prompt tokens its prefix cache held
        # (usage.prompt_tokens_details.cached_tokens, SGLang's --enable-cache-report; a null element where the
        # server did not say): draftgen.generate.cache_share.
        "turn_server": pl.List(pl.String),
        "turn_cached_tokens": pl.List(pl.Int64),
        # Per generated turn: SGLang's spec_correct_drafts_histogram (element k: the turn's verify steps that accepted
        # exactly k drafts; docs/engines.md), a null element where its server sent none: draftgen.draft_positions.
        "turn_drafts_histogram": pl.List(pl.List(pl.Int64)),
        # Per generated turn, with entropy_top_k: how flat the target's next-token distribution was (each token's
        # top-k entropy in nats, summarised: draftgen.client.entropy), a null element where none was read.
        "turn_entropy": pl.List(ENTROPY),
    }
)
FAILED_SCHEMA = pl.Schema(
    {
        "id": pl.String,
        "messages": MESSAGES,
        "error": pl.String,
        "error_kind": pl.String,
        "status": pl.Int64,
        "attempts": pl.Int64,
        "server": pl.String,
        "failed_at": pl.Float64,
        "source_row": pl.Int64,
        "turn": pl.Int64,  # 0-based index of the generated turn that failed (null in older files)
        "message_extras": pl.List(pl.String),  # as in OUTPUT_SCHEMA
    }
)
REJECTED_SCHEMA = pl.Schema({"row": pl.Int64, "id": pl.String, "reason": pl.String, "raw": pl.String})


# The run folder cannot be used as asked (the lease's errors included); the message says which file and what to do.
StoreError = RunFolderError


class FingerprintMismatch(StoreError):
    pass


def atomic_write_parquet(frame: pl.DataFrame, path: Path) -> None:
    """Write ``frame`` to ``path`` as the store writes every parquet file (zstd, no statistics), atomically."""
    write_parquet(path, frame, compression="zstd", statistics=False)


def read_manifest(out_dir: str | Path) -> dict[str, Any] | None:
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StoreError(
            f"{path} is not valid JSON ({exc}); it is rebuilt from the shards if you delete it"
        ) from exc


def scan_shards(paths: list[Path]) -> pl.LazyFrame:
    """All shards as one lazy frame of OUTPUT_SCHEMA; shards written before a column existed read it as null
    (mixed folders arise when a run started by an older draftgen is resumed)."""
    return pl.scan_parquet(paths, schema=OUTPUT_SCHEMA, missing_columns="insert", extra_columns="ignore")


def read_done_ids(out_dir: str | Path) -> pl.Series:
    """Ids of every stored row, reading only the id column of each shard (a corrupt shard is named)."""
    paths = shard_paths(out_dir)
    if not paths:
        return pl.Series("id", [], dtype=pl.String)
    try:
        return scan_shards(paths).select("id").collect()["id"]
    except (pl.exceptions.PolarsError, OSError) as exc:
        for path in paths:
            try:
                pl.scan_parquet(path).select("id").collect()
            except (pl.exceptions.PolarsError, OSError) as inner:
                raise StoreError(
                    f"shard {path} is unreadable ({type(inner).__name__}: {str(inner)[:200]}); move it out of "
                    f"{path.parent} and resume — its prompts will be generated again"
                ) from inner
        raise StoreError(f"cannot read the shards in {Path(out_dir) / SHARDS}: {exc}") from exc


def server_entry(url: str, caps: Capabilities) -> dict[str, Any]:
    """One server of a session as the manifest records it (the dataset card names them)."""
    return {"url": url, "engine": caps.engine, "version": caps.version, "token_ids": caps.token_ids}


@dataclass
class SessionCounts:
    started_at: float = field(default_factory=time.time)
    completed: int = 0
    turns: int = 0
    completion_tokens: int = 0
    failed: int = 0
    hedged: int = 0  # requests copied to an idle server at the tail (dispatch's hedge)
    hedge_wins: int = 0  # prompts whose stored answer came from the copy
    # prompts set aside before their first turn (their prompt alone reached train_max_length), and later turns
    # not generated for that reason (their conversation stored up to them)
    set_aside: int = 0
    turns_set_aside: int = 0
    set_aside_by: dict[str, int] = field(default_factory=dict)  # conversations cut short, by why (length_cap)
    clock_kept: float | None = None  # draftgen sim: the share of its clock the fleet kept (None: real)
    generating: tuple[float | None, float | None] = (None, None)  # first request sent, last answer (wall)
    start_wave_idle_s: float | None = None  # wall seconds of capacity idle while the first wave went out
    servers: list[dict[str, Any]] = field(
        default_factory=list
    )  # server_entry() of each server preflight approved


class RunStore:
    """Owns one run folder while a run writes to it, under its lease. A context manager (the lease is released on
    exit)."""

    def __init__(
        self,
        config: GenerateConfig,
        *,
        stored_ids: pl.Series,
        manifest: dict[str, Any] | None,
        clock: HardwareClock = WALL,
        prompt_scan: Mapping[str, Any] | None = None,
    ):
        self.config = config
        self.out_dir = Path(config.out_dir)
        self.shard_dir = self.out_dir / SHARDS
        self.done_ids: set[str] = set(stored_ids.to_list())
        self.stored_rows = len(stored_ids)
        self.manifest: dict[str, Any] = manifest or {}
        self._buffer: list[dict[str, Any]] = []
        self._failures: dict[str, dict[str, Any]] = {}
        self._failures_dirty = False
        self._set_aside: list[dict[str, Any]] = []  # rejected.parquet rows found by dispatch, not yet written
        self._next_seq = self._last_seq() + 1
        self._lease: RunFolderLease | None = None
        self.session = SessionCounts()
        self.clock = clock  # the servers' clock; times stored stay wall-clock, reports convert
        # What preflight's scan of the prompt file found (a resumed session without one keeps the manifest's).
        self.prompt_stats: dict[str, Any] = dict(prompt_scan or self.manifest.get("prompts", {}))
        self.rejected_count = int(
            prompt_scan["rejected"] if prompt_scan else self.manifest.get("counts", {}).get("rejected", 0)
        )

    # ----- opening ----------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        config: GenerateConfig,
        *,
        clock: HardwareClock = WALL,
        prompt_scan: Mapping[str, Any] | None = None,
        servers: Iterable[Mapping[str, Any]] = (),
    ) -> RunStore:
        """Take the folder's lease (which clears leftovers of a crash), check the fingerprint, read the stored ids.

        ``clock`` is the servers' (recorded with each session); ``prompt_scan`` preflight's counts of the prompt
        file (``PromptScan.as_dict``), recorded in the manifest; ``servers`` the session's servers
        (``server_entry``: url, engine, version, token-id source), recorded with the session. A store opened
        before they are known (by preflight) is given them by ``begin_session``."""
        lease = RunFolderLease.acquire(
            config.out_dir, subfolders=(SHARDS,), advice=BUSY_ADVICE, held_here=HELD_HERE
        )
        try:
            out_dir = lease.folder
            manifest = read_manifest(out_dir)
            check_fingerprint(config, manifest)
            ids = read_done_ids(out_dir)
            duplicates = ids.filter(ids.is_duplicated()).unique().head(5).to_list()
            if duplicates:
                raise StoreError(
                    f"the shards in {out_dir / SHARDS} hold some ids more than once (e.g. {duplicates}); "
                    "they were not written by one draftgen run — deduplicate them or use a new out_dir"
                )
            store = cls(config, stored_ids=ids, manifest=manifest, clock=clock, prompt_scan=prompt_scan)
            store._lease = lease
            store.session.servers = [dict(server) for server in servers]
            store._load_failures()
        except BaseException:
            lease.release()
            raise
        return store

    def begin_session(
        self, *, clock: HardwareClock, prompt_scan: Mapping[str, Any], servers: Iterable[Mapping[str, Any]]
    ) -> None:
        """Start the session a run records, once preflight knows the servers' clock, the prompt file's counts and
        the servers approved (the store itself was opened before them, at the start of preflight)."""
        self.clock = clock
        self.prompt_stats = dict(prompt_scan)
        self.rejected_count = int(prompt_scan["rejected"])
        self.session = SessionCounts(servers=[dict(server) for server in servers])

    @property
    def holds_lease(self) -> bool:
        return self._lease is not None and self._lease.held

    def _last_seq(self) -> int:
        return max((n for n in map(shard_seq, shard_paths(self.out_dir)) if n is not None), default=0)

    def _load_failures(self) -> None:
        path = self.out_dir / FAILED
        if path.exists():
            try:
                frame = pl.read_parquet(path)
            except (pl.exceptions.PolarsError, OSError) as exc:
                raise StoreError(
                    f"{path} is unreadable ({exc}); delete it to resume (failed prompts are retried)"
                ) from exc
            for row in frame.iter_rows(named=True):
                if row["id"] not in self.done_ids:
                    self._failures[row["id"]] = row

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Let go of the run folder (idempotent)."""
        if self._lease is not None:
            self._lease.release()

    # ----- writing ----------------------------------------------------------------------------------------
    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def failed_count(self) -> int:
        return len(self._failures)

    def add(self, row: dict[str, Any]) -> bool:
        """Keep one finished row; write a shard when ``batch_save_size`` are waiting. True if a shard was written."""
        if row["id"] in self.done_ids:
            raise StoreError(f"id {row['id']!r} finished twice: this is a bug in draftgen, please report it")
        self.done_ids.add(row["id"])
        self._buffer.append(row)
        self.session.completed += 1
        self.session.turns += len(row.get("turn_after") or (None,))
        self.session.turns_set_aside += row.get("turns_set_aside") or 0
        self.session.completion_tokens += row.get("completion_tokens") or 0
        if self._failures.pop(row["id"], None) is not None:
            self._failures_dirty = True
        if len(self._buffer) >= self.config.batch_save_size:
            self.flush()
            return True
        return False

    def add_failure(self, row: dict[str, Any]) -> None:
        self._failures[row["id"]] = row
        self._failures_dirty = True
        self.session.failed += 1

    def count_set_aside(self, why: str) -> None:
        """A conversation's remaining turns were set aside (``why``: length_cap.NO_ROOM or BELOW_FLOOR)."""
        self.session.set_aside_by[why] = self.session.set_aside_by.get(why, 0) + 1

    def add_rejected(self, row: dict[str, Any]) -> None:
        """A prompt set aside by dispatch (its first turn could train nothing): appended to rejected.parquet at
        the next flush. A resume's preflight rewrites that file from its scan, and dispatch finds these again."""
        self._set_aside.append(row)
        self.rejected_count += 1
        self.session.set_aside += 1

    def write_rejected(self, rows: Iterable[dict[str, Any]], prompt_stats: dict[str, Any]) -> Path:
        """Rewrite rejected.parquet with this scan's malformed rows (the prompt file may have been fixed)."""
        frame = pl.DataFrame(list(rows), schema=REJECTED_SCHEMA)
        path = self.out_dir / REJECTED
        atomic_write_parquet(frame, path)
        self.rejected_count = frame.height
        self.prompt_stats = prompt_stats
        return path

    def flush(self) -> Path | None:
        """Write buffered rows as one shard, failures, and the manifest. Safe to call at any time."""
        written, wrote_rejected = None, False
        if self._buffer:
            frame = pl.DataFrame(self._buffer, schema=OUTPUT_SCHEMA)
            written = self.shard_dir / shard_name(self._next_seq)
            atomic_write_parquet(frame, written)
            self._next_seq += 1
            self.stored_rows += frame.height
            shards = self.manifest.setdefault("shards", [])
            shards.append(
                {
                    "file": f"{SHARDS}/{written.name}",
                    "rows": frame.height,
                    "completion_tokens": int(frame["completion_tokens"].fill_null(0).sum()),
                    "written_at": time.time(),
                }
            )
            self._buffer = []
        if self._failures_dirty:
            frame = pl.DataFrame(list(self._failures.values()), schema=FAILED_SCHEMA)
            atomic_write_parquet(frame, self.out_dir / FAILED)
            self._failures_dirty = False
        if self._set_aside:
            path = self.out_dir / REJECTED
            frame = pl.DataFrame(self._set_aside, schema=REJECTED_SCHEMA)
            if path.exists():
                frame = pl.concat([pl.read_parquet(path).cast(REJECTED_SCHEMA), frame])  # type: ignore[arg-type]
            atomic_write_parquet(frame, path)
            self._set_aside = []
            wrote_rejected = True
        if wrote_rejected or written is not None or not (self.out_dir / MANIFEST).exists():
            self._write_manifest("running")
        return written

    def close(
        self,
        status: str,
        detail: str = "",
        *,
        hedged: int = 0,
        hedge_wins: int = 0,
        clock_kept: float | None = None,
        generating: tuple[float | None, float | None] = (None, None),
        start_wave_idle_s: float | None = None,
    ) -> None:
        """Flush everything and record how this session ended (complete, interrupted, halted, failed), with the
        tail copies dispatch sent and how many of them answered first, and (draftgen sim) the share of its clock
        the fleet kept."""
        self.session.hedged, self.session.hedge_wins = hedged, hedge_wins
        self.session.clock_kept = clock_kept
        self.session.generating = generating
        self.session.start_wave_idle_s = start_wave_idle_s
        self.flush()
        self._end_session(status, detail)

    def close_disk_full(self, error: DiskFull) -> bool:
        """The disk filled: drop what could not be written (those prompts are generated again on resume) and
        record ``disk full`` with the path in the manifest. False if even the manifest could not be written."""
        unwritten = len(self._buffer)
        self._buffer = []  # not in any shard: resume regenerates them
        self.session.completed -= unwritten
        self.manifest["disk_full"] = {
            "path": str(error.path),
            "filesystem_free_bytes": free_bytes(self.out_dir),
            "at": time.time(),
            "rows_not_written": unwritten,
        }
        try:
            if self._failures_dirty:
                atomic_write_parquet(
                    pl.DataFrame(list(self._failures.values()), schema=FAILED_SCHEMA), self.out_dir / FAILED
                )
                self._failures_dirty = False
        except DiskFull:
            pass  # failed prompts are retried on resume anyway (they are not in any shard)
        try:
            self._end_session("disk full", f"disk full: {error.path}: {error}")
        except DiskFull:
            return self._write_manifest_in_place()
        return True

    def _write_manifest_in_place(self) -> bool:
        return write_manifest_in_place(self.out_dir, self.manifest)

    def _end_session(self, status: str, detail: str) -> None:
        sessions = self.manifest.setdefault("sessions", [])
        sessions.append(
            {
                "started_at": self.session.started_at,
                "ended_at": time.time(),
                "completed": self.session.completed,
                "turns": self.session.turns,
                "completion_tokens": self.session.completion_tokens,
                "failed": self.session.failed,
                "hedged": self.session.hedged,
                "hedge_wins": self.session.hedge_wins,
                "set_aside": self.session.set_aside,
                "turns_set_aside": self.session.turns_set_aside,
                "set_aside_by": dict(self.session.set_aside_by),
                "clock_factor": self.clock.factor,  # started_at/ended_at are wall clock; × this = hardware seconds
                "clock_kept": self.session.clock_kept,  # draftgen sim: × this too (the share of its clock it kept)
                # the generation's own span inside the session: the first request sent to the last answer
                "first_sent_at": self.session.generating[0],
                "last_answer_at": self.session.generating[1],
                # capacity idle while the first wave was sent and admitted (generate.ramp; null: no /metrics)
                "start_wave_idle_s": self.session.start_wave_idle_s,
                "servers": self.session.servers,
                "status": status,
                "detail": detail[:2000],
            }
        )
        self._write_manifest(status)

    def _write_manifest(self, status: str) -> None:
        config = self.config
        manifest = self.manifest
        manifest["format"] = FORMAT
        manifest["fingerprint"] = config.fingerprint()
        manifest["fingerprint_fields"] = config.fingerprint_fields()
        manifest["parameters"] = config.public_dict()
        # absolute, so validate on another machine or from another folder finds (or names) the same file
        manifest["prompts"] = {"path": str(config.prompt_path.resolve()), **self.prompt_stats}
        manifest["counts"] = {
            "done": self.stored_rows,
            "failed": len(self._failures),
            "rejected": self.rejected_count,
        }
        manifest["status"] = status
        if status != "disk full":
            manifest.pop("disk_full", None)
        manifest["clock"] = self.clock.as_dict()
        manifest["updated_at"] = time.time()
        manifest.setdefault("shards", [])
        write_bytes(self.out_dir / MANIFEST, json.dumps(manifest, indent=1).encode())


def write_manifest_in_place(out_dir: Path, manifest: dict[str, Any]) -> bool:
    """No room even for a temporary manifest: rewrite the old one in its own blocks, compact, when the new text
    is no longer than the old. False otherwise."""
    return overwrite_in_place(out_dir / MANIFEST, json.dumps(manifest, separators=(",", ":")).encode())


def record_disk_full(out_dir: str | Path, path: str | Path, detail: str) -> bool:
    """After the writing process was stopped by a full disk before it could say so (papermill failing to save
    the executed notebook kills the kernel): mark a run folder still ``running`` as ``disk full``. Only when no
    process holds the folder's lock; never writes anything but the manifest. True if it was recorded."""
    out_dir = Path(out_dir)
    lease = RunFolderLease.acquire_existing(out_dir)
    if lease is None:
        return False  # no run folder, or still being written by someone: they record their own ending
    with lease:
        try:
            manifest = read_manifest(out_dir)
        except StoreError:
            return False
        if not manifest or manifest.get("status") != "running":
            return False
        manifest["status"] = "disk full"
        manifest["disk_full"] = {
            "path": str(path),
            "filesystem_free_bytes": free_bytes(out_dir),
            "at": time.time(),
            "detail": detail[:500],
            "recorded_by": "draftgen run (the run was stopped before it could record it)",
        }
        manifest["updated_at"] = time.time()
        try:
            write_bytes(out_dir / MANIFEST, json.dumps(manifest, indent=1).encode())
        except DiskFull:
            return write_manifest_in_place(out_dir, manifest)
        return True


def check_fingerprint(config: GenerateConfig, manifest: dict[str, Any] | None) -> None:
    """Resuming with other model/sampling/shard parameters mixes two datasets: refuse unless ``force``."""
    if not manifest or "fingerprint" not in manifest or not manifest.get("counts", {}).get("done"):
        return  # nothing generated yet: nothing to mix
    if manifest["fingerprint"] == config.fingerprint():
        return
    stored = {**FINGERPRINT_SINCE, **manifest.get("fingerprint_fields", {})}
    now = config.fingerprint_fields()
    changed = [
        f"{k}: stored {stored.get(k)!r}, now {now.get(k)!r}" for k in now if stored.get(k) != now.get(k)
    ]
    message = (
        f"{Path(config.out_dir) / MANIFEST} was written with other generation parameters ("
        + "; ".join(changed or ["fingerprint differs"])
        + "). Resuming would mix two datasets. Use a new out_dir, restore the parameters, or set force=True."
    )
    if config.force:
        return
    raise FingerprintMismatch(message)


def fingerprint_change(config: GenerateConfig, manifest: dict[str, Any] | None) -> str | None:
    """The mismatch message when forced through, else None (for the preflight table)."""
    with contextlib.suppress(FingerprintMismatch):
        check_fingerprint(config.model_copy(update={"force": False}), manifest)
        return None
    return "fingerprint differs from the stored run (force=True: continuing anyway)"
