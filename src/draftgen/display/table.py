"""Tables a person reads: formatted numbers with units, readable labels, no dtype row, nothing wider than the page.

A report table is a polars frame plus column specs (``Column``). A column's spec says how its values are shown
(``kind``: integer, number, percent, seconds, tok/s, dollars, ...) and what its header says; a column without a
spec gets one from its name and type (``spec_for``), so a column another step adds later is still shown with
units and sensible precision. The same ``Table`` renders as HTML in a notebook (JupyterLab, and the saved
report.html) and as aligned text in a terminal.

A table wider than the page does not scroll: one row is turned on its side (a figure per line), several rows are
split into column groups that repeat the key columns. An empty table is replaced by the sentence saying why.

Why not Great Tables (what polars' ``DataFrame.style`` returns): it renders HTML only (the terminal and
``draftgen run`` need the same figures as text), it does not split or turn a wide table, and it adds a
dependency tree (Babel's locale data among it) for the few formats these reports use. docs/design.md.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

KINDS = ("text", "int", "number", "percent", "seconds", "duration", "tok_s", "usd", "ratio", "bool", "bytes")
MISSING = "–"
PAGE_CHARS = 150  # what fits beside the page's margins at 1,300 px (~7 px a character at 13 px, padding counted per cell)
WRAP_CHARS = 40  # a text column wider than this wraps inside its cell (max-width 22em)
ACRONYMS = {
    "ttft": "TTFT",
    "itl": "ITL",
    "tpot": "TPOT",
    "e2e": "E2E",
    "gpu": "GPU",
    "gpus": "GPUs",
    "id": "id",
    "ids": "ids",
    "mtp": "MTP",
    "url": "URL",
}
UNIT_WORDS = {"s": "s", "usd": "$", "ms": "ms", "pct": "%"}


@dataclass(frozen=True)
class Column:
    """How one column is shown. ``kind`` one of ``KINDS``; ``digits`` overrides the kind's precision."""

    name: str
    label: str | None = None
    kind: str | None = None
    digits: int | None = None
    unit: str | None = None  # in the header, e.g. "tok/s per GPU" (None: the kind's own, "": none)

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")


# ----- specs from names ------------------------------------------------------------------------------------
def _words(name: str) -> list[str]:
    return [w for w in name.replace("-", "_").split("_") if w]


def spec_for(name: str, dtype: pl.DataType | None = None) -> Column:
    """A column's spec read from its name and type: ``output_tok_s`` → tok/s, ``ttft_s_p50`` → seconds,
    ``truncated_rate`` → percent, ``cost_usd`` → dollars, integers with thousands separators."""
    words = _words(name)
    lowered = [w.lower() for w in words]
    kind: str
    if dtype is not None and dtype == pl.Boolean:
        kind = "bool"
    elif dtype is not None and (dtype == pl.String or dtype == pl.Categorical or isinstance(dtype, pl.List)):
        kind = "text"
    elif "tok" in lowered and "s" in lowered[lowered.index("tok") + 1 : lowered.index("tok") + 2]:
        kind = "tok_s"
    elif lowered and (lowered[-1] in ("rate", "share") or lowered[0] == "share"):
        kind = "percent"
    elif "usd" in lowered:
        kind = "usd"
    elif "bytes" in lowered:
        kind = "bytes"
    elif "s" in lowered:  # a unit word: ttft_s_p50, wall_s, span_s
        kind = "seconds"
    elif dtype is not None and dtype.is_integer():
        kind = "int"
    elif dtype is not None and dtype.is_numeric():
        kind = "number"
    else:
        kind = "text"
    return Column(name=name, label=label_for(name), kind=kind)


def label_for(name: str) -> str:
    """``ttft_s_p50`` → "TTFT p50 (s)", ``output_tok_s`` → "output tok/s", ``cost_usd`` → "cost ($)"."""
    words = _words(name)
    lowered = [w.lower() for w in words]
    if "tok" in lowered:
        at = lowered.index("tok")
        if lowered[at + 1 : at + 2] == ["s"]:
            words = [*words[:at], "tok/s", *words[at + 2 :]]
            lowered = [w.lower() for w in words]
    unit = next((UNIT_WORDS[w] for w in lowered if w in UNIT_WORDS), None)
    shown = [
        ACRONYMS.get(w.lower(), w) for w, low in zip(words, lowered, strict=True) if low not in UNIT_WORDS
    ]
    text = " ".join(shown) or name
    return f"{text} ({unit})" if unit else text


