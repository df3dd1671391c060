"""After a run: a polars summary, three plots (saved as PNG in out_dir/plots and shown inline), and the
estimate's planned figures beside the actual ones. Reads only the columns it needs from the shards.

Every function takes one run folder or several (a list: the ``shard: "i/n"`` folders of client nodes, which
are summarised as one run; per-server figures are then kept apart per folder, since every node may reach its
servers by the same URL).

Shards and manifest sessions hold wall-clock times; the manifest records the servers' clock (``clock``, and each
session's ``clock_factor``). Everything here states times and rates on that clock — against ``draftgen sim
--speed 5``, simulated-B200 seconds and tok/s — and says so in a ``clock`` column; real servers: the wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from draftgen.breakdown import Breakdowns, breakdown, breakdowns, ratio_interval
from draftgen.client.clock import HardwareClock, fleet_clock, on_clock
from draftgen.client.loops import REPETITION_LOOP
from draftgen.display.breakdown_plots import acceptance_by_category, acceptance_by_length
from draftgen.display.headline import Headline, Stat
from draftgen.display.humanize import duration_unit, short_label
from draftgen.display.notes import Notes, Stack
from draftgen.display.plots import Plot, completion_length_histogram, mean_band, save
from draftgen.display.position_plots import acceptance_by_position
from draftgen.display.table import Column, Table, format_value, with_specs
from draftgen.draft_positions import COLUMN as DRAFTS_HISTOGRAM
from draftgen.draft_positions import DraftPositions, from_rows
from draftgen.generate.acceptance import per_worker as acceptance_per_worker
from draftgen.generate.acceptance import read_samples
from draftgen.generate.cache_share import cache_tables
from draftgen.generate.gpu_time import gpu_seconds, kept_share_of
from draftgen.generate.length_cap import BY_MAX_LENGTH, BY_MAX_TOKENS
from draftgen.generate.preflight import load_estimate
from draftgen.generate.store import read_manifest, scan_shards
from draftgen.prompts.rows import DUPLICATE_OF
from draftgen.rundir.layout import (
    FAILED,
    GENERATE_PLOT_ACCEPTANCE,
    GENERATE_PLOT_BY_CATEGORY,
    GENERATE_PLOT_BY_LENGTH,
    GENERATE_PLOT_BY_POSITION,
    GENERATE_PLOT_FINISH_REASONS,
    GENERATE_PLOT_LENGTHS,
    GENERATE_PLOT_THROUGHPUT,
    PLOTS,
    REJECTED,
    SHARDS,
    shard_paths,
)
from draftgen.sampling_plan import Arm

REPORT_COLUMNS = (
    "id",
    "server",
    "finish_reason",
    "completion_tokens",
    "prompt_tokens",
    "started_at",
    "latency_s",
    "spec_accept_length",
    "attempts",
)
RunDirs = str | Path | Sequence[str | Path]  # one run folder, or several (client nodes' shards of one run)


def run_dirs(out_dir: RunDirs) -> list[Path]:
    folders = [Path(out_dir)] if isinstance(out_dir, (str, Path)) else [Path(d) for d in out_dir]
    if not folders:
        raise ValueError("no run folder given")
    return folders


def stored_shards(out_dir: RunDirs) -> list[tuple[Path, pl.LazyFrame]]:
    """Each run folder with its stored shards (lazy); a folder that stored nothing yet is an error naming it."""
    scans = []
    for folder in run_dirs(out_dir):
        paths = shard_paths(folder)
        if not paths:
            raise FileNotFoundError(f"no shards in {folder / SHARDS}: the run stored nothing yet")
        scans.append((folder, scan_shards(paths)))
    return scans


def scan_results(out_dir: RunDirs) -> pl.LazyFrame:
    """The stored rows (lazy), with emptiness flags computed in polars rather than loaded text, and ``folder``."""
    frames = []
    for folder, shards in stored_shards(out_dir):
        frames.append(
            shards.select(
                *REPORT_COLUMNS,
                pl.col("turn_after").list.len().fill_null(1).cast(pl.Int64).alias("turns"),  # older shards: 1
                # as the garbage guard counts them: a turn that finished with neither an answer nor a call (one
                # cut at its limit or ended in a loop has none by its cause)
                (
                    (pl.col("content").fill_null("").str.strip_chars() == "")
                    & ~pl.col("finish_reason").fill_null("").is_in(["length", "tool_calls", REPETITION_LOOP])
                ).alias("empty_answer"),
                (pl.col("reasoning_content").fill_null("").str.strip_chars() == "").alias("empty_reasoning"),
                *_loop_columns(),
                pl.lit(str(folder)).alias("folder"),
            )
        )
    return pl.concat(frames, how="vertical_relaxed")


def _loop_columns() -> tuple[pl.Expr, pl.Expr]:
    """Per row: turns the loop check ended (``repetition_loops``), and the tokens their servers did not generate
    because the stream was closed there (``loop_tokens_saved``: max_tokens − pieces read, about a token each)."""
    loop = pl.element().struct
    saved = pl.when(loop.field("live")).then((loop.field("max_tokens") - loop.field("received")).clip(0))
    return (
        pl.col("turn_loop")
        .list.eval(loop.field("period").is_not_null())
        .list.sum()
        .fill_null(0)
        .alias("repetition_loops"),
        pl.col("turn_loop").list.eval(saved.otherwise(0)).list.sum().fill_null(0).alias("loop_tokens_saved"),
    )


def _count(path: Path) -> int:
    return pl.scan_parquet(path).select(pl.len()).collect().item() if path.exists() else 0


def _duplicates(path: Path) -> int:
    """rejected.parquet's skipped duplicate conversations (reason "duplicate of ID"): not malformed rows."""
    if not path.exists():
        return 0
    return int(
        pl.scan_parquet(path)
        .filter(pl.col("reason").str.starts_with(DUPLICATE_OF))
        .select(pl.len())
        .collect()
        .item()
    )


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: sessions of one folder follow each other (summed),
    nodes' sessions run side by side (counted once)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def run_clock(out_dir: RunDirs) -> HardwareClock:
    """The clock the run's servers ran on, as the manifests recorded it (older run folders, or folders whose
    servers ran on different clocks: the wall clock)."""
    clocks = [HardwareClock.from_dict((read_manifest(f) or {}).get("clock")) for f in run_dirs(out_dir)]
    return fleet_clock(clocks)[0]


