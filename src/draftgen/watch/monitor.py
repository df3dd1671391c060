"""monitor.ipynb's reads and plots: how is a generate run doing, and when will it end? Read-only.

Everything here only reads the run folder, and only what a running generate has finished writing:
progress.json (replaced atomically), the complete lines of progress-history.jsonl, and shards under their final
names (``shards/part-*.parquet``; a shard being written has a temporary name until it is whole). A shard that
vanishes between listing and reading (moved away by hand) is skipped. Shards are scanned lazily for the two
columns the plots need, so a million-row run reads in seconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from draftgen.breakdown import Breakdowns, breakdowns, ratio_interval
from draftgen.display.breakdown_plots import acceptance_by_category
from draftgen.display.headline import Headline, Stat
from draftgen.display.humanize import short_label
from draftgen.display.plots import Plot, completion_length_histogram, mean_band, message
from draftgen.display.table import format_value
from draftgen.params import NotebookCell, Params, ProjectPath, param
from draftgen.paths import root_note
from draftgen.rundir.layout import MANIFEST, shard_paths
from draftgen.watch.progress_file import read_history, read_progress
from draftgen.watch.status import RUNNING, judge, status_report
from draftgen.watch.status_tables import StatusTables

# The columns the plots need, and their types. Multi-turn rows carry one element per generated turn in the
# turn_* lists; shards written before those columns existed lack them (read as null: the scalar columns count).
SHARD_SCHEMA = {
    "finish_reason": pl.String,
    "completion_tokens": pl.Int64,
    "turn_finish_reason": pl.List(pl.String),
    "turn_completion_tokens": pl.List(pl.Int64),
}
READ_ATTEMPTS = 3


class MonitorConfig(Params):
    """Parameters of monitor.ipynb."""

    parameters_cell = NotebookCell(("", "run_dir bins"))

    run_dir: ProjectPath = param(
        ...,
        "the generate run folder to watch (a relative path starts at the project root)",
        notebook="outputs/generate/interactive",
        min_length=1,
    )
    bins: int = param(120, "time bins of the throughput and acceptance plots", ge=10, le=2000)


# ----- status -------------------------------------------------------------------------------------------
def status(run_dir: str | Path) -> StatusTables:
    """``draftgen status``'s reading as formatted tables: the verdict, the run's figures, the servers, last events."""
    return StatusTables(status_report(_folder(run_dir)))


def _folder(run_dir: str | Path) -> Path:
    folder = Path(run_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no run folder at {folder} (run_dir){root_note(run_dir)}")
    return folder


# ----- reading ------------------------------------------------------------------------------------------
def shard_files(run_dir: str | Path) -> list[Path]:
    """Finished shards only: a shard being written has a temporary name (``.part-*.tmp``) until it is whole."""
    return shard_paths(run_dir)


def _scan(paths: list[Path]) -> pl.DataFrame:
    return pl.scan_parquet(
        paths, schema=SHARD_SCHEMA, missing_columns="insert", extra_columns="ignore"
    ).collect()


def read_shard_columns(run_dir: str | Path) -> pl.DataFrame:
    """One row per generated turn of every finished shard (a conversation's turns, or its one completion):
    ``finish_reason``, ``completion_tokens``. Only those columns are read, lazily. A shard that vanishes while
    being read (moved away) is left out: the listing is retried, then the files are read one by one."""
    folder = _folder(run_dir)
    error: Exception | None = None
    frame: pl.DataFrame | None = None
    for _ in range(READ_ATTEMPTS):
        paths = shard_files(folder)
        if not paths:
            frame = pl.DataFrame(schema=SHARD_SCHEMA)
            break
        try:
            frame = _scan(paths)
            break
        except (FileNotFoundError, pl.exceptions.ComputeError, OSError) as exc:
            error = exc
    if frame is None:
        frames = []
        for path in shard_files(folder):
            try:
                frames.append(_scan([path]))
            except FileNotFoundError:
                continue
            except (pl.exceptions.PolarsError, OSError) as exc:
                raise ValueError(
                    f"shard {path} is unreadable ({type(exc).__name__}: {exc}); first error: {error}"
                ) from exc
        frame = pl.concat(frames) if frames else pl.DataFrame(schema=SHARD_SCHEMA)
    single = pl.col("turn_finish_reason").is_null()
    return frame.select(
        pl.when(single)
        .then(pl.concat_list("finish_reason"))
        .otherwise("turn_finish_reason")
        .alias("finish_reason"),
        pl.when(single)
        .then(pl.concat_list("completion_tokens"))
        .otherwise("turn_completion_tokens")
        .alias("completion_tokens"),
    ).explode("finish_reason", "completion_tokens")


def history_frame(run_dir: str | Path) -> pl.DataFrame:
    """progress-history.jsonl as one row per (line, server) with the interval's deltas: seconds, completion
    tokens, acceptance-length sum and count, and the run-wide ``done`` count."""
    records = read_history(_folder(run_dir))
    t, session, done, server, completed, tokens, accept_sum, accept_n, in_flight, up = ([] for _ in range(10))
    for record in records:
        for url, values in (record.get("servers") or {}).items():
            if not isinstance(values, list) or len(values) < 6:
                continue
            t.append(float(record["t"]))
            session.append(float(record.get("session", 0.0)))
            done.append(int(record.get("done", 0)))
            server.append(url)
            completed.append(int(values[0]))
            tokens.append(int(values[1]))
            accept_sum.append(float(values[2]))
            accept_n.append(int(values[3]))
            in_flight.append(int(values[4]))
            up.append(bool(values[5]))
    frame = pl.DataFrame(
        {
            "t": t,
            "session": session,
            "done": done,
            "server": server,
            "completed": completed,
            "tokens": tokens,
            "accept_sum": accept_sum,
            "accept_n": accept_n,
            "in_flight": in_flight,
            "up": up,
        },
        schema={
            "t": pl.Float64,
            "session": pl.Float64,
            "done": pl.Int64,
            "server": pl.String,
            "completed": pl.Int64,
            "tokens": pl.Int64,
            "accept_sum": pl.Float64,
            "accept_n": pl.Int64,
            "in_flight": pl.Int64,
            "up": pl.Boolean,
        },
    )
    group = ["session", "server"]
    return frame.sort("t").with_columns(
        pl.col("t").diff().over(group).alias("dt"),
        pl.col("tokens").diff().over(group).alias("d_tokens"),
        pl.col("accept_sum").diff().over(group).alias("d_accept_sum"),
        pl.col("accept_n").diff().over(group).alias("d_accept_n"),
    )


def binned(history: pl.DataFrame, bins: int) -> pl.DataFrame:
    """Per server and time bin: completion tok/s and mean acceptance length (from the history's deltas)."""
    steps = history.drop_nulls("dt").filter(pl.col("dt") > 0)
    if steps.is_empty():
        return pl.DataFrame(
            schema={"server": pl.String, "t": pl.Float64, "tok_s": pl.Float64, "accept": pl.Float64}
        )
    t0, t1 = float(history["t"].min()), float(history["t"].max())
    width = max((t1 - t0) / bins, 1e-6)
    return (
        steps.with_columns(((pl.col("t") - t0) / width).floor().clip(0, bins - 1).alias("bin"))
        .group_by("server", "bin")
        .agg(
            pl.col("d_tokens").sum().alias("tokens"),
            pl.col("dt").sum().alias("seconds"),
            pl.col("d_accept_sum").sum().alias("accept_sum"),
            pl.col("d_accept_n").sum().alias("accept_n"),
        )
        .with_columns(
            (pl.col("bin") * width + width / 2).alias("t"),
            (pl.col("tokens") / pl.col("seconds")).alias("tok_s"),
            pl.when(pl.col("accept_n") > 0).then(pl.col("accept_sum") / pl.col("accept_n")).alias("accept"),
        )
        .select("server", "t", "tok_s", "accept")
        .sort("server", "t")
    )


# ----- plots --------------------------------------------------------------------------------------------
def _time_axis(span_s: float) -> tuple[float, str]:
    return (3600.0, "h") if span_s > 7200 else (60.0, "min") if span_s > 600 else (1.0, "s")


def plot_throughput_and_acceptance(run_dir: str | Path, bins: int = 120) -> Plot:
    """Completion tok/s and mean acceptance length per server over time (from progress-history.jsonl), acceptance
    against the run's mean so far and its 95% interval, on an axis from 1 (no draft token accepted)."""
    history = history_frame(run_dir)
    figure = Figure(figsize=(9, 6))
    top, bottom = figure.subplots(2, 1, sharex=True)
    frame = binned(history, bins)
    if frame.is_empty():
        message(figure, bottom, "")
        return message(
            figure, top, "no history yet: progress-history.jsonl gains a line every status_interval_s"
        )
    scale, unit = _time_axis(float(frame["t"].max()))
    for (server,), group in frame.group_by("server", maintain_order=True):
        x = group["t"].to_numpy() / scale
        top.plot(x, group["tok_s"].to_numpy(), label=short_label(str(server)), linewidth=1.2)
        bottom.plot(x, group["accept"].cast(pl.Float64).to_numpy(), linewidth=1.2)
    top.set_title("How fast is each server producing tokens, and how much of each draft does it accept?")
    top.set_ylabel("completion tok/s (wall clock)")
    top.set_ylim(bottom=0)
    top.legend(fontsize=7, ncols=2)
    accepted = history.drop_nulls("d_accept_n").filter(pl.col("d_accept_n") > 0)
    band = ratio_interval(accepted["d_accept_sum"].to_numpy(), accepted["d_accept_n"].to_numpy())
    values = frame["accept"].drop_nulls()
    ceiling = max(float(values.max()) if values.len() else 1.0, 1.5)
    # the run's mean so far and its interval: a wobble around it reads as one, not as a collapse
    if band is not None:
        ceiling = max(ceiling, mean_band(bottom, band, linewidth=1))
        bottom.legend(fontsize=7, loc="lower right")
    bottom.set_ylim(1.0, ceiling * 1.08)
    bottom.set_ylabel("mean acceptance length\n(tokens per verify; 1 = none accepted)")
    bottom.set_xlabel(f"time since the history began ({unit})")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
    return Plot(figure)


def plot_progress(run_dir: str | Path) -> Plot:
    """Conversations done over time, with the current rate projected to the end (the ETA)."""
    folder = _folder(run_dir)
    progress = read_progress(folder) or {}
    history = history_frame(folder)
    figure = Figure(figsize=(9, 3.6))
    axes = figure.subplots()
    if history.is_empty():
        return message(
            axes.figure, axes, "no history yet: progress-history.jsonl gains a line every status_interval_s"
        )
    done = history.group_by("t").agg(pl.col("done").first()).sort("t")
    t0 = float(done["t"][0])
    total = int(progress.get("conversations", {}).get("total", 0))
    verdict = judge(progress) if progress else None
    eta_at = progress.get("eta_at") if verdict is not None and verdict.code == RUNNING else None
    end = float(eta_at) if eta_at else float(done["t"][-1])
    scale, unit = _time_axis(end - t0)
    axes.plot((done["t"].to_numpy() - t0) / scale, done["done"].to_numpy(), color="#4c72b0", label="done")
    if total:
        axes.axhline(total, color="#999999", linestyle=":", linewidth=1, label=f"total {total:,}")
    title = "How far along is the run, and when will it end?"
    if eta_at:
        last_t, last_done = float(done["t"][-1]), int(done["done"][-1])
        axes.plot(
            [(last_t - t0) / scale, (end - t0) / scale],
            [last_done, total],
            color="#c44e52",
            linestyle="--",
            label=f"at the current rate: ends {time.strftime('%a %H:%M', time.localtime(end))}",
        )
    elif verdict is not None:
        title += f" ({verdict.word.lower()})"
    axes.set_title(title)
    axes.set_xlabel(f"time since the history began ({unit})")
    axes.set_ylabel("conversations done")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8, loc="lower right")
    axes.grid(alpha=0.3)
    return Plot(figure)


def plot_finish_reasons(rows: pl.DataFrame) -> Plot:
    figure = Figure(figsize=(6, 3.2))
    axes = figure.subplots()
    if rows.is_empty():
        return message(figure, axes, "no shard written yet")
    counts = rows.group_by("finish_reason").agg(pl.len().alias("rows")).sort("rows", descending=True)
    total = counts["rows"].sum()
    labels = [str(r) for r in counts["finish_reason"].to_list()]
    axes.bar(labels, counts["rows"].to_list(), color="#4c72b0")
    for index, value in enumerate(counts["rows"].to_list()):
        axes.annotate(f"{value / total:.1%}", (index, value), ha="center", va="bottom", fontsize=8)
    axes.set_title("How did the generated turns so far end (stop = finished, length = hit max_tokens)?")
    axes.set_xlabel("finish_reason, per generated turn")
    axes.set_ylabel("generated turns")
    return Plot(figure)


def plot_completion_lengths(rows: pl.DataFrame, max_tokens: int | None = None) -> Plot:
    figure = Figure(figsize=(7, 3.4))
    axes = figure.subplots()
    tokens = rows["completion_tokens"].drop_nulls().to_numpy() if not rows.is_empty() else np.array([])
    if tokens.size == 0:
        return message(figure, axes, "no completion lengths yet")
    completion_length_histogram(
        axes,
        tokens,
        max_tokens,
        title="How long are the answers so far? (per generated turn)",
        ylabel="generated turns",
    )
    return Plot(figure)


def max_tokens_of(run_dir: str | Path) -> int | None:
    """The run's max_tokens from manifest.json, if written."""
    import json

    try:
        manifest = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    value = manifest.get("parameters", {}).get("max_tokens")
    return int(value) if isinstance(value, int) else None


# ----- acceptance where it is low -----------------------------------------------------------------------
def acceptance_breakdowns(run_dir: str | Path) -> Breakdowns:
    """generate's report tables over the finished shards so far: acceptance length and tok/s per request by
    prompt category, output length, turn and sampling-plan arm (empty before the first shard)."""
    from draftgen.generate.report import request_table  # the one reader of per-turn figures

    folder = _folder(run_dir)
    return breakdowns(request_table(folder)) if shard_files(folder) else Breakdowns()


def plot_acceptance_by_category(run_dir: str | Path) -> Plot:
    """Acceptance length per prompt category over the finished shards so far (shown, never saved)."""
    table = acceptance_breakdowns(run_dir).get("category")
    if table is None:
        figure = Figure(figsize=(8, 2.5))
        return message(figure, figure.subplots(), "no finished shard with a prompt category yet")
    return Plot(acceptance_by_category(table, "generated turns so far"))


# ----- the headline -------------------------------------------------------------------------------------
HEADLINE_VERDICTS = {"RUNNING": "RUNNING", "FINISHED": "PASS"}  # any other word: the run stopped early


def headline(run_dir: str | Path) -> Headline:
    """How is the run doing, and when will it end? From progress.json (read-only)."""
    folder = _folder(run_dir)
    progress = read_progress(folder) or {}
    verdict = judge(progress) if progress else None
    conversations = progress.get("conversations") or {}
    done, total = int(conversations.get("done", 0)), int(conversations.get("total", 0))
    rate = progress.get("rate") or {}
    eta_at = progress.get("eta_at") if verdict is not None and verdict.code == RUNNING else None
    word = verdict.word if verdict is not None else ""
    stats = [
        Stat("conversations done", f"{done:,}", "", f"of {total:,}: {done / total:.1%}" if total else ""),
        Stat("failed", f"{int(conversations.get('failed', 0)):,}", ""),
        Stat(
            "completion tok/s", format_value(rate.get("tok_s"), "tok_s"), "tok/s", "recent window, wall clock"
        ),
        Stat(
            "ends",
            time.strftime("%a %H:%M", time.localtime(float(eta_at))) if eta_at else "–",
            "",
            f"in {format_value(progress.get('eta_s'), 'duration')}" if eta_at else "not running",
        ),
    ]
    return Headline(
        step="monitor",
        question="how is the running job doing, and when will it end?",
        answer=(verdict.sentence if verdict is not None else f"no progress.json in {folder} yet"),
        stats=stats,
        verdict=HEADLINE_VERDICTS.get(word, "STOPPED") if word else "",
        files=[("progress", folder / "progress.json")],
        home=None,
    )
