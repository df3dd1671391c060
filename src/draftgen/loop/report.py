"""The loop's answer: per arm, accuracy by draft position and the simulated acceptance length on the held-out rows,
mean and spread over the seeds, beside the most-frequent-token baseline; and the sentence that says which arm won."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from draftgen.display.table import Column, Table

SHOWN_POSITIONS = 7  # acc@1..acc@7 in the printed table (every position is in the data)
BASELINE = "baseline"  # the arm name of "predict the commonest trained token"


@dataclass(frozen=True)
class ArmRun:
    """One trained drafter (or the baseline) on the held-out rows."""

    arm: str
    seed: int | None
    accuracy: list[float]  # per draft position 1 .. block_size − 1
    simulated_length: float
    accepted: float
    pooled: float
    specforge_eval_acc: float | None  # SpecForge's own evaluator, pooled (None: the baseline)
    train_rows: int
    trained_tokens: int
    seconds: float = 0.0


def spread(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summary(runs: Sequence[ArmRun]) -> pl.DataFrame:
    """One row per arm: the mean over its seeds of every figure, and the spread (sample s.d.) of the length."""
    rows: list[dict[str, Any]] = []
    for arm in dict.fromkeys(r.arm for r in runs):
        mine = [r for r in runs if r.arm == arm]
        positions = len(mine[0].accuracy)
        row: dict[str, Any] = {"arm": arm, "seeds": sum(r.seed is not None for r in mine)}
        for k in range(positions):
            row[f"acc_{k + 1}"] = statistics.fmean(r.accuracy[k] for r in mine)
        lengths = [r.simulated_length for r in mine]
        row |= {
            "sim_accept_len": statistics.fmean(lengths),
            "sim_accept_len_sd": spread(lengths),
            "sim_accept_len_min": min(lengths),
            "sim_accept_len_max": max(lengths),
            "accepted": statistics.fmean(r.accepted for r in mine),
            "pooled_acc": statistics.fmean(r.pooled for r in mine),
            "specforge_eval_acc": (
                statistics.fmean(r.specforge_eval_acc for r in mine)
                if all(r.specforge_eval_acc is not None for r in mine)
                else None
            ),
            "train_rows": mine[0].train_rows,
            "trained_tokens": mine[0].trained_tokens,
        }
        rows.append(row)
    return pl.DataFrame(rows)


def table(frame: pl.DataFrame, held_rows: int, positions: int = SHOWN_POSITIONS) -> Table:
    accs = [c for c in frame.columns if c.startswith("acc_")][:positions]
    columns: list[str | Column] = [
        Column("arm", "arm", "text"),
        Column("seeds", "seeds", "int"),
        *(Column(c, f"acc@{c.removeprefix('acc_')}", "number", 3, "") for c in accs),
        Column("sim_accept_len", "sim. accept length", "number", 3, ""),
        Column("sim_accept_len_sd", "± s.d.", "number", 3, ""),
        Column("accepted", "accepted (measured)", "number", 3, ""),
        Column("specforge_eval_acc", "SpecForge eval acc", "number", 3, ""),
        Column("train_rows", "train rows", "int"),
        Column("trained_tokens", "trained tokens", "int"),
    ]
    return Table(
        frame,
        columns,
        title=f"Drafter accuracy on {held_rows:,} held-out rows of the target's own answers",
        note="acc@k: draft position k right; sim. accept length: SpecForge's a1 + a1·a2 + ... over the positions; "
        "accepted: the measured mean run of right predictions from position 1; mean over the seeds",
    )


def shown_better(frame: pl.DataFrame, arm: str, others: tuple[str, ...]) -> bool:
    """Whether ``arm`` beat each of ``others`` (and the baseline) on every seed: its worst seed's simulated
    acceptance length above their best's. The pilot's gate before a long run (``draftgen loop`` exits 1 otherwise)."""
    rows = {r["arm"]: r for r in frame.iter_rows(named=True)}
    if arm not in rows:
        return False
    low = rows[arm]["sim_accept_len_min"]
    rivals = [rows[o] for o in (*others, BASELINE) if o in rows]
    return all(low > r.get("sim_accept_len_max", r["sim_accept_len"]) for r in rivals)


def verdict(frame: pl.DataFrame, first: str, second: str) -> str:
    """Which of two arms the held-out rows prefer, and whether the seeds' ranges keep them apart."""
    rows = {r["arm"]: r for r in frame.iter_rows(named=True)}
    a, b = rows[first], rows[second]
    better, worse = (a, b) if a["sim_accept_len"] >= b["sim_accept_len"] else (b, a)
    apart = better["sim_accept_len_min"] > worse["sim_accept_len_max"]
    how = "every seed" if apart else "on the mean only: the seeds' ranges overlap"
    base = rows.get(BASELINE)
    beyond = (
        f"; the baseline (commonest token) reads {base['sim_accept_len']:.3f}" if base is not None else ""
    )
    return (
        f"{better['arm']} trains the better drafter ({how}): simulated acceptance length "
        f"{better['sim_accept_len']:.3f} ± {better['sim_accept_len_sd']:.3f} against {worse['arm']}'s "
        f"{worse['sim_accept_len']:.3f} ± {worse['sim_accept_len_sd']:.3f} over {better['seeds']} seed(s){beyond}"
    )