def generating_seconds(sessions: list[dict[str, Any]], clock: HardwareClock) -> float | None:
    """The generation's own time, on the hardware's clock: from each session's first request sent to its last
    answer (what the estimate models), without the session's start-up and end (opening the folder, building
    clients, writing the last shard). None for sessions recorded before the span was."""
    spans = [(s.get("first_sent_at"), s.get("last_answer_at")) for s in sessions]
    if not spans or any(a is None or b is None for a, b in spans):
        return None
    return clock.seconds(busy_seconds(spans)) * kept_share_of(sessions)  # type: ignore[arg-type]


def start_wave_seconds(sessions: list[dict[str, Any]], clock: HardwareClock) -> float:
    """The fleet's capacity idle while each session's first wave was sent and admitted (generate.ramp), on the
    hardware's clock: the one part of a run the estimate does not model."""
    return sum(
        clock.seconds(s.get("start_wave_idle_s") or 0.0) * (s.get("clock_kept") or 1.0) for s in sessions
    )


def trained_tokens(out_dir: RunDirs) -> int:
    """Generated tokens the trainer keeps: per turn, at most its ``train_max_length`` − its prompt tokens (a capped
    run generates nothing past that; an uncapped one has the rest cut in training). Validate's own count, after
    its checks and held-out prompts, is the dataset card's."""
    total = 0
    for folder in run_dirs(out_dir):
        paths = shard_paths(folder)
        if not paths:
            continue
        limit = int(((read_manifest(folder) or {}).get("parameters") or {}).get("train_max_length") or 0)
        turns = (
            scan_shards(paths)
            .select(
                pl.coalesce("turn_prompt_tokens", pl.concat_list("prompt_tokens")).alias("prompt"),
                pl.coalesce("turn_completion_tokens", pl.concat_list("completion_tokens")).alias("made"),
            )
            .explode("prompt", "made")
        )
        made = pl.col("made").fill_null(0)
        kept = (
            pl.min_horizontal(made, pl.max_horizontal(limit - pl.col("prompt").fill_null(0), 0))
            if limit
            else made
        )
        total += int(turns.select(kept.sum()).collect().item() or 0)
    return total


def turn_cuts(out_dir: RunDirs) -> tuple[int, int, int]:
    """(turns, turns cut by max_tokens, turns cut where the trainer's max_length set the budget): a cut judged by
    its cause (generate.length_cap). A turn whose cause was not recorded (older shards) counts as cut by max_tokens."""
    turns = by_tokens = at_length = 0
    for _folder, shards in stored_shards(out_dir):
        cuts = (
            shards.select(
                pl.coalesce("turn_finish_reason", pl.concat_list("finish_reason")).alias("finish"),
                pl.coalesce(
                    "turn_budget_by",
                    pl.coalesce("turn_finish_reason", pl.concat_list("finish_reason")).list.eval(
                        pl.lit(BY_MAX_TOKENS)
                    ),
                ).alias("by"),
            )
            .explode("finish", "by")
            .select(
                pl.len().alias("turns"),
                ((pl.col("finish") == "length") & (pl.col("by") != BY_MAX_LENGTH)).sum().alias("by_tokens"),
                ((pl.col("finish") == "length") & (pl.col("by") == BY_MAX_LENGTH)).sum().alias("at_length"),
            )
            .collect()
            .row(0)
        )
        turns, by_tokens, at_length = turns + cuts[0], by_tokens + cuts[1], at_length + cuts[2]
    return turns, by_tokens, at_length


