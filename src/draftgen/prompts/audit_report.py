"""A prompt audit as a person reads it: the findings (what to fix before spending), a one-paragraph headline and
tables (``display.table``), in a terminal and in a notebook alike.

The findings are the one wording of each result: ``draftgen prompts audit`` prints them in its headline, generate's
preflight shows them as its audit rows (info, or warn above the shares below; the audit never fails a run: what
fails is the malformed-row check, as before), and the estimate's report lists them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import polars as pl

from draftgen.display.table import Column, Table, figures_table
from draftgen.prompts.audit import EXAMPLES, OPENER_MAX_CHARS, PromptAudit
from draftgen.prompts.near_duplicates import SIMILARITY

# Shares of the valid conversations above which a finding is a warning (below: information); kept duplicates
# always warn (each is paid for again), malformed rows above max_rejected_rate too (generate refuses the file).
WARN_SHARED = 0.05
WARN_OPENERS = 0.01
WARN_NEAR = 0.01
WARN_SET_ASIDE = 0.10  # of the answer points counted
CATEGORY_ROWS = 15


@dataclass(frozen=True)
class Finding:
    """One result in words: ``status`` info or warn, ``check`` its name, ``detail`` the sentence."""

    check: str
    status: str
    detail: str


def _pct(count: int, whole: int) -> str:
    return f"{count / whole:.1%}" if whole else "–"


def findings(audit: PromptAudit, max_rejected_rate: float | None = None) -> list[Finding]:
    """What the audit found that bears on the run, in the order a person should act on it."""
    valid = audit.conversations + audit.duplicates
    out = []
    if audit.rejected_rows:
        refused = max_rejected_rate is not None and audit.rejected_rate > max_rejected_rate
        kinds = ", ".join(f"{kind} ×{count:,}" for kind, count in list(audit.rejected.items())[:4])
        detail = (
            f"{audit.rejected_rows:,} malformed rows ({audit.rejected_rate:.1%} of {audit.rows:,}) — {kinds}"
        )
        if refused:
            detail += (
                f": above max_rejected_rate {max_rejected_rate:g}, generate refuses the file; fix the rows"
            )
        else:
            detail += ": set aside in rejected.parquet with their reasons"
        out.append(Finding("malformed rows", "warn" if refused else "info", detail))
    if audit.duplicates:
        share = _pct(audit.duplicates, valid)
        if audit.keep_duplicates:
            detail = (
                f"{audit.duplicates:,} exact duplicate conversations ({share}) are sent again (keep_duplicates: "
                "true): each is a prompt paid for twice"
            )
        else:
            detail = (
                f"{audit.duplicates:,} exact duplicate conversations ({share}) skipped: each is in rejected.parquet "
                "as 'duplicate of ID', the first kept (keep_duplicates: true sends them)"
            )
        out.append(Finding("duplicates", "warn" if audit.keep_duplicates else "info", detail))
    if audit.shared_first_turns:
        out.append(
            Finding(
                "shared first turns",
                "warn" if audit.share(audit.shared_first_turns) > WARN_SHARED else "info",
                f"{audit.shared_first_turns:,} conversations ({_pct(audit.shared_first_turns, valid)}) share their "
                f"first user turn with another (case and spacing aside; {audit.shared_groups:,} distinct turns): "
                "the same question answered again; check whether the set over-samples it",
            )
        )
    if audit.openers:
        out.append(
            Finding(
                "openers",
                "warn" if audit.share(audit.openers) > WARN_OPENERS else "info",
                f"{audit.openers:,} conversations ({_pct(audit.openers, valid)}) open with a context-free "
                f"'continue' (≤ {OPENER_MAX_CHARS} characters): parts of longer conversations, whose first answer "
                "has nothing to continue",
            )
        )
    if audit.near_duplicates:
        seen = "" if audit.near_indexed == audit.conversations else f" of the first {audit.near_indexed:,}"
        out.append(
            Finding(
                "near-duplicates",
                "warn" if audit.near_duplicates / max(1, audit.near_indexed) > WARN_NEAR else "info",
                f"{audit.near_duplicates:,} conversations{seen} nearly duplicate an earlier one (MinHash LSH, "
                f"estimated similarity ≥ {SIMILARITY:g}): paid for again with a small change",
            )
        )
    budgets = audit.budgets
    if budgets is not None and budgets.turns:
        sample = (
            ""
            if budgets.conversations == budgets.of_conversations
            else f" (the {budgets.conversations:,} conversations counted of {budgets.of_conversations:,})"
        )
        set_aside = budgets.set_aside / budgets.turns
        sent = [
            f"{budgets.share(name):.1%} {words}"
            for name, words in (
                ("capped", f"capped at max_length {budgets.max_length:,} − the prompt"),
                ("full", f"with the full max_tokens {budgets.max_tokens:,}"),
                ("uncounted", "not counted (the template failed: sent uncapped)"),
                ("ended", "not sent (an earlier answer cut before its tool calls)"),
                ("diverged", "not sent (an earlier answer's calls were not the source's)"),
            )
            if budgets.by_class.get(name)
        ]
        out.append(
            Finding(
                "turn budgets",
                "warn" if set_aside > WARN_SET_ASIDE else "info",
                f"of {budgets.turns / budgets.draws:,.0f} answer points{sample}: {set_aside:.1%} set aside "
                f"({budgets.share('max_length'):.1%} no room, {budgets.share('min_turn_budget'):.1%} below "
                f"min_turn_budget {budgets.min_turn_budget:,}), {', '.join(sent) or 'none sent'}; median prompt "
                f"{budgets.prompt_tokens.get('p50', 0):,.0f} tokens ({budgets.tokenizer}; {budgets.short_note})",
            )
        )
    return out


def headline(audit: PromptAudit, max_rejected_rate: float | None = None) -> str:
    """One paragraph: what will be sent, and what to fix before spending."""
    sent = f"{audit.sent:,} conversations will be sent"
    points = audit.answer_points
    if audit.turns_mode == "all" and points != audit.conversations:
        sent += f" ({points:,} answer points, turns: all"
        if audit.budgets is not None and audit.budgets.conversations:
            sent += (
                f"; about {audit.budgets.sent_per_conversation * audit.conversations:,.0f} after the turns set "
                "aside or after a conversation ended"
            )
        sent += ")"
    text = f"{audit.path}: {audit.rows:,} rows read; {sent}."
    warnings = [f.detail for f in findings(audit, max_rejected_rate) if f.status == "warn"]
    if warnings:
        return text + " Before spending: " + "; ".join(w[0].lower() + w[1:] for w in warnings) + "."
    notes = [f.check for f in findings(audit, max_rejected_rate)]
    if notes:
        return text + f" Nothing to fix before spending ({', '.join(notes)}: below)."
    return (
        text
        + " Nothing to fix before spending: no malformed rows, duplicates, shared first turns or openers."
    )


def tables(audit: PromptAudit) -> list[Table]:
    """The audit's tables: figures, rejections, answer points, categories, turn budgets, examples."""
    valid = audit.conversations + audit.duplicates
    figures = [
        ("rows read", audit.rows),
        ("malformed rows", f"{audit.rejected_rows:,} ({_pct(audit.rejected_rows, audit.rows)})"),
        (
            "exact duplicates",
            f"{audit.duplicates:,} ({_pct(audit.duplicates, valid)}), "
            + ("sent (keep_duplicates)" if audit.keep_duplicates else "skipped"),
        ),
        ("conversations sent", audit.sent),
        (f"answer points (turns: {audit.turns_mode})", audit.answer_points),
        (
            "shared first turns",
            f"{audit.shared_first_turns:,} ({_pct(audit.shared_first_turns, valid)}), "
            f"{audit.shared_groups:,} distinct",
        ),
        ("context-free openers", f"{audit.openers:,} ({_pct(audit.openers, valid)})"),
        ("near-duplicates", f"{audit.near_duplicates:,} of {audit.near_indexed:,} indexed"),
        ("read in", f"{audit.seconds:.1f} s"),
    ]
    out = [figures_table(figures, title="The prompt file")]
    if audit.rejected:
        frame = pl.DataFrame(
            {"reason": list(audit.rejected), "rows": list(audit.rejected.values())},
            schema={"reason": pl.String, "rows": pl.Int64},
        ).with_columns(share=pl.col("rows") / audit.rows)
        out.append(
            Table(
                frame,
                [Column("reason"), Column("rows"), Column("share", kind="percent")],
                title="Malformed rows",
            )
        )
    turns = pl.DataFrame(
        {"answer_points": list(audit.turns), "conversations": list(audit.turns.values())},
        schema={"answer_points": pl.Int64, "conversations": pl.Int64},
    ).with_columns(share=pl.col("conversations") / max(1, audit.conversations))
    out.append(
        Table(
            turns,
            [
                Column("answer_points", label="answer points"),
                Column("conversations"),
                Column("share", kind="percent"),
            ],
            title=f"Answer points per conversation (turns: {audit.turns_mode})",
            empty="no valid conversation",
        )
    )
    names = list(audit.categories)
    shown, rest = names[:CATEGORY_ROWS], names[CATEGORY_ROWS:]
    counts = [audit.categories[n] for n in shown]
    if rest:
        shown.append(f"({len(rest)} more)")
        counts.append(sum(audit.categories[n] for n in rest))
    categories = pl.DataFrame(
        {"category": shown, "conversations": counts},
        schema={"category": pl.String, "conversations": pl.Int64},
    ).with_columns(share=pl.col("conversations") / max(1, audit.conversations))
    out.append(
        Table(
            categories,
            [
                Column("category", label="category or source"),
                Column("conversations"),
                Column("share", kind="percent"),
            ],
            title="Category or source mix",
            empty="no valid conversation",
        )
    )
    if audit.budgets is not None:
        out.append(_budgets_table(audit))
    examples = [
        (finding.replace("_", " "), text) for finding, texts in audit.examples.items() for text in texts
    ]
    if examples:
        frame = pl.DataFrame(examples, schema={"finding": pl.String, "example": pl.String}, orient="row")
        out.append(Table(frame, title=f"Examples (the first {EXAMPLES} of each)"))
    return out