# ----- values ----------------------------------------------------------------------------------------------
def _auto_digits(value: float) -> int:
    size = abs(value)
    if size >= 100 or size == 0:
        return 0 if size >= 1000 or size == 0 or float(value).is_integer() else 1
    if size >= 10:
        return 1
    if size >= 1:
        return 2
    return 3


def format_value(value: Any, kind: str = "number", digits: int | None = None) -> str:
    """One cell as a person reads it: ``1,234``, ``250 tok/s`` → ``250``, ``0.0412`` as percent → ``4.1%``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if kind == "text":
        if isinstance(value, (list, tuple)):
            return ", ".join(format_value(v, "text") for v in value) or MISSING
        if isinstance(value, float):
            return format_value(value, "number", digits)
        return str(value)
    if kind == "bool" or isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if kind == "int":
        return f"{round(value):,}"
    if kind == "percent":
        return f"{100 * value:.{1 if digits is None else digits}f}%"
    if kind == "usd":
        return f"${value:,.{(0 if abs(value) >= 100 else 2) if digits is None else digits}f}"
    if kind == "duration":
        from draftgen.display.humanize import duration

        return duration(float(value), digits=1 if digits is None else digits)
    if kind == "bytes":
        from draftgen.display.humanize import human_bytes

        return human_bytes(float(value))
    if kind == "ratio":
        return f"{value:,.{2 if digits is None else digits}f}×"
    if kind == "tok_s":
        return f"{value:,.{(0 if abs(value) >= 100 else 1) if digits is None else digits}f}"
    if isinstance(value, int) and digits is None:
        return f"{value:,}"
    return f"{value:,.{_auto_digits(float(value)) if digits is None else digits}f}"


KIND_UNITS = {"seconds": "s", "tok_s": "tok/s", "usd": "$", "percent": "%"}


def _header(column: Column) -> str:
    label = column.label if column.label is not None else label_for(column.name)
    if column.unit:
        return f"{label} ({column.unit})"
    return label


# ----- the table -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """A frame as a person reads it. ``columns``: the columns to show, in order, each a name (spec from the
    name) or a ``Column``; None: every column. ``keys``: the columns repeated in each part of a split table
    (default: the first). ``empty``: the sentence shown instead of an empty table."""

    frame: pl.DataFrame
    columns: Sequence[str | Column] | None = None
    title: str = ""
    note: str = ""
    empty: str = "nothing to show"
    keys: Sequence[str] | None = None
    max_chars: int = PAGE_CHARS

    # -- the shown cells
    def specs(self) -> list[Column]:
        chosen = self.columns if self.columns is not None else self.frame.columns
        specs = []
        for item in chosen:
            name = item if isinstance(item, str) else item.name
            if name not in self.frame.columns:
                raise KeyError(
                    f"table {self.title or ''!r}: no column {name!r} (columns: {self.frame.columns})"
                )
            inferred = spec_for(name, self.frame.schema[name])
            if isinstance(item, Column):
                inferred = replace(
                    inferred,
                    label=item.label if item.label is not None else inferred.label,
                    kind=item.kind or inferred.kind,
                    digits=item.digits,
                    unit=item.unit,
                )
            specs.append(inferred)
        return specs

    def cells(self) -> tuple[list[str], list[list[str]], list[str]]:
        """(headers, rows of formatted cells, each column's kind)."""
        specs = self.specs()
        headers = [_header(s) for s in specs]
        rows = [
            [format_value(row[s.name], s.kind or "text", s.digits) for s in specs]
            for row in self.frame.iter_rows(named=True)
        ]
        return headers, rows, [s.kind or "text" for s in specs]

    def parts(self) -> list[tuple[list[str], list[list[str]], list[str]]]:
        """The table as shown: whole, turned on its side (one row), or split into column groups (several)."""
        headers, rows, kinds = self.cells()
        if _width(headers, rows) <= self.max_chars or len(headers) <= 2:
            return [(headers, rows, kinds)]
        if len(rows) == 1:
            return [
                (
                    ["figure", "value"],
                    [[h, v] for h, v in zip(headers, rows[0], strict=True)],
                    ["text", "text"],
                )
            ]
        names = [s.name for s in self.specs()]
        keys = [names.index(k) for k in (self.keys if self.keys is not None else names[:1]) if k in names]
        rest = [i for i in range(len(headers)) if i not in keys]
        parts, group = [], list(keys)
        for index in rest:
            trial = [*group, index]
            if (
                len(group) > len(keys)
                and _width([headers[i] for i in trial], [[r[i] for i in trial] for r in rows])
                > self.max_chars
            ):
                parts.append(group)
                group = [*keys, index]
            else:
                group = trial
        parts.append(group)
        return [
            ([headers[i] for i in g], [[r[i] for i in g] for r in rows], [kinds[i] for i in g]) for g in parts
        ]

    # -- rendering
    def _repr_html_(self) -> str:
        head = f"<p class='dg-caption'><b>{html.escape(self.title)}</b></p>" if self.title else ""
        if self.frame.is_empty():
            return f"<div class='dg-table'>{head}<p class='dg-empty'>{html.escape(self.empty)}</p></div>"
        body = "".join(_html_table(*part) for part in self.parts())
        note = f"<p class='dg-note'>{html.escape(self.note)}</p>" if self.note else ""
        return f"<div class='dg-table'>{STYLE}{head}{body}{note}</div>"

    def __str__(self) -> str:
        lines = [self.title] if self.title else []
        if self.frame.is_empty():
            return "\n".join([*lines, self.empty])
        for index, (headers, rows, kinds) in enumerate(self.parts()):
            if index:
                lines.append("")
            lines += _text_table(headers, rows, kinds)
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def _width(headers: list[str], rows: list[list[str]]) -> int:
    """Characters the table needs: each column's widest cell (a header wraps at spaces, long text at WRAP_CHARS)."""
    total = 0
    for index, header in enumerate(headers):
        longest_word = max((len(w) for w in header.split()), default=0)
        cells = max((len(r[index]) for r in rows), default=0)
        total += max(longest_word, min(cells, WRAP_CHARS)) + 3
    return total


STYLE = (
    "<style>"
    ".dg-table table{border-collapse:collapse;margin:0.3em 0 0.8em 0;table-layout:auto;max-width:100%}"
    ".dg-table th{text-align:right;vertical-align:bottom;font-weight:600;white-space:normal;"
    "border-bottom:1px solid #999;padding:0.25em 0.6em}"
    ".dg-table td{text-align:right;padding:0.2em 0.6em;white-space:nowrap;font-variant-numeric:tabular-nums}"
    ".dg-table th.dg-text,.dg-table td.dg-text{text-align:left}"
    ".dg-table td.dg-text{white-space:normal;overflow-wrap:anywhere;max-width:22em}"
    ".dg-table tbody tr:nth-child(odd){background:rgba(0,0,0,0.03)}"
    ".dg-table .dg-note,.dg-table .dg-empty{color:#555;font-style:italic;margin:0.2em 0 0.8em 0}"
    ".dg-table .dg-caption{margin:0.6em 0 0.2em 0}"
    "</style>"
)


def _html_table(headers: list[str], rows: list[list[str]], kinds: list[str]) -> str:
    classes = [" class='dg-text'" if k == "text" else "" for k in kinds]
    head = "".join(f"<th{c}>{html.escape(h)}</th>" for h, c in zip(headers, classes, strict=True))
    body = "".join(
        "<tr>" + "".join(f"<td{c}>{html.escape(v)}</td>" for v, c in zip(row, classes, strict=True)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text_table(headers: list[str], rows: list[list[str]], kinds: list[str]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Iterable[str]) -> str:
        return "  ".join(
            c.ljust(w) if k == "text" else c.rjust(w) for c, w, k in zip(cells, widths, kinds, strict=True)
        ).rstrip()

    return [line(headers), line("-" * w for w in widths), *(line(r) for r in rows)]


def figures_table(
    pairs: Iterable[tuple[str, Any] | tuple[str, Any, str]], *, title: str = "", note: str = ""
) -> Table:
    """A "figure | value" table from (label, value[, kind]) pairs: run-level figures, one per line."""
    labels, values = [], []
    for label, value, *rest in pairs:
        kind = rest[0] if rest else None
        labels.append(label)
        values.append(value if isinstance(value, str) else format_value(value, kind or _kind_of(value)))
    frame = pl.DataFrame(
        {"figure": labels, "value": values}, schema={"figure": pl.String, "value": pl.String}
    )
    return Table(
        frame, [Column("figure", label="figure"), Column("value", label="value")], title=title, note=note
    )


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    return "text"


def with_specs(frame: pl.DataFrame, specs: Iterable[Column], drop: Iterable[str] = ()) -> list[str | Column]:
    """Every column of ``frame`` (but ``drop``), in the frame's order, each with its spec from ``specs`` when one is
    given and from its name otherwise: a column added to the frame later is shown too, with inferred units."""
    known = {spec.name: spec for spec in specs}
    dropped = set(drop)
    return [known.get(name, name) for name in frame.columns if name not in dropped]