def summary(out_dir: RunDirs) -> pl.DataFrame:
    """One row of run-level figures (several folders: one row for them together, wall time their union), times
    and rates on the servers' clock (``clock`` and the raw ``wall_clock_s`` columns when simulated)."""
    folders = run_dirs(out_dir)
    clock = run_clock(folders)
    rows = scan_results(folders)
    sessions = [s for folder in folders for s in (read_manifest(folder) or {}).get("sessions", [])]
    wall_clock = busy_seconds([(s["started_at"], s["ended_at"]) for s in sessions])
    wall = clock.seconds(wall_clock) * kept_share_of(sessions)
    session_tokens = sum(s["completion_tokens"] for s in sessions)
    trained, gpu_s = trained_tokens(folders), gpu_seconds(sessions)
    turns, cut_tokens, cut_length = turn_cuts(folders)
    generating = generating_seconds(sessions, clock) if sessions else None
    wave = start_wave_seconds(sessions, clock)
    warm = generating - wave if generating and generating > wave else None
    frame = rows.select(
        pl.len().alias("rows"),
        pl.col("id").n_unique().alias("unique_ids"),
        pl.col("turns").sum().alias("turns"),
        pl.col("completion_tokens").sum().alias("completion_tokens"),
        pl.col("completion_tokens").mean().round(1).alias("mean_completion_tokens"),
        pl.col("completion_tokens").quantile(0.99).alias("p99_completion_tokens"),
        pl.col("latency_s").median().round(2).alias("median_latency_s"),
        pl.col("latency_s").quantile(0.99).round(2).alias("p99_latency_s"),
        pl.col("empty_answer").mean().round(4).alias("empty_answer_rate"),
        pl.col("empty_reasoning").mean().round(4).alias("empty_reasoning_rate"),
        pl.col("spec_accept_length").mean().round(3).alias("mean_accept_length"),
        (pl.col("attempts") > pl.col("turns")).sum().alias("retried"),
        pl.col("repetition_loops").sum(),
        pl.col("loop_tokens_saved").sum(),
    ).collect()
    cache = cache_share(folders)["turn"]
    frame = on_clock(frame, clock).with_columns(
        pl.col("median_latency_s", "p99_latency_s").round(2),
        pl.lit(sum(_count(folder / FAILED) for folder in folders)).alias("failed"),
        pl.lit(sum(_count(folder / REJECTED) for folder in folders)).alias("rejected"),
        pl.lit(sum(_duplicates(folder / REJECTED) for folder in folders)).alias("duplicates_skipped"),
        pl.lit(round(wall, 1)).alias("wall_s"),
        pl.lit(round(session_tokens / wall, 1) if wall > 0 else None).alias("output_tok_s"),
        pl.lit(round(generating, 1) if generating else None).alias("generating_s"),
        pl.lit(round(wave, 1)).alias("start_wave_idle_s"),
        pl.lit(round(session_tokens / warm, 1) if warm else None).alias("generating_tok_s"),
        pl.lit(round(cut_tokens / turns, 4) if turns else None).alias("truncated_rate"),
        pl.lit(round(cut_length / turns, 4) if turns else None).alias("cut_at_max_length_rate"),
        pl.lit(trained).alias("trained_tokens"),
        pl.lit(round(gpu_s / trained * 1e6, 1) if trained else None).alias("gpu_s_per_m_trained"),
        pl.lit(len(sessions)).alias("sessions"),
        pl.lit(sum(s.get("hedged", 0) for s in sessions)).alias("hedged"),
        pl.lit(sum(s.get("hedge_wins", 0) for s in sessions)).alias("hedge_wins"),
        pl.lit(
            round(cache["cached_tokens"].sum() / cache["prompt_tokens"].sum(), 4) if cache.height else None,
            dtype=pl.Float64,
        ).alias("cached_share"),
    )
    if clock.simulated:
        frame = frame.with_columns(
            pl.lit(round(wall_clock, 1)).alias("wall_clock_s"),
            pl.lit(round(kept_share_of(sessions), 4)).alias("clock_kept"),
            pl.lit(clock.short).alias("clock"),
        )
    return frame.with_columns(pl.lit(len(folders)).alias("folders")) if len(folders) > 1 else frame


def per_server(out_dir: RunDirs) -> pl.DataFrame:
    """Rows, tokens and speed per server (tok/s over the span the server was finishing requests); with several
    folders, per folder and server. On the servers' clock."""
    keys = ["folder", "server"] if len(run_dirs(out_dir)) > 1 else ["server"]
    rows = scan_results(out_dir).with_columns(
        (pl.col("started_at") + pl.col("latency_s")).alias("finished_at")
    )
    frame = (
        rows.group_by(keys)
        .agg(
            pl.len().alias("rows"),
            pl.col("completion_tokens").sum().alias("completion_tokens"),
            (pl.col("finished_at").max() - pl.col("started_at").min()).alias("span_s"),
            pl.col("latency_s").median().alias("median_latency_s"),
            pl.col("spec_accept_length").mean().round(3).alias("mean_accept_length"),
            (pl.col("attempts") > pl.col("turns")).sum().alias("retried"),
        )
        .with_columns((pl.col("completion_tokens") / pl.col("span_s")).alias("tok_s"))
        .sort(keys)
        .collect()
    )
    return on_clock(frame, run_clock(out_dir)).with_columns(
        pl.col("tok_s").round(1), pl.col("span_s", "median_latency_s").round(2)
    )


def cache_share(out_dir: RunDirs) -> dict[str, pl.DataFrame]:
    """The share of prompt tokens the servers' prefix caches served, per server and per turn index (0: the first
    answer), over the stored turns whose server reported it (``draftgen.generate.cache_share``)."""
    return cache_tables(pl.concat([shards for _, shards in stored_shards(out_dir)], how="vertical_relaxed"))


def acceptance(out_dir: RunDirs) -> pl.DataFrame:
    """MTP acceptance per worker from its /metrics counter differences (acceptance.parquet), token-weighted:
    known through a router too, where the answers carry no per-request ``sglext``. Several folders: one table
    per folder, side by side (nodes sharing workers each measured the same counters, so they are not summed)."""
    folders = run_dirs(out_dir)
    if len(folders) == 1:
        return acceptance_per_worker(read_samples(folders[0]))
    tables = [
        acceptance_per_worker(read_samples(f)).select(pl.lit(str(f)).alias("folder"), pl.all())
        for f in folders
    ]
    return pl.concat(tables, how="diagonal_relaxed")


# ----- acceptance where it is low --------------------------------------------------------------------------
def _turn_list(name: str, scalar: str) -> pl.Expr:
    """A per-turn list column, or (shards written before it) a one-element list of the row's scalar."""
    return pl.coalesce(pl.col(name), pl.concat_list(pl.col(scalar)))


def request_table(out_dir: RunDirs) -> pl.DataFrame:
    """One row per generated turn (a request): its prompt's category, its sampling-plan arm, turn index, tokens,
    verify steps, acceptance and latency on the servers' clock — the input of ``draftgen.breakdown``."""
    frames = []
    single = pl.col("turn_completion_tokens").list.len().fill_null(1) == 1
    for _folder, shards in stored_shards(out_dir):
        frames.append(
            shards.select(
                "id",
                "category",
                "arm",
                _turn_list("turn_completion_tokens", "completion_tokens").alias("completion_tokens"),
                _turn_list("turn_spec_verify_ct", "spec_verify_ct").alias("verify_ct"),
                _turn_list("turn_spec_accept_length", "spec_accept_length").alias("accept_length"),
                # older shards kept one latency per row: a turn's only when the row has one turn
                pl.coalesce(
                    pl.col("turn_latency_s"), pl.when(single).then(pl.concat_list(pl.col("latency_s")))
                ).alias("latency_s"),
            )
        )
    lists = ("completion_tokens", "verify_ct", "accept_length")
    frame = (
        pl.concat(frames, how="vertical_relaxed")
        .with_columns(
            pl.int_ranges(pl.col("completion_tokens").list.len()).alias("turn"),
            pl.coalesce(
                pl.col("latency_s"),
                pl.lit(None, dtype=pl.Float64).repeat_by(pl.col("completion_tokens").list.len()),
            ),
        )
        .explode("turn", *lists, "latency_s")
        .collect()
    )
    clock = run_clock(out_dir)
    return frame.with_columns(pl.col("latency_s") * clock.factor) if clock.simulated else frame