def _budgets_table(audit: PromptAudit) -> Table:
    from draftgen.prompts.turn_budgets import CLASS_LABELS, CLASSES

    budgets = audit.budgets
    assert budgets is not None
    rows = [(CLASS_LABELS[name], budgets.points(name)) for name in CLASSES if name in budgets.by_class]
    frame = pl.DataFrame(
        rows, schema={"turn": pl.String, "answer_points": pl.Float64}, orient="row"
    ).with_columns(share=pl.col("answer_points") / max(1.0, budgets.turns / budgets.draws))
    quantiles = ", ".join(f"{k} {v:,.0f}" for k, v in budgets.prompt_tokens.items())
    counted = (
        f"all {budgets.conversations:,} conversations"
        if budgets.conversations == budgets.of_conversations
        else f"a uniform sample of {budgets.conversations:,} of {budgets.of_conversations:,} conversations"
    )
    return Table(
        frame,
        [
            Column("turn", label="how the turn is sent"),
            # a mean over the versions drawn: whole with the source's answers (one version)
            Column(
                "answer_points", label="answer points", kind="number", digits=0 if budgets.draws == 1 else 1
            ),
            Column("share", kind="percent"),
        ],
        title=(
            f"Turn budgets: prompt tokens against max_length {budgets.max_length:,} (max_tokens {budgets.max_tokens:,}, "
            f"min_turn_budget {budgets.min_turn_budget:,})"
        ),
        note=f"{counted}, counted with {budgets.tokenizer}; prompt tokens per counted turn: {quantiles}; "
        f"{budgets.note}",
        empty="no answer point counted",
    )


@dataclass(frozen=True)
class AuditReport:
    """The audit shown: the headline paragraph, then the tables (text in a terminal, HTML in a notebook)."""

    audit: PromptAudit
    max_rejected_rate: float | None = None

    def __str__(self) -> str:
        parts = [headline(self.audit, self.max_rejected_rate)]
        parts += [str(table) for table in tables(self.audit)]
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = f"<p>{html.escape(headline(self.audit, self.max_rejected_rate))}</p>"
        return head + "".join(table._repr_html_() for table in tables(self.audit))
