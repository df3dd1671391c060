"""The names of every file and folder draftgen writes into a run folder, and the globs that find them again.

Writers and readers both take them from here, so a reader never guesses a writer's pattern (docs/design.md,
"Data contracts", describes each file). A run folder is ``outputs/<step>/<run>/`` when ``draftgen run`` makes it;
every name is relative to it. A file being written has a temporary name (``write.temporary_path``) that none of
these globs matches, so a reader sees only whole files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# ----- every run folder (draftgen.rundir.run_folder: a step's run(config) opens and finishes its folder) --------------
PARAMETERS = "parameters.yaml"  # the parameters the step ran with
COMPLETE_MARKER = ".complete"  # a finished run: never overwritten
LOCK = ".lock"  # held by the run folder's lease (draftgen.rundir.lease)
REFUSED_MARKER = (
    ".refused"  # a check before any work refused the run: the next run of that name starts over here
)

# ----- a notebook's run (draftgen.runner): the executed notebook, under its own name, and its report --------------
REPORT_HTML = "report.html"  # the executed notebook without its code

PLOT_SUFFIX = ".png"  # every plot a step saves: NAME.png (draftgen.display.plots.save)


# ----- generate (draftgen.generate: store, status_file, acceptance, report) --------------------------------------
MANIFEST = "manifest.json"
SHARDS = "shards"
SHARD_GLOB = "part-*.parquet"  # under SHARDS
FAILED = "failed.parquet"
REJECTED = "rejected.parquet"
ACCEPTANCE = "acceptance.parquet"
PROGRESS = "progress.json"
HISTORY = "progress-history.jsonl"
PLOTS = (
    "plots"  # generate's plots, under PLOTS (a several-folder report saves them under a folder it is given)
)
GENERATE_PLOT_THROUGHPUT = "throughput"
GENERATE_PLOT_ACCEPTANCE = "acceptance"
GENERATE_PLOT_FINISH_REASONS = "finish_reasons"
GENERATE_PLOT_LENGTHS = "completion_lengths"
GENERATE_PLOT_BY_CATEGORY = "acceptance_by_category"
GENERATE_PLOT_BY_LENGTH = "acceptance_by_length"
GENERATE_PLOT_BY_POSITION = "acceptance_by_position"


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
BENCH_PLOT_THROUGHPUT = "throughput"
BENCH_PLOT_LATENCY = "latency"
BENCH_PLOT_ACCEPTANCE = "acceptance"
BENCH_PLOT_PER_GPU = "tok_s_per_gpu"
BENCH_PLOT_BY_CATEGORY = "acceptance_by_category"
BENCH_PLOT_LENGTHS = "completion_lengths"


def bench_level_name(gpu: int, concurrency: int) -> str:
    return f"gpu{gpu}-c{concurrency}.json"


# ----- estimate (draftgen.estimate.report) -------------------------------------------------------------------------
ESTIMATE = "estimate.json"
ESTIMATE_SCENARIOS = "scenarios.parquet"
ESTIMATE_PLOT_SCENARIOS = "scenarios"
ESTIMATE_PLOT_CONCURRENCY = "days_vs_concurrency"
ESTIMATE_PLOT_MAX_TOKENS = "days_vs_max_tokens"
ESTIMATE_PLOT_GPUS = "days_vs_gpus"
ESTIMATE_PLOT_RATE_FIT = "rate_fit"

# ----- tune (draftgen.tune: report, verdict_report) ----------------------------------------------------------------
TUNE_CANDIDATES = "candidates.parquet"
TUNE_JOBS = "jobs.parquet"
TUNE_SUMMARY = "tune.json"
TUNE_VERDICT_TABLE = "verdict.parquet"
TUNE_VERDICT_SUMMARY = "verdict.json"
TUNE_VERDICT_BY_CATEGORY = "verdict_by_category.parquet"
TUNE_VERDICT_BY_LENGTH = "verdict_by_length.parquet"
SETTINGS = "settings.yaml"  # the chosen server settings (draftgen.server_settings), unless settings_file says
TUNE_SERVERS = "servers"  # one folder per job, named by tune.measure, holding its server's log
TUNE_PLOT_THROUGHPUT = "tok_s_per_gpu"
TUNE_PLOT_ACCEPTANCE = "acceptance"
TUNE_PLOT_VERDICT_THROUGHPUT = "verdict_tok_s_per_gpu"
TUNE_PLOT_VERDICT_ACCEPTANCE = "verdict_acceptance"

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
EXPORT_HOLDOUT_EVAL = "eval.jsonl"  # under EXPORT_HOLDOUT: the held-out samples as input_ids + loss_mask
EXPORT_COUNTS = "counts.json"
EXPORT_CARD = "README.md"
EXPORT_INFO = "dataset_info.json"
EXPORT_TRAINER_CONFIG = (
    "specforge.yaml"  # SpecForge's run config reading the export (validate.trainer_config)
)


def record_part_name(index: int) -> str:
    """One batch's records under VALIDATE_RECORD_PARTS."""
    return f"part-{index:06d}.parquet"