def acceptance_breakdowns(out_dir: RunDirs) -> Breakdowns:
    """Acceptance length and tok/s per request by prompt category, output length, turn and sampling-plan arm
    (docs/generate.md, "Acceptance where it is low"); tok/s on the servers' clock."""
    return breakdowns(request_table(out_dir))


def plot_acceptance_by_category(out_dir: RunDirs, save_to: str | Path | None = None) -> Plot:
    """Acceptance length per prompt category, sorted, with each category's requests and 95% interval."""
    home = plots_home(out_dir, save_to)
    requests = request_table(out_dir)
    table = breakdown(requests, "category") if "category" in requests.columns else None
    return _save(acceptance_by_category(table, "generated turns"), home, GENERATE_PLOT_BY_CATEGORY)


def plot_acceptance_by_length(out_dir: RunDirs, save_to: str | Path | None = None) -> Plot:
    """Acceptance length per output-length bucket, with each bucket's requests and 95% interval."""
    home = plots_home(out_dir, save_to)
    table = breakdown(request_table(out_dir), "length")
    return _save(acceptance_by_length(table, "generated turns"), home, GENERATE_PLOT_BY_LENGTH)


def draft_positions(out_dir: RunDirs) -> DraftPositions:
    """Every stored turn's drafts histogram (SGLang's spec_correct_drafts_histogram) summed: acceptance per draft
    position (draftgen.draft_positions); no turns where the servers sent none."""
    frames = [shards.select(DRAFTS_HISTOGRAM) for _, shards in stored_shards(out_dir)]
    return from_rows(pl.concat(frames))


def plot_acceptance_by_position(out_dir: RunDirs, save_to: str | Path | None = None) -> Plot:
    """The share of verify steps whose k-th draft was accepted, per position k, from the drafts histograms."""
    home = plots_home(out_dir, save_to)
    return _save(acceptance_by_position(draft_positions(out_dir)), home, GENERATE_PLOT_BY_POSITION)


def finish_reasons(out_dir: RunDirs) -> pl.DataFrame:
    """How each generated turn ended, every turn of a conversation (a row's own ``finish_reason`` is its last
    turn's): max_tokens cuts turns, so a conversation cut in its middle turn counts that cut."""
    frames = [
        shards.select(_turn_list("turn_finish_reason", "finish_reason").alias("finish_reason"))
        for _folder, shards in stored_shards(out_dir)
    ]
    return (
        pl.concat(frames)
        .explode("finish_reason")
        .group_by("finish_reason")
        .agg(pl.len().alias("turns"))
        .with_columns((pl.col("turns") / pl.col("turns").sum()).round(4).alias("share"))
        .sort("turns", descending=True)
        .collect()
    )


# ----- plots ----------------------------------------------------------------------------------------------
def plots_home(out_dir: RunDirs, save_to: str | Path | None) -> Path:
    """Where ``plots/`` goes: ``save_to``, else the one run folder (several folders need ``save_to``)."""
    if save_to is not None:
        return Path(save_to)
    folders = run_dirs(out_dir)
    if len(folders) > 1:
        raise ValueError(
            "several run folders: pass save_to=FOLDER for the plots (no node's folder is chosen)"
        )
    return folders[0]


def _save(figure: Figure, out_dir: Path, name: str) -> Plot:
    return save(figure, out_dir / PLOTS, name)


def spread_rate(starts: np.ndarray, ends: np.ndarray, tokens: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Tokens/s in each bin between ``edges``, each request's tokens spread evenly over its own lifetime.

    A non-streamed request reports all its tokens when it ends; charging them to that instant draws spikes, not
    the server's speed. Events (+rate at start, -rate at end) give a piecewise-constant rate integrated per bin.
    """
    duration = np.maximum(ends - starts, 1e-9)
    rate = tokens / duration
    times = np.concatenate([starts, ends])
    steps = np.concatenate([rate, -rate])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(steps[order])
    # Integral of the rate from the first event to each edge, then differences per bin.
    knots = np.concatenate([[times[0]], times])
    area = np.concatenate([[0.0], np.cumsum(np.diff(knots) * np.concatenate([[0.0], level[:-1]]))])
    index = np.clip(np.searchsorted(times, edges, side="right") - 1, 0, len(times) - 1)
    at_edges = area[index + 1] + level[index] * np.clip(edges - times[index], 0, None)
    at_edges[edges < times[0]] = 0.0
    return np.diff(at_edges) / np.diff(edges)


def plot_throughput(out_dir: RunDirs, save_to: str | Path | None = None) -> Plot:
    """Completion tokens per second over time, one line per server (each request spread over its lifetime), on
    the servers' clock."""
    home = plots_home(out_dir, save_to)
    clock = run_clock(out_dir)
    several = len(run_dirs(out_dir)) > 1
    rows = (
        scan_results(out_dir)
        .select(
            pl.concat_str(pl.col("folder"), pl.lit(" "), pl.col("server")).alias("server")
            if several
            else pl.col("server"),
            pl.col("completion_tokens").fill_null(0).cast(pl.Float64),
            pl.col("started_at").alias("start"),
            (pl.col("started_at") + pl.col("latency_s")).alias("end"),
        )
        .collect()
    )
    t0, t1 = rows["start"].min(), rows["end"].max()
    span = clock.seconds(max(1e-6, t1 - t0))
    edges = np.linspace(t0, t1, 61)
    figure = Figure(figsize=(9, 4))
    axes = figure.subplots()
    scale, unit = (3600.0, "h") if span > 7200 else (60.0, "min") if span > 600 else (1.0, "s")
    centers = clock.seconds((edges[:-1] + edges[1:]) / 2 - t0) / scale
    for (server,), group in rows.group_by("server", maintain_order=True):
        rate = spread_rate(
            group["start"].to_numpy(), group["end"].to_numpy(), group["completion_tokens"].to_numpy(), edges
        )
        label = server if several else short_label(server)
        axes.plot(centers, clock.rate(rate), label=label, linewidth=1.2)
    axes.set_title(
        "How fast did each server produce tokens over the run?"
        + (f"\n({clock.note})" if clock.simulated else "")
    )
    axes.set_xlabel(f"time since the first request ({unit}{', ' + clock.short if clock.simulated else ''})")
    axes.set_ylabel(f"completion tok/s {clock.per_gpu}" if clock.simulated else "completion tok/s")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=7, ncols=2)
    axes.grid(alpha=0.3)
    return _save(figure, home, GENERATE_PLOT_THROUGHPUT)


