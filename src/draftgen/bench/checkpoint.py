"""Finished benchmark levels on disk, so an interrupted benchmark resumes at the level it lost.

Each server × level is written to ``out_dir/levels/`` the moment it finishes (with ``draftgen.rundir.write``: a
level is on disk whole or not at all). A resumed run reuses a stored level only when nothing that shaped its numbers changed: the
server's URL and what it said about itself (engine, version, batch cap, speculative algorithm), the model, the
sampling parameters, and the exact prompts the level sent, in order. Anything else is measured again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from draftgen.bench.answer_point import chosen_point
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.records import LevelRun, RequestRecord, ServerFacts, WorkerWindow
from draftgen.client.metrics import CounterWindow
from draftgen.prompts.rows import PromptRow
from draftgen.rundir import remove_leftovers, write_json
from draftgen.rundir.layout import BENCH_LEVEL_GLOB, bench_level_name

FORMAT_VERSION = 1
SERVER_IDENTITY = (
    "url",
    "engine",
    "version",
    "max_running_requests",
    "speculative_algorithm",
    "clock_factor",  # a simulator restarted at another --speed measures other wall-clock numbers
)


def level_identity(
    facts: ServerFacts, config: BenchmarkConfig, concurrency: int, rows: Sequence[PromptRow]
) -> dict[str, Any]:
    """Everything a stored level must share with the level about to run for its numbers to stand in for it."""
    identity = {
        "format": FORMAT_VERSION,
        "server": {name: getattr(facts, name) for name in SERVER_IDENTITY},
        "model": config.model,
        "sampling": config.sampling.model_dump(),
        "concurrency": concurrency,
        "prompt_ids": [row.id for row in rows],
    }
    points = [chosen_point(row, config.turns) for row in rows]
    if any(p is not None for p in points):  # absent without agentic rows: older stored levels still match
        identity["answer_points"] = points  # an agentic row is asked at one point (bench.answer_point)
    if config.sampling_plan:  # absent without a plan: levels stored before the plan existed still match
        identity["sampling_plan"] = [arm.model_dump(exclude_none=True) for arm in config.sampling_plan]
    return identity


def _differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    names = []
    for key, value in wanted.items():
        if key == "server" and isinstance(stored.get(key), dict):
            names += [f"server {k}" for k, v in value.items() if stored[key].get(k) != v]
        elif stored.get(key) != value:
            names.append(
                {"prompt_ids": "prompts", "answer_points": "agentic rows' answer points"}.get(key, key)
            )
    return names


def _level_to_json(level: LevelRun) -> dict[str, Any]:
    data = asdict(level)
    data.pop("reused", None)  # a property of this run's use of the level, not of the measurement
    return data


def _level_from_json(data: dict[str, Any]) -> LevelRun:
    requests = tuple(
        RequestRecord(**{**r, "chunk_offsets": tuple(r["chunk_offsets"])}) for r in data["requests"]
    )
    workers = tuple(
        WorkerWindow(worker=w["worker"], window=_window_from_json(w["window"]), note=w.get("note"))
        for w in data.get("worker_windows", ())
    )
    known = {f.name for f in fields(LevelRun)}
    parsed = ("requests", "metrics_window", "worker_windows")
    rest = {k: v for k, v in data.items() if k in known and k not in parsed}
    rest["client_lag_ms"] = tuple(rest.get("client_lag_ms", ()))
    return LevelRun(
        **rest,
        requests=requests,
        metrics_window=_window_from_json(data["metrics_window"]),
        worker_windows=workers,
        reused=True,
    )


def _window_from_json(window: dict[str, Any] | None) -> CounterWindow | None:
    if window is None:
        return None
    return CounterWindow(
        seconds=window["seconds"], deltas=dict(window["deltas"]), reset=tuple(window["reset"])
    )


class LevelStore:
    """``out_dir/levels/gpu{index}-c{concurrency}.json``: one finished level each, with its identity."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, gpu: int, concurrency: int) -> Path:
        return self.root / bench_level_name(gpu, concurrency)

    def remove_leftovers(self) -> int:
        """Delete what saves interrupted before their rename left (the benchmark is this folder's one writer)."""
        return len(remove_leftovers([self.root])) if self.root.is_dir() else 0

    def clear(self) -> int:
        """Forget every stored level (a fresh benchmark in a folder that held one); returns how many."""
        removed = 0
        if self.root.is_dir():
            for path in self.root.glob(BENCH_LEVEL_GLOB):
                path.unlink()
                removed += 1
        return removed

    def save(self, identity: dict[str, Any], level: LevelRun) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(level.gpu, level.concurrency)
        return write_json(path, {"identity": identity, "level": _level_to_json(level)})

    def load(self, identity: dict[str, Any], gpu: int, concurrency: int) -> tuple[LevelRun | None, str]:
        """The stored level if its identity matches, else None and why it cannot be reused (for the log)."""
        path = self.path(gpu, concurrency)
        if not path.is_file():
            return None, "not measured yet"
        try:
            stored = json.loads(path.read_text())
            differences = _differences(stored["identity"], identity)
            if differences:
                return None, f"{path.name} was measured with a different {', '.join(differences)}"
            return _level_from_json(stored["level"]), f"reused from {path}"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"{path.name} is unreadable ({type(exc).__name__}: {exc})"
