"""``draftgen status``'s reading as monitor.ipynb shows it: the verdict as a line, the run's figures and the
servers as formatted tables (units in the headers, thousands separators, no dtype row), the last events folded.

The figures are ``watch.status``'s own reading, so the notebook and the command never disagree; only the layout
differs (the command prints aligned text a terminal can hold).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

import polars as pl

from draftgen.display.headline import VERDICTS
from draftgen.display.notes import Log
from draftgen.display.table import Column, Table, figures_table, format_value
from draftgen.watch.status import (
    MANIFEST_NOTE,
    ManifestFigures,
    RunFigures,
    StatusReport,
    cache_text,
    event_stamp,
)

SERVER_COLUMNS = (
    Column("server", kind="text"),
    Column("state", kind="text"),
    Column("in_flight", "in flight", "int"),
    Column("answered", "requests answered", "int"),
    Column("tok_s", "completion tok/s", "tok_s"),
    Column("accept_window", "acceptance (rate window)", "number", digits=2),
    Column("accept_session", "acceptance (session)", "number", digits=2),
    Column("errors", kind="int"),
    Column("cached_share", "prompt tokens from its prefix cache", "percent"),
)
VERDICT_COLOURS = {"RUNNING": VERDICTS["RUNNING"], "FINISHED": VERDICTS["PASS"]}  # any other: stopped (red)


def _of(done: int, total: int | None) -> str:
    if not total:
        return format_value(done, "int")
    return f"{format_value(done, 'int')} of {format_value(total, 'int')} ({done / total:.1%})"


def figures_view(f: RunFigures) -> Table:
    """The run's figures, one per line, each with its unit."""
    clock = f" ({f.clock})" if f.clock else ""
    pairs: list[tuple[str, Any] | tuple[str, Any, str]] = [
        ("conversations done", _of(f.done, f.total)),
        ("done this session", f.session_done, "int"),
        ("failed", f.failed, "int"),
    ]
    if f.turns_session is not None:
        if f.turns_done is not None and f.turns_total:
            pairs.append(("assistant turns done", _of(f.turns_done, f.turns_total)))
        pairs.append(("assistant turns answered this session", f.turns_session, "int"))
    pairs += [
        ("rate (conversations/s)", format_value(f.conversations_per_s, "number", 2)),
        ("completion tok/s", f.tok_s, "tok_s"),
        ("rate window", f.window_s, "duration"),
    ]
    if f.trained_tokens is not None:
        pairs += [
            ("trained tokens this session", f.trained_tokens, "int"),
            ("GPU-seconds per million trained tokens", format_value(f.gpu_s_per_million, "number", 0)),
        ]
    if f.running:
        ends = (
            f"in {format_value(f.eta_s, 'duration')}, at {time.strftime('%a %H:%M %Z', time.localtime(f.eta_at))} "
            "(wall clock, at the current rate)"
            if f.eta_s is not None and f.eta_at is not None
            else "unknown: no completions in the rate window yet"
        )
        pairs.append(("ends", ends))
    for guard in f.guard:
        halts = f" (halts above {guard.limit:.0%})" if guard.limit is not None else ""
        pairs.append((f"guard: {guard.name.replace('_', ' ')}", f"{guard.rate:.1%}{halts}"))
    if f.guard:
        pairs.append(("results the guard has seen", f.guard_seen, "int"))
    if f.cut_at_max_length:
        pairs.append(
            ("turns cut at the trainer's max_length (expected, not guarded)", f.cut_at_max_length, "int")
        )
    if f.retrying:
        pairs.append(("requests waiting out a backoff", f.retrying, "int"))
    if (cache := cache_text(f)) is not None:
        pairs.append(("prefix cache", cache))
    note = f"tok/s, seconds and GPU-seconds on the servers' clock{clock}" if f.clock else ""
    return figures_table(pairs, title="The run", note=note)


def servers_view(f: RunFigures) -> Table:
    """One row per server: up or down, in flight, answered, tok/s, acceptance over the window and the session."""
    frame = pl.DataFrame(
        {
            "server": [s.label for s in f.servers],
            "state": ["up" if s.up else "DOWN" for s in f.servers],
            "in_flight": [s.in_flight for s in f.servers],
            "answered": [s.answered for s in f.servers],
            "tok_s": [s.tok_s for s in f.servers],
            "accept_window": [s.accept_window for s in f.servers],
            "accept_session": [s.accept_session for s in f.servers],
            "errors": [s.errors for s in f.servers],
            "cached_share": [s.cached_share for s in f.servers],
        },
        schema={
            "server": pl.String,
            "state": pl.String,
            "in_flight": pl.Int64,
            "answered": pl.Int64,
            "tok_s": pl.Float64,
            "accept_window": pl.Float64,
            "accept_session": pl.Float64,
            "errors": pl.Int64,
            "cached_share": pl.Float64,
        },
    )
    return Table(
        frame,
        SERVER_COLUMNS,
        title="Servers",
        note=(
            f"acceptance: mean acceptance length, tokens per verify step (1 = no draft accepted); the rate window "
            f"is the last "
            f"{format_value(f.window_s, 'duration')}" + (f"; tok/s on the {f.clock}" if f.clock else "")
        ),
        empty="no server has reported yet",
    )


def manifest_view(m: ManifestFigures) -> Table:
    return figures_table(
        [
            ("prompts done", _of(m.done, m.valid)),
            ("failed", m.failed, "int"),
            ("rejected", m.rejected, "int"),
            ("shards", m.shards, "int"),
        ],
        title="The run",
        note=MANIFEST_NOTE,
    )


@dataclass(frozen=True)
class StatusTables:
    """monitor.ipynb's status section: the verdict line, then tables; the same as text for a terminal."""

    report: StatusReport

    def blocks(self) -> list[Table | Log]:
        f = self.report.figures
        if isinstance(f, ManifestFigures):
            return [manifest_view(f)]
        blocks: list[Table | Log] = [figures_view(f), servers_view(f)]
        if f.events:
            lines = [f"{event_stamp(e.at)}  {e.server}: {e.what}" for e in f.events]
            blocks.append(Log(lines, title="last events", keep=len(lines)))
        return blocks

    def verdict_line(self) -> str:
        verdict = self.report.verdict
        return f"{verdict.word} — {verdict.sentence}"

    def text(self) -> str:
        head = [f"run: {self.report.run_dir}", self.verdict_line()]
        return "\n\n".join(["\n".join(head), *(str(b) for b in self.blocks())])

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        verdict = self.report.verdict
        colour = VERDICT_COLOURS.get(verdict.word, VERDICTS["STOPPED"])
        head = (
            f"<p style='margin:0.3em 0'><b style='color:{colour}'>{html.escape(verdict.word)}</b> — "
            f"{html.escape(verdict.sentence)}<br><span style='color:#555'>run folder "
            f"<code>{html.escape(str(self.report.run_dir))}</code></span></p>"
        )
        return head + "".join(
            (
                f"<p class='dg-caption'><b>{html.escape(block.title.capitalize())}</b></p>"
                if isinstance(block, Log)
                else ""
            )
            + block._repr_html_()
            for block in self.blocks()
        )