def plot_acceptance(out_dir: RunDirs, save_to: str | Path | None = None) -> Plot:
    """MTP acceptance length over time, one line per worker, from its /metrics windows (acceptance.parquet),
    against the run's token-weighted mean and its 95% interval; the axis starts at 1 (no draft token accepted),
    so a ±1% wobble looks like one."""
    home = plots_home(out_dir, save_to)
    folders = run_dirs(out_dir)
    frames = [
        read_samples(folder).with_columns(pl.lit(str(folder) if len(folders) > 1 else "").alias("folder"))
        for folder in folders
    ]
    samples = pl.concat(frames).filter(pl.col("accept_length").is_not_null())
    figure = Figure(figsize=(9, 3.8))
    axes = figure.subplots()
    if samples.is_empty():
        axes.text(0.5, 0.5, "no acceptance windows (acceptance_interval_s 0, or no /metrics)", ha="center")
        axes.set_axis_off()
        return _save(figure, home, GENERATE_PLOT_ACCEPTANCE)
    clock = run_clock(folders)
    t0 = samples["started_at"].min()
    span = clock.seconds(samples["ended_at"].max() - t0)
    scale, unit = (3600.0, "h") if span > 7200 else (60.0, "min") if span > 600 else (1.0, "s")
    for (folder, worker), group in samples.sort("ended_at").group_by("folder", "worker", maintain_order=True):
        middle = clock.seconds(((group["started_at"] + group["ended_at"]) / 2 - t0).to_numpy()) / scale
        label = f"{folder} {short_label(worker)}" if folder else short_label(worker)
        axes.plot(middle, group["accept_length"].to_numpy(), marker=".", linewidth=1.0, label=label)
    tokens = samples["generated_tokens"].cast(pl.Float64).to_numpy()
    band = ratio_interval(tokens, tokens / samples["accept_length"].to_numpy())
    top = float(samples["accept_length"].max())
    if band is not None:
        top = max(top, mean_band(axes, band))
    axes.set_ylim(1.0, top * 1.08)
    axes.set_title("Did MTP acceptance hold up on every worker over the run?")
    axes.set_xlabel(f"time since the first window ({unit}{', ' + clock.short if clock.simulated else ''})")
    axes.set_ylabel("acceptance length\n(tokens per verify step; 1 = no draft accepted)")
    axes.legend(fontsize=7, ncols=3, loc="lower right")
    axes.grid(alpha=0.3)
    return _save(figure, home, GENERATE_PLOT_ACCEPTANCE)


def plot_finish_reasons(out_dir: RunDirs, save_to: str | Path | None = None) -> Plot:
    home = plots_home(out_dir, save_to)
    frame = finish_reasons(out_dir)
    figure = Figure(figsize=(6, 3.2))
    axes = figure.subplots()
    labels = [str(r) for r in frame["finish_reason"].to_list()]
    axes.bar(labels, frame["turns"].to_list(), color="#4c72b0")
    for index, share in enumerate(frame["share"].to_list()):
        axes.annotate(f"{share:.1%}", (index, frame["turns"][index]), ha="center", va="bottom", fontsize=8)
    axes.set_title("How did the generated turns end (stop = finished, length = hit max_tokens)?")
    axes.set_xlabel("finish_reason, per generated turn")
    axes.set_ylabel("generated turns")
    return _save(figure, home, GENERATE_PLOT_FINISH_REASONS)


def plot_completion_lengths(
    out_dir: RunDirs, max_tokens: int | None = None, save_to: str | Path | None = None
) -> Plot:
    """Completion tokens per generated turn, where max_tokens applies (it caps each turn); with multi-turn rows,
    the whole conversations' lengths beside it, without the cap's line (it does not apply to a sum)."""
    home = plots_home(out_dir, save_to)
    turns = request_table(out_dir)["completion_tokens"].drop_nulls().to_numpy()
    rows = scan_results(out_dir).select("completion_tokens", "turns").drop_nulls().collect()
    several = bool(rows.height) and int(rows["turns"].max()) > 1
    figure = Figure(figsize=(11, 3.6) if several else (7, 3.6))
    axes = figure.subplots(1, 2 if several else 1)
    first = axes[0] if several else axes
    completion_length_histogram(
        first,
        turns,
        max_tokens,
        title="How long are the answers? (per generated turn)",
        ylabel="generated turns",
    )
    if several:
        completion_length_histogram(
            axes[1],
            rows["completion_tokens"].to_numpy(),
            None,
            title="…and whole conversations (all turns; no cap)",
            ylabel="conversations",
            xlabel="completion tokens per conversation",
        )
    figure.tight_layout()
    return _save(figure, home, GENERATE_PLOT_LENGTHS)


