"""Where a pytest run's CPU time goes, test by test: what told us which tests to make cheaper to bring `make test`
back inside its budget (docs/testing.md).

A pytest plugin: each test's core-seconds are its worker's own CPU time (user + system) plus that of every process
the worker started and reaped while the test ran (simulated servers, notebook kernels, draftgen CLIs; a process
counts once its parent has waited for it, so a server a session-scoped fixture keeps is counted at the session's
end, under ``(session)``), together with its wall time. Each worker appends its lines to ``CPU_BY_TEST_OUT`` (a
JSON-lines file, default ``cpu-by-test.jsonl``); this module run as a script sums that file by test and by module.

    CPU_BY_TEST_OUT=/tmp/cpu.jsonl PYTHONPATH=benchmarks .venv/bin/python -m pytest -p cpu_by_test -n 4 ...
    .venv/bin/python benchmarks/cpu_by_test.py /tmp/cpu.jsonl --top 40
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUT = "CPU_BY_TEST_OUT"


def _cpu_now() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + reaped.ru_utime + reaped.ru_stime


def _write(record: dict) -> None:
    with open(os.environ.get(OUT, "cpu-by-test.jsonl"), "a") as out:
        out.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    cpu, wall = _cpu_now(), time.monotonic()
    yield
    _write({"test": item.nodeid, "cpu_s": _cpu_now() - cpu, "wall_s": time.monotonic() - wall})


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_START] = _cpu_now()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    start = config.stash.get(_START, None)
    if start is None:
        return
    if hasattr(config, "workerinput"):  # an xdist worker: its whole session, its tests' share included
        _write({"test": "(session)", "cpu_s": _cpu_now() - start, "wall_s": 0.0, "total": "worker"})
    else:  # the controller (or a run without workers): every reaped worker included
        _write({"test": "(run)", "cpu_s": _cpu_now() - start, "wall_s": 0.0, "total": "run"})


_START = pytest.StashKey[float]()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30, help="how many tests and modules to list")
    args = parser.parse_args()
    by_test: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    totals: dict[str, float] = defaultdict(float)
    for line in args.file.read_text().splitlines():
        record = json.loads(line)
        if record.get("total"):
            totals[record["total"]] += record["cpu_s"]
            continue
        by_test[record["test"]][0] += record["cpu_s"]
        by_test[record["test"]][1] += record["wall_s"]
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for test, (cpu, wall) in by_test.items():
        module = by_module[test.split("::")[0]]
        module[0] += cpu
        module[1] += wall
        module[2] += 1
    in_tests = sum(cpu for cpu, _ in by_test.values())
    print(
        f"{len(by_test)} tests: {in_tests:.0f} core-s in tests, {totals['worker']:.0f} in the workers' sessions,"
        f" {totals['run']:.0f} in the whole run"
    )
    print(f"\n{'core-s':>8} {'wall-s':>8}  test")
    for test, (cpu, wall) in sorted(by_test.items(), key=lambda item: -item[1][0])[: args.top]:
        print(f"{cpu:8.1f} {wall:8.1f}  {test}")
    print(f"\n{'core-s':>8} {'wall-s':>8} {'tests':>5}  module")
    for module, (cpu, wall, n) in sorted(by_module.items(), key=lambda item: -item[1][0])[: args.top]:
        print(f"{cpu:8.1f} {wall:8.1f} {n:5d}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
