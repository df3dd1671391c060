"""Where a command's CPU time goes, by kind of process: what told us the SGLang tier is bound by SGLang's
start-ups, and what to measure again before trying to make the tier faster.

Runs the command, reads every process's CPU time (user + system, from /proc) every ``--every`` seconds while it
runs, and prints core-seconds per kind (an SGLang launcher, SGLang's scheduler and detokenizer, a notebook
kernel, draftgen, pytest, other), the number of processes of each kind, the wall time and the cores used on
average. Every process on the machine counts, so run it on a quiet one, or pass ``--tree`` to count only the
command and what it started (a process that outlives its parent is counted while its parent lives). Processes
that live shorter than one interval are missed (a few core-seconds at most). Linux only.

    .venv/bin/python benchmarks/cpu_by_process.py -- make test-sglang
    .venv/bin/python benchmarks/cpu_by_process.py --tree -- make test
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # first match wins: (kind, words of the command line that mark it)
    # spawned: "python -c from multiprocessing.spawn ..." at first; either way SGLang then names them sglang::...
    ("SGLang scheduler/detokenizer", ("multiprocessing.spawn", "sglang::")),
    ("SGLang launcher (tokenizer manager)", ("sglang.launch_server",)),
    ("notebook kernel", ("ipykernel",)),
    ("simulated SGLang server", ("draftgen.sim.server",)),
    ("SMG (the gateway)", ("smg ", "/smg")),
    ("draftgen (serve, run, sim, dry runs)", ("draftgen",)),
    ("pytest", ("pytest", "xdist")),
)


@dataclass
class Seen:
    command: str
    first_cpu_s: float
    last_cpu_s: float


def cpu_seconds(pid: str) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def command_of(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kind_of(command: str) -> str:
    for kind, words in KINDS:
        if any(word in command for word in words):
            return kind
    return "other"


def parent_of(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[1]


def tree_of(root: str, pids: list[str]) -> set[str]:
    """``root`` and every process whose chain of parents reaches it."""
    parents = {pid: parent_of(pid) for pid in pids}
    inside = {root}
    for pid in pids:
        chain, cursor = [], pid
        while cursor is not None and cursor not in inside and cursor != "0" and len(chain) < 64:
            chain.append(cursor)
            cursor = parents.get(cursor) or parent_of(cursor)
        if cursor in inside:
            inside.update(chain)
    return inside


def sample(seen: dict[str, Seen], root: str | None = None) -> None:
    pids = list(filter(str.isdigit, os.listdir("/proc")))
    if root is not None:
        inside = tree_of(root, pids)
        pids = [pid for pid in pids if pid in inside]
    for pid in pids:
        cpu = cpu_seconds(pid)
        if cpu is None:
            continue
        if pid in seen:
            seen[pid].last_cpu_s = cpu
            if "sglang.launch_server" in seen[pid].command:  # a forked child renames itself a moment later
                seen[pid].command = command_of(pid) or seen[pid].command
        else:  # a process already running counts from now on; one of the tree's own from its start
            seen[pid] = Seen(command_of(pid), 0.0 if root is not None else cpu, cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--tree", action="store_true", help="count only the command and what it started")
    parser.add_argument("command", nargs="+", help="the command to run (after --)")
    args = parser.parse_args()
    seen: dict[str, Seen] = {}
    began = time.monotonic()
    if not args.tree:
        sample(seen)
    process = subprocess.Popen(args.command)
    root = str(process.pid) if args.tree else None
    while process.poll() is None:
        time.sleep(args.every)
        sample(seen, root)
    wall = time.monotonic() - began
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for record in seen.values():
        used = record.last_cpu_s - record.first_cpu_s
        if used > 0:
            kind = kind_of(record.command)
            totals[kind] += used
            counts[kind] += 1
    total = sum(totals.values())
    print(f"\n{args.command!r} exited {process.returncode} after {wall:.0f} s")
    print(f"{'core-s':>8} {'procs':>5}  kind")
    for kind, used in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"{used:8.0f} {counts[kind]:5d}  {kind}")
    print(f"{total:8.0f}        in all: {total / wall:.2f} of {os.cpu_count()} cores on average")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