# ----- planned vs actual ----------------------------------------------------------------------------------
def compare_estimate(
    estimate_path: str | Path, out_dir: RunDirs, total_prompts: int | None = None
) -> pl.DataFrame:
    """estimate.ipynb's planned figures beside this run's: aggregate output tok/s and wall time for the set.

    The set is the estimate's ``num_prompts`` (requests: one per answer of a conversation with ``turns: all``)
    unless ``total_prompts`` is given (in the same unit). A run of the estimate's whole set is measured by its own
    span; any other run's wall time for the set is projected from its mean completion length per request and
    aggregate speed. Both sides are on their hardware's clock (the
    estimate's from its benchmark, the run's from its servers), so a simulated run compares in simulated-GPU
    units on both sides, each converted once.
    """
    estimate: dict[str, Any] = load_estimate(estimate_path)
    clock = run_clock(out_dir)
    run = summary(out_dir).row(0, named=True)
    prompts = int(total_prompts or estimate["num_prompts"])
    planned_tok_s = float(estimate["aggregate_output_tok_s"])
    planned_wall = float(estimate["wall_time_s"]) * prompts / max(1, int(estimate["num_prompts"]))
    # The generation's own span (first request to last answer), which is what the estimate models; the session's
    # start-up and end are reported beside it.
    actual_tok_s = run.get("generating_tok_s") or run["output_tok_s"]
    turns = run["turns"]
    mean_tokens = round(run["completion_tokens"] / turns, 1) if turns and run["completion_tokens"] else None
    actual_wall = prompts * mean_tokens / actual_tok_s if actual_tok_s and mean_tokens else None
    if total_prompts is None:
        actual_wall = _whole_set_span(estimate, out_dir, run) or actual_wall
    unit, unit_s = duration_unit(planned_wall)
    records = [
        ("requests in the set", float(prompts), float(prompts)),
        ("aggregate output tok/s", planned_tok_s, actual_tok_s),
        ("mean completion tokens per request", float(estimate["mean_completion_tokens"]), mean_tokens),
        (
            f"wall time for the set ({unit}{', ' + clock.short if clock.simulated else ''})",
            planned_wall / unit_s,
            actual_wall / unit_s if actual_wall else None,
        ),
    ]
    generating, servers = run.get("generating_s"), _servers(out_dir)
    if generating and run["wall_s"]:
        records.append(
            ("session start-up and end outside the generation (s)", 0.0, run["wall_s"] - generating)
        )
        wave = run.get("start_wave_idle_s") or 0.0
        records.append(("capacity idle while the first wave went out (s, not in the wall time)", 0.0, wave))
        generating -= wave
    # estimates made before trained tokens were priced lack it
    if estimate.get("gpu_s_per_m_trained") is not None:
        usd = float(estimate.get("gpu_hour_usd") or 0.0) / 3600.0
        trained = run.get("trained_tokens")
        span = generating or run["wall_s"]
        actual_gpu_s = span * servers / trained * 1e6 if trained and servers else None
        records += [
            ("GPU-seconds per million trained tokens", float(estimate["gpu_s_per_m_trained"]), actual_gpu_s),
            (
                "dollars per million trained tokens",
                float(estimate["gpu_s_per_m_trained"]) * usd,
                actual_gpu_s * usd if actual_gpu_s else None,
            ),
        ]
    return pl.DataFrame(
        {
            "figure": [r[0] for r in records],
            "planned": [round(r[1], 3) for r in records],
            "actual": [round(r[2], 3) if r[2] is not None else None for r in records],
            "actual / planned": [
                round(r[2] / r[1], 3) if r[2] is not None and r[1] else None for r in records
            ],
        }
    )


def _whole_set_span(estimate: dict[str, Any], out_dir: RunDirs, run: dict[str, Any]) -> float | None:
    """The generation's span (first request to last answer) when this run is the estimate's whole set: every
    conversation the estimate counted, finished, in one folder. That is what the estimate models, measured; the
    projection by requests would carry the estimate's own request count into the actual. None otherwise."""
    counted, folders = estimate.get("set_conversations"), run_dirs(out_dir)
    if not counted or len(folders) != 1 or not run.get("generating_s"):
        return None
    manifest = read_manifest(folders[0]) or {}
    parameters = manifest.get("parameters") or {}
    if manifest.get("status") != "complete" or parameters.get("limit") or parameters.get("shard"):
        return None
    if (manifest.get("prompts") or {}).get("valid") != counted:
        return None
    return float(run["generating_s"]) - float(run.get("start_wave_idle_s") or 0.0)


def _servers(out_dir: RunDirs) -> int:
    """Servers of the run's last session (summed over the folders)."""
    count = 0
    for folder in run_dirs(out_dir):
        sessions = (read_manifest(folder) or {}).get("sessions") or []
        count += len(sessions[-1].get("servers") or ()) if sessions else 0
    return count


def estimate_assumptions(estimate_path: str | Path, config_values: dict[str, Any]) -> list[str]:
    """Where this run differs from what the estimate assumed (servers, concurrency, max_tokens, sampling plan)."""
    estimate = load_estimate(estimate_path)
    notes = []
    servers = estimate["servers"]
    count = len(servers) if isinstance(servers, list) else servers
    if count != len(config_values["servers"]):
        notes.append(f"estimate assumed {count} servers, this run used {len(config_values['servers'])}")
    for key in ("concurrency_per_server", "max_tokens"):
        if estimate[key] != config_values[key]:
            notes.append(f"estimate assumed {key}={estimate[key]}, this run used {config_values[key]}")

    def arms(plan: list[dict] | None) -> list[dict]:
        return [Arm.model_validate(arm).model_dump(exclude_none=True) for arm in plan or []]

    priced = arms((estimate.get("config") or {}).get("sampling_plan"))
    if priced != arms(config_values.get("sampling_plan")):
        notes.append(
            f"estimate priced the sampling plan {priced or 'none'}, this run uses "
            f"{arms(config_values.get('sampling_plan')) or 'none'}"
        )
    planned = HardwareClock.from_dict(estimate.get("clock"))
    out_dir = config_values.get("out_dir")
    actual = run_clock(out_dir) if out_dir else planned
    if (planned.hardware, planned.simulated) != (actual.hardware, actual.simulated):
        notes.append(
            f"the estimate is on the {planned.short}, this run on the {actual.short}: not like for like"
        )
    return notes