def export_tokens_part_name(index: int) -> str:
    """One batch's token rows under EXPORT_TOKENS."""
    return f"part-{index:05d}.parquet"


# ----- serve (draftgen.serve.records) -------------------------------------------------------------------------------
SERVERS = "servers.yaml"  # papermill parameters: the ready servers' URLs and the model name
COMMANDS = "commands.sh"  # the command lines serve ran


# ----- what each step's folder holds, declared once ----------------------------------------------------------------
# The step registry (draftgen.steps: ``draftgen run --help``), the docs' file tables (python -m draftgen.param_tables)
# and the demo's checks read these; tests/test_layout.py compares them with every file a demo writes.
@dataclass(frozen=True)
class Entry:
    """One file (or a series of them: a glob) a step writes, relative to its folder, and what it holds.

    ``when`` says when it is written; "" means by every finished run."""

    path: str
    what: str
    when: str = ""

    def matches(self, relative: str) -> bool:
        """Whether ``relative`` (a file's path under the folder, with ``/``) is this entry."""
        from fnmatch import fnmatchcase

        return fnmatchcase(relative, self.path)


def plot_file(name: str) -> str:
    """The file a plot called ``name`` is saved as."""
    return f"{name}{PLOT_SUFFIX}"


def plot(name: str, what: str, *, folder: str = "", when: str = "") -> Entry:
    """A plot's entry: ``[folder/]name.png``."""
    return Entry(f"{folder}/{plot_file(name)}" if folder else plot_file(name), what, when)


RUN_FILES = (  # every run folder, whichever step and face
    Entry(PARAMETERS, "the parameters the step ran with"),
    Entry(COMPLETE_MARKER, "the run finished: the folder is never written again"),
    Entry(LOCK, "the lease: held with flock by the one process writing here"),
    Entry(
        REFUSED_MARKER,
        "why a check refused it before any work: its name is free",
        "a new run was refused",
    ),
)
NOTEBOOK_FILES = (  # a notebook's run (draftgen run, the demo) beside RUN_FILES: a command's run has neither
    Entry("<step>.ipynb", "the executed notebook, named as its notebook"),
    Entry(REPORT_HTML, "the executed notebook as a report, its headline first and its code hidden"),
)

