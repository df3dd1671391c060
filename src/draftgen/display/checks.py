"""Checks grouped for a reader: one row per check with the count of servers that passed, plus a row per server
that did not.

Preflight checks every server the same way (healthy, model, engine, batch cap, canary); seven servers all "ok"
are one row ("healthy: 7/7 servers"), not seven. A server whose check failed, warned or said something the others
did not keeps its own row, named. Anything with ``check``, ``target``, ``status`` and ``detail`` attributes
groups (generate's ``Check``; serve's start-up and tune's candidates as ``CheckRow``). A group is counted in
``noun`` ("7/7 servers", "12/13 candidates"); without one, URLs are servers and anything else targets.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

from draftgen.display.humanize import short_label

ORDER = {"fail": 0, "warn": 1, "info": 2, "ok": 3}
FEW_DETAILS = 3  # passed servers that said at most this many different things get a row per thing said
COLOURS = {"ok": "#2e7d32", "info": "#1565c0", "warn": "#ef6c00", "fail": "#c62828"}


class CheckLike(Protocol):
    check: str
    target: str
    status: str
    detail: str


@dataclass(frozen=True)
class CheckRow:
    """One check made on one target (a server, a candidate): its status ("ok", "info", "warn", "fail") and why."""

    check: str
    target: str
    status: str
    detail: str


@dataclass(frozen=True)
class GroupedCheck:
    """One shown row: a check, its status, which targets it covers (``targets`` of ``of``), and the detail."""

    check: str
    status: str
    targets: tuple[str, ...]
    of: int  # how many targets the check was made on
    detail: str
    _: KW_ONLY
    split: bool = False  # one of several rows of targets that passed, each saying something else: named
    noun: str = ""  # what the targets are ("candidates"); "": servers for URLs, else targets

    @property
    def where(self) -> str:
        """``7/7 servers`` for a group, the target's short name for one of several, the target for a single."""
        if len(self.targets) > 1 or (self.of > 1 and len(self.targets) == self.of):
            noun = self.noun or ("servers" if all("://" in t for t in self.targets) else "targets")
            return f"{len(self.targets)}/{self.of} {noun}"
        target = self.targets[0] if self.targets else ""
        return short_label(target) if self.of > 1 and "://" in target else target


def group_checks(checks: Iterable[CheckLike], noun: str = "") -> list[GroupedCheck]:
    """Rows in first-seen check order: per check, the targets that passed as one row per thing they said (as one
    row with the first one's detail and "e.g." when they said more than ``FEW_DETAILS`` different things), then
    each other (status, detail) as one row naming its targets. A check made on one target stays one row. ``noun``
    names the targets in a count."""
    by_check: dict[str, list[CheckLike]] = {}
    for check in checks:
        by_check.setdefault(check.check, []).append(check)
    rows: list[GroupedCheck] = []
    for name, items in by_check.items():
        targets = list(dict.fromkeys(c.target for c in items))
        if len(targets) <= 1:
            rows += [GroupedCheck(name, c.status, (c.target,), 1, c.detail, noun=noun) for c in items]
            continue
        passed = [c for c in items if c.status == "ok"]
        by_detail: dict[str, list[str]] = {}
        for c in passed:
            by_detail.setdefault(c.detail, []).append(c.target)
        if len(by_detail) <= FEW_DETAILS:  # e.g. two engines in one fleet: each named, none hidden
            split = len(by_detail) > 1
            rows += [
                GroupedCheck(name, "ok", tuple(where), len(targets), d, split=split, noun=noun)
                for d, where in by_detail.items()
            ]
        else:  # a measurement that differs on every server (a canary's latency): the first stands for them
            detail = f"e.g. {short_label(passed[0].target)}: {passed[0].detail}"
            rows.append(
                GroupedCheck(name, "ok", tuple(c.target for c in passed), len(targets), detail, noun=noun)
            )
        others: dict[tuple[str, str], list[str]] = {}
        for c in items:
            if c.status != "ok":
                others.setdefault((c.status, c.detail), []).append(c.target)
        for (status, detail), where in sorted(others.items(), key=lambda kv: ORDER.get(kv[0][0], 9)):
            rows.append(GroupedCheck(name, status, tuple(where), len(targets), detail, noun=noun))
    return rows


def _named(row: GroupedCheck) -> list[str]:
    """The targets a row names beside its count: those of a group that did not pass, or of one of several passing
    groups that said different things (a single passing group is counted)."""
    if 1 < len(row.targets) < row.of and (row.status != "ok" or row.split):
        return [short_label(t) for t in row.targets]
    return []


def _targets_text(row: GroupedCheck) -> str:
    named = _named(row)
    return f"{row.where}: " + ", ".join(named) if named else row.where


def _targets_html(row: GroupedCheck) -> str:
    """The count and each name kept whole, the line free to break between names (candidates' names are long)."""
    cells = [
        f"<span style='white-space:nowrap'>{html.escape(part)}</span>" for part in (row.where, *_named(row))
    ]
    return cells[0] + (": " + ", ".join(cells[1:]) if len(cells) > 1 else "")


def checks_text(checks: Sequence[CheckLike], noun: str = "") -> str:
    rows = group_checks(checks, noun)
    if not rows:
        return "  (no checks)"
    widths = [max(len(r.check) for r in rows), max(len(_targets_text(r)) for r in rows)]
    lines = []
    for r in rows:
        mark = r.status.upper() if r.status != "ok" else "ok"
        lines.append(
            f"  {mark:<4}  {r.check:<{widths[0]}}  {_targets_text(r):<{widths[1]}}  {r.detail}".rstrip()
        )
    return "\n".join(lines)


def checks_html(checks: Sequence[CheckLike], noun: str = "") -> str:
    esc = html.escape
    body = "".join(
        f"<tr><td style='color:{COLOURS.get(r.status, '')};font-weight:bold;text-align:left'>{esc(r.status)}</td>"
        f"<td style='text-align:left'>{esc(r.check)}</td>"
        f"<td style='text-align:left'>{_targets_html(r)}</td>"
        f"<td style='text-align:left;white-space:normal;overflow-wrap:anywhere'>{esc(r.detail)}</td></tr>"
        for r in group_checks(checks, noun)
    )
    head = "".join(f"<th style='text-align:left'>{h}</th>" for h in ("status", "check", "where", "detail"))
    return f"<table class='dg-checks'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass(frozen=True)
class Checks:
    """Grouped checks as a notebook cell shows them (HTML) and a terminal prints them (text), under a title;
    ``empty`` is the sentence shown when no check was made."""

    checks: Sequence[CheckLike]
    title: str = ""
    noun: str = ""
    empty: str = "no checks were made"

    def text(self) -> str:
        body = checks_text(self.checks, self.noun) if self.checks else f"  {self.empty}"
        return f"{self.title}\n{body}" if self.title else body

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        head = f"<p style='margin:0.4em 0 0.1em 0'><b>{html.escape(self.title)}</b></p>" if self.title else ""
        if not self.checks:
            return f"{head}<p style='color:#555;font-style:italic'>{html.escape(self.empty)}</p>"
        return head + checks_html(self.checks, self.noun)