# ----- what the report shows --------------------------------------------------------------------------------
SUMMARY_SPECS = (
    Column("rows", "rows stored", "int"),
    Column("unique_ids", "distinct ids", "int"),
    Column("turns", "turns answered", "int"),
    Column("completion_tokens", "completion tokens", "int"),
    Column("mean_completion_tokens", "mean completion tokens per row", "int"),
    Column("p99_completion_tokens", "p99 completion tokens per row", "int"),
    Column("median_latency_s", "median latency (s)", "number"),
    Column("p99_latency_s", "p99 latency (s)", "number"),
    Column("truncated_rate", "turns cut by max_tokens", "percent"),
    Column("cut_at_max_length_rate", "turns cut at the trainer's max_length (expected)", "percent"),
    Column("empty_answer_rate", "empty answers", "percent"),
    Column("empty_reasoning_rate", "empty reasoning", "percent"),
    Column("mean_accept_length", "mean acceptance length", "number", 2),
    Column("retried", "rows retried", "int"),
    Column("failed", "failed (failed.parquet)", "int"),
    Column("rejected", "rejected prompt rows", "int"),
    Column("duplicates_skipped", "of them, duplicate conversations skipped", "int"),
    Column("wall_s", "wall time", "duration"),
    Column("output_tok_s", "fleet output tok/s", "tok_s"),
    Column("generating_s", "the generation (first request sent to last answer)", "duration"),
    Column("start_wave_idle_s", "capacity idle while the first wave went out", "duration"),
    Column("generating_tok_s", "fleet output tok/s over the generation less that", "tok_s"),
    Column("trained_tokens", "trained tokens (each turn's up to train_max_length)", "int"),
    Column("gpu_s_per_m_trained", "GPU-seconds per million trained tokens", "number", 0),
    Column("sessions", "sessions", "int"),
    Column("hedged", "requests hedged at the tail", "int"),
    Column("hedge_wins", "hedges that won", "int"),
    Column("cached_share", "prompt tokens served from the prefix cache", "percent"),
    Column("wall_clock_s", "wall time on the wall clock", "duration"),
    Column("clock_kept", "share of its clock the simulator kept", "percent"),
    Column("folders", "run folders", "int"),
)
CACHE_SPECS = (
    Column("server", "server", "text"),
    Column("turn", "turn (0: the first answer)", "int"),
    Column("turns", "turns that reported it", "int"),
    Column("prompt_tokens", "prompt tokens", "int"),
    Column("cached_tokens", "served from the prefix cache", "int"),
    Column("cached_share", "share", "percent"),
)
PER_SERVER_SPECS = (
    Column("folder", "folder", "text"),
    Column("server", "server", "text"),
    Column("rows", "rows", "int"),
    Column("completion_tokens", "completion tokens", "int"),
    Column("span_s", "busy span", "duration"),
    Column("median_latency_s", "median latency (s)", "number"),
    Column("mean_accept_length", "mean acceptance length", "number", 2),
    Column("retried", "retried", "int"),
    Column("tok_s", "completion tok/s", "tok_s"),
)
ACCEPTANCE_SPECS = (
    Column("folder", "folder", "text"),
    Column("worker", "worker", "text"),
    Column("via", "via", "text"),
    Column("windows", "/metrics windows", "int"),
    Column("generated_tokens", "generated tokens", "int"),
    Column("accept_length", "acceptance length", "number", 2),
    Column("min_window", "lowest window", "number", 2),
    Column("max_window", "highest window", "number", 2),
    Column("span_s", "span", "duration"),
)


POSITION_SPECS = (
    Column("position", "draft position", "int"),
    Column("accepted", "verify steps that accepted it", "int"),
    Column("share", "of all verify steps", "percent"),
    Column("given_previous", "of those that accepted the draft before it", "percent"),
)


def draft_positions_view(out_dir: RunDirs) -> Table:
    """Acceptance per draft position, from every stored turn's drafts histogram."""
    positions = draft_positions(out_dir)
    frame = positions.table()
    return Table(
        frame,
        with_specs(frame, POSITION_SPECS),
        title=f"Acceptance per draft position ({positions.verify_steps:,} verify steps of {positions.turns:,} turns)",
        empty="no drafts histogram: the servers sent none (SGLang 0.5.23 with return_spec_tokens_details)",
    )


def summary_view(out_dir: RunDirs) -> Table:
    """The run-level figures, one per line, on the servers' clock (the clock as a note, not a column)."""
    frame = summary(out_dir)
    clock = run_clock(out_dir)
    return Table(frame, with_specs(frame, SUMMARY_SPECS, drop=("clock",)), note=clock.note)


def per_server_view(out_dir: RunDirs) -> Table:
    """Rows, tokens and speed per server, servers by their short name."""
    frame = per_server(out_dir).with_columns(
        pl.col("server").map_elements(short_label, return_dtype=pl.String)
    )
    return Table(
        frame, with_specs(frame, PER_SERVER_SPECS), note=run_clock(out_dir).note, empty="no rows stored"
    )


def acceptance_view(out_dir: RunDirs) -> Table:
    """MTP acceptance per worker from its /metrics windows."""
    frame = acceptance(out_dir)
    if "via" in frame.columns and frame["via"].to_list() == frame["worker"].to_list():
        frame = frame.drop("via")  # no router: each server is its own worker
    for column in ("worker", "via"):
        if column in frame.columns:
            frame = frame.with_columns(pl.col(column).map_elements(short_label, return_dtype=pl.String))
    return Table(
        frame,
        with_specs(frame, ACCEPTANCE_SPECS),
        title="MTP acceptance per worker, from its /metrics counters",
        empty="no acceptance windows: acceptance_interval_s is 0, or the servers expose no /metrics",
    )


