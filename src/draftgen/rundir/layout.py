"""The names of every file and folder draftgen writes into a run folder, and the globs that find them again.

Writers and readers both take them from here, so a reader never guesses a writer's pattern (docs/design.md,
"Data contracts", describes each file). A run folder is ``outputs/<step>/<run>/`` when ``draftgen run`` makes it;
every name is relative to it. A file being written has a temporary name (``write.temporary_path``) that none of
these globs matches, so a reader sees only whole files.
"""

from __future__ import annotations

from pathlib import Path

# ----- every notebook run by draftgen run (draftgen.runner), beside the executed notebook under its own name --------
PARAMETERS = "parameters.yaml"  # the parameters the notebook ran with
REPORT_HTML = "report.html"  # the executed notebook without its code
COMPLETE_MARKER = ".complete"  # a finished run: never overwritten
LOCK = ".lock"  # held by the run folder's lease (draftgen.rundir.lease)


# ----- generate (draftgen.generate: store, status_file, acceptance, report) --------------------------------------
MANIFEST = "manifest.json"
SHARDS = "shards"
SHARD_GLOB = "part-*.parquet"  # under SHARDS
FAILED = "failed.parquet"
REJECTED = "rejected.parquet"
ACCEPTANCE = "acceptance.parquet"
PROGRESS = "progress.json"
HISTORY = "progress-history.jsonl"
PLOTS = "plots"


def shard_name(seq: int) -> str:
    return f"part-{seq:06d}.parquet"


def shard_seq(path: Path) -> int | None:
    """The sequence number of a shard named by ``shard_name`` (None for another name)."""
    number = path.stem.partition("-")[2]
    return int(number) if number.isdigit() else None


def shard_paths(run_dir: str | Path) -> list[Path]:
    """The whole shards of a generate run folder, in the order they were written."""
    return sorted((Path(run_dir) / SHARDS).glob(SHARD_GLOB))


# ----- benchmark (draftgen.bench: report, checkpoint) ------------------------------------------------------------
BENCH_RESULTS = "results.parquet"
BENCH_REQUESTS = "requests.parquet"
BENCH_OCCUPANCY = "occupancy.parquet"
BENCH_WORKERS = "workers.parquet"
BENCH_SUMMARY = "benchmark.json"
BENCH_LEVELS = "levels"
BENCH_LEVEL_GLOB = "gpu*-c*.json"  # under BENCH_LEVELS


def bench_level_name(gpu: int, concurrency: int) -> str:
    return f"gpu{gpu}-c{concurrency}.json"


# ----- estimate (draftgen.estimate.report) -------------------------------------------------------------------------
ESTIMATE = "estimate.json"
ESTIMATE_SCENARIOS = "scenarios.parquet"

# ----- tune (draftgen.tune: report, verdict_report) ----------------------------------------------------------------
TUNE_CANDIDATES = "candidates.parquet"
TUNE_JOBS = "jobs.parquet"
TUNE_SUMMARY = "tune.json"
TUNE_VERDICT_TABLE = "verdict.parquet"
TUNE_VERDICT_SUMMARY = "verdict.json"
TUNE_VERDICT_BY_CATEGORY = "verdict_by_category.parquet"
TUNE_VERDICT_BY_LENGTH = "verdict_by_length.parquet"
SETTINGS = "settings.yaml"  # the chosen server settings (draftgen.server_settings), unless settings_file says

# ----- validate (draftgen.validate: pipeline, records, export, card) ----------------------------------------------
VALIDATE_RECORDS = "samples.parquet"
VALIDATE_RECORD_PARTS = "samples.parts"  # scratch: one part per batch, combined into VALIDATE_RECORDS
VALIDATE_SUMMARY = "summary.json"
EXPORT_STAGING = "export.partial"  # the export while it is written; renamed to EXPORT once the gate passed
EXPORT = "export"
EXPORT_CONVERSATIONS = "train.jsonl"
EXPORT_TOKENS = "tokens"
EXPORT_PROMPTS = "prompts.jsonl"
EXPORT_HOLDOUT = "holdout"
EXPORT_COUNTS = "counts.json"
EXPORT_CARD = "README.md"
EXPORT_INFO = "dataset_info.json"


def record_part_name(index: int) -> str:
    """One batch's records under VALIDATE_RECORD_PARTS."""
    return f"part-{index:06d}.parquet"


def export_tokens_part_name(index: int) -> str:
    """One batch's token rows under EXPORT_TOKENS."""
    return f"part-{index:05d}.parquet"


# ----- serve (draftgen.serve.records) -------------------------------------------------------------------------------
SERVERS = "servers.yaml"  # papermill parameters: the ready servers' URLs and the model name
COMMANDS = "commands.sh"  # the command lines serve ran