BENCHMARK_FILES = (
    Entry(BENCH_RESULTS, "one row per server × level: tok/s, latency percentiles, acceptance, their sources"),
    Entry(BENCH_REQUESTS, "one row per request"),
    Entry(BENCH_OCCUPANCY, "requests running over time, per server and level"),
    Entry(BENCH_WORKERS, "each worker's tokens and acceptance from its own /metrics", "behind a gateway"),
    Entry(BENCH_SUMMARY, "the servers, the recommended concurrency, the clock, the settings file"),
    Entry(f"{BENCH_LEVELS}/{BENCH_LEVEL_GLOB}", "each finished level, for --resume"),
    plot(BENCH_PLOT_THROUGHPUT, "output tok/s per server against concurrency"),
    plot(BENCH_PLOT_LATENCY, "TTFT, ITL and E2E against concurrency"),
    plot(BENCH_PLOT_ACCEPTANCE, "acceptance length against concurrency"),
    plot(BENCH_PLOT_PER_GPU, "the fleet's tok/s per GPU against concurrency"),
    plot(BENCH_PLOT_BY_CATEGORY, "acceptance length by prompt category"),
    plot(BENCH_PLOT_LENGTHS, "completion lengths of the sample"),
)
ESTIMATE_FILES = (
    Entry(ESTIMATE, "days, dollars and their interval; the inputs; the scenarios"),
    Entry(ESTIMATE_SCENARIOS, "one row per scenario"),
    plot(ESTIMATE_PLOT_SCENARIOS, "wall time and cost per scenario"),
    plot(ESTIMATE_PLOT_CONCURRENCY, "days against concurrency per server"),
    plot(ESTIMATE_PLOT_MAX_TOKENS, "days against max_tokens"),
    plot(ESTIMATE_PLOT_GPUS, "days against GPUs"),
    plot(ESTIMATE_PLOT_RATE_FIT, "the benchmark's rate against the fitted curve"),
)
GENERATE_FILES = (
    Entry(MANIFEST, "summary of the run; rewritten atomically"),
    Entry(f"{SHARDS}/{SHARD_GLOB}", "one row per finished prompt id, batch_save_size rows each"),
    Entry(FAILED, "prompts whose turn failed every attempt (retried on resume)", "a prompt failed"),
    Entry(REJECTED, "malformed prompt rows, with the reason"),
    Entry(ACCEPTANCE, "MTP acceptance per worker and window, from /metrics", "the servers have /metrics"),
    Entry(PROGRESS, "what the run is doing now"),
    Entry(HISTORY, "one line of cumulative counters per status interval"),
    plot(GENERATE_PLOT_THROUGHPUT, "tok/s over the run, per server", folder=PLOTS),
    plot(GENERATE_PLOT_ACCEPTANCE, "acceptance length per worker and window", folder=PLOTS),
    plot(GENERATE_PLOT_FINISH_REASONS, "finish reasons", folder=PLOTS),
    plot(GENERATE_PLOT_LENGTHS, "completion lengths per turn", folder=PLOTS),
    plot(GENERATE_PLOT_BY_CATEGORY, "acceptance length by prompt category", folder=PLOTS),
    plot(GENERATE_PLOT_BY_LENGTH, "acceptance length by output length", folder=PLOTS),
    plot(
        GENERATE_PLOT_BY_POSITION, "acceptance per draft position (SGLang's drafts histogram)", folder=PLOTS
    ),
)
VALIDATE_FILES = (
    Entry(VALIDATE_RECORDS, "one record per sample: its flags, mask sum, lengths"),
    Entry(VALIDATE_SUMMARY, "counts, shares, the gate's verdict"),
    Entry(
        f"{EXPORT}/{EXPORT_CONVERSATIONS}",
        "clean samples as conversations (SpecForge's shape)",
        "the gate passed; export_jsonl",
    ),
    Entry(
        f"{EXPORT}/{EXPORT_PROMPTS}",
        "clean samples as input_ids + loss_mask (data.prompts_path)",
        "the gate passed; export_prompts",
    ),
    Entry(
        f"{EXPORT}/{EXPORT_TOKENS}/part-*.parquet",
        "id, input_ids, loss_mask",
        "the gate passed; export_tokens",
    ),
    Entry(
        f"{EXPORT}/{EXPORT_HOLDOUT}/{EXPORT_PROMPTS}",
        "the held-out prompts, for tune's verdict",
        "the gate passed; holdout_share > 0",
    ),
    Entry(
        f"{EXPORT}/{EXPORT_HOLDOUT}/{EXPORT_HOLDOUT_EVAL}",
        "the held-out clean samples as input_ids + loss_mask: the target's own answers no drafter trained on",
        "the gate passed; holdout_share > 0; export_prompts",
    ),
    Entry(f"{EXPORT}/{EXPORT_COUNTS}", "samples in, out, dropped, by flag", "the gate passed"),
    Entry(f"{EXPORT}/{EXPORT_CARD}", "the dataset card, for people", "the gate passed"),
    Entry(f"{EXPORT}/{EXPORT_INFO}", "the dataset card, for programs", "the gate passed"),
    Entry(
        f"{EXPORT}/{EXPORT_TRAINER_CONFIG}",
        "SpecForge 0.2.0's DFlash run config reading the export",
        "the gate passed; export_prompts, or export_jsonl with a SpecForge trainer",
    ),
    Entry(f"{EXPORT_STAGING}/*", "the export not published: its files as under export/", "the gate failed"),
)
TUNE_FILES = (
    Entry(TUNE_SUMMARY, "the chosen candidate, its gain, the ties, the verdict's summary"),
    Entry(TUNE_CANDIDATES, "one row per candidate, best first", "race: true"),
    Entry(TUNE_JOBS, "one row per job (candidate × round × GPU group)", "race: true"),
    Entry(SETTINGS, "the chosen settings, for draftgen serve --settings", "a candidate was chosen"),
    Entry(f"{TUNE_SERVERS}/*/server-*.log", "each job's server log"),
    Entry(TUNE_VERDICT_SUMMARY, "the verdict: winner, ranking, days and dollars", "with verdict_levels"),
    Entry(TUNE_VERDICT_TABLE, "one row per candidate × level", "with verdict_levels"),
    Entry(
        TUNE_VERDICT_BY_CATEGORY,
        "acceptance by prompt category per candidate and level",
        "with verdict_levels",
    ),
    Entry(
        TUNE_VERDICT_BY_LENGTH, "acceptance by output length per candidate and level", "with verdict_levels"
    ),
    plot(TUNE_PLOT_THROUGHPUT, "tok/s per GPU per candidate", when="race: true"),
    plot(TUNE_PLOT_ACCEPTANCE, "acceptance length per candidate", when="race: true"),
    plot(TUNE_PLOT_VERDICT_THROUGHPUT, "tok/s per GPU per candidate and level", when="with verdict_levels"),
    plot(
        TUNE_PLOT_VERDICT_ACCEPTANCE, "acceptance length per candidate and level", when="with verdict_levels"
    ),
)
MONITOR_FILES: tuple[Entry, ...] = ()  # read-only: nothing in the run it watches, nothing of its own
DEMO_TOKENIZER = "tokenizer"  # draftgen demo's own folders beside its steps' (draftgen.commands.demo)
DEMO_SIM = "sim"
DEMO_FILES = (
    Entry(f"{DEMO_TOKENIZER}/*", "a tiny Qwen3-format tokenizer, built for validate (no download)"),
    Entry(f"{DEMO_SIM}/*", "the simulated servers' ground truth (truth-PORT.jsonl) and logs"),
)
SERVE_FILES = (  # draftgen serve's run folder (not a notebook step)
    Entry(SERVERS, "the ready servers' URLs and the model name, as papermill parameters"),
    Entry(COMMANDS, "the command lines serve ran"),
    Entry("server-*.log", "each server's log"),
    Entry("router-*.log", "SMG's log", "--router"),
)