def cache_view(out_dir: RunDirs) -> Stack:
    """The prefix cache's share of prompt tokens per server and per turn index (a run reused what a server had
    prefilled: a conversation's history, a prompt's earlier sample)."""
    empty = (
        "no stored turn reported its cached tokens: the servers were not started with --enable-cache-report "
        "(draftgen serve starts SGLang with it), or the engine does not report them"
    )
    tables = cache_share(out_dir)
    by_server = tables["server"].with_columns(
        pl.col("server").map_elements(short_label, return_dtype=pl.String)
    )
    return Stack(
        (
            Table(
                by_server, with_specs(by_server, CACHE_SPECS), title="Prefix cache, per server", empty=empty
            ),
            Table(
                tables["turn"],
                with_specs(tables["turn"], CACHE_SPECS),
                title="Prefix cache, per turn",
                empty=empty,
            ),
        )
    )


def compare_view(estimate_path: str | Path, out_dir: RunDirs) -> Table:
    """The estimate's planned figures beside this run's."""
    return Table(
        compare_estimate(estimate_path, out_dir),
        (
            Column("figure", "figure", "text"),
            Column("planned", "planned", "number"),
            Column("actual", "actual", "number"),
            Column("actual / planned", "actual / planned", "ratio"),
        ),
    )


def assumptions_view(estimate_path: str | Path, config_values: dict[str, Any]) -> Notes:
    return Notes(
        estimate_assumptions(estimate_path, config_values),
        title="Where this run differs from what the estimate assumed",
        none="This run used the servers, concurrency, max_tokens and clock the estimate assumed.",
        level="warn",
    )


def _skipped(duplicates: int) -> str:
    return f" ({duplicates:,} of them duplicates, skipped)" if duplicates else ""


def headline(out_dir: RunDirs, estimate_path: str | Path | None = None) -> Headline:
    """Is every prompt answered once, nothing lost, and how fast? From the run folder(s), so a resumed run's
    headline counts every session."""
    folders = run_dirs(out_dir)
    manifests = [read_manifest(f) or {} for f in folders]
    run = summary(folders).row(0, named=True)
    clock = run_clock(folders)
    statuses = {str(m.get("status")) for m in manifests}
    todo = sum(int((m.get("prompts") or {}).get("valid", 0)) for m in manifests)
    stored, failed, rejected = run["unique_ids"], run["failed"], run["rejected"]
    gpus = sum(len((m.get("sessions") or [{}])[-1].get("servers", []) or []) for m in manifests) or None
    per_gpu = run["output_tok_s"] / gpus if gpus and run["output_tok_s"] else None
    if statuses <= {"complete"} and not failed:
        verdict, reason = "PASS", ""
    elif statuses <= {"complete", "complete_with_failures"}:
        verdict, reason = (
            "WARN",
            f"{failed:,} prompts failed every attempt (failed.parquet; a resume retries them)",
        )
    else:
        verdict = "STOPPED"
        reason = f"the run ended {', '.join(sorted(statuses))}: run it again with --resume to finish"
    stats = [
        Stat("rows stored", f"{stored:,}", "", f"of {todo:,} prompts" if todo else ""),
        Stat(
            "failed",
            f"{failed:,}",
            "",
            f"{rejected:,} prompt rows rejected{_skipped(run['duplicates_skipped'])}",
        ),
        Stat(
            "fleet output",
            format_value(run["output_tok_s"], "tok_s"),
            "tok/s",
            f"{format_value(per_gpu, 'tok_s')} tok/s {clock.per_gpu}" if per_gpu else "",
        ),
        Stat("wall time", format_value(run["wall_s"], "duration"), "", f"{run['sessions']} session(s)"),
        Stat(
            "per million trained tokens",
            format_value(run["gpu_s_per_m_trained"], "number", 0),
            "GPU-s",
            f"{run['trained_tokens']:,} trained tokens (each turn's up to the trainer's max_length)",
        ),
        Stat(
            "acceptance length", format_value(run["mean_accept_length"], "number", 2), "", "mean per request"
        ),
        Stat(
            "cut by max_tokens",
            format_value(run["truncated_rate"], "percent"),
            "",
            f"of turns; {format_value(run['cut_at_max_length_rate'], 'percent')} more cut at the trainer's "
            f"max_length (expected); empty answers {format_value(run['empty_answer_rate'], 'percent')}",
        ),
    ]
    if estimate_path:
        planned = load_estimate(estimate_path)
        actual = run.get("generating_tok_s") or run["output_tok_s"]  # as compare_estimate compares it
        ratio = actual / planned["aggregate_output_tok_s"] if actual else None
        if ratio:
            stats.append(
                Stat("against the estimate", f"{ratio:.2f}×", "its tok/s", "planned vs actual below")
            )
    home = folders[0]
    files = [("manifest", home / "manifest.json"), ("shards", home / SHARDS)]
    if failed:
        files.append(("failed prompts", home / FAILED))
    return Headline(
        step="generate",
        question="is every prompt answered exactly once, nothing lost, and how fast did the fleet do it?",
        answer=f"{stored:,} of {todo:,} prompts stored, {failed:,} failed"
        if todo
        else f"{stored:,} rows stored",
        stats=stats,
        verdict=verdict,
        reason=reason,
        clock=clock.note,
        files=files,
        home=home,
    )


def planned_vs_actual(
    estimate_path: str | Path | None, out_dir: RunDirs, config_values: dict[str, Any]
) -> Stack:
    """The estimate's figures beside this run's and where the run differs from its assumptions; without an
    estimate, the sentence saying how to get one."""
    if not estimate_path:
        return Stack(
            (Notes((), none="No estimate given: set estimate to an estimate.json to compare with it."),)
        )
    return Stack((compare_view(estimate_path, out_dir), assumptions_view(estimate_path, config_values)))
