"""The prompt audit on a large file: peak memory (RSS) and time, beside the bare reader's pass in the same run.

Writes ``--rows`` synthetic prompt rows (default 900,000, the mixed shape: the size of the seeds' prompt set; or
``--shape long-chat``) with ``--duplicates`` of them copies of earlier rows under new ids, then runs, each in a
fresh process: the reader alone (``iter_prompts``: one hash per id and per conversation), the audit with its
near-duplicate index over the first 20,000 conversations (what preflight and the estimate index), and the audit
over every conversation (``draftgen prompts audit``'s default). Prints each pass's peak RSS and seconds, and their ratios to the
reader's. The memory the audit adds is the first-turn hashes, the near-duplicate index (about 2 KB a
conversation indexed) and counters; nothing of a row is kept after it is read.

    .venv/bin/python benchmarks/prompt_audit_memory.py [--rows 900000] [--shape mixed|long-chat] [--keep FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftgen.prompts.long_chat import long_chat_rows
from draftgen.prompts.synthetic import synthetic_rows, write_rows

CHILD = r"""
import json, sys, time
from pathlib import Path
mode, path = sys.argv[1], Path(sys.argv[2])
started = time.perf_counter()
if mode == "reader":
    from draftgen.prompts.rows import PromptRow, iter_prompts
    counts = {"rows": 0, "valid": 0}
    for item in iter_prompts(path):
        counts["rows"] += 1
        counts["valid"] += isinstance(item, PromptRow)
else:
    from draftgen.prompts.audit import AuditSettings, audit_prompts
    near_limit = {"audit": 0, "audit-near20k": 20_000}[mode]
    audit = audit_prompts(AuditSettings(path, near_limit=near_limit, progress=False))
    counts = {"rows": audit.rows, "conversations": audit.conversations, "duplicates": audit.duplicates,
              "near_duplicates": audit.near_duplicates, "near_indexed": audit.near_indexed}
seconds = time.perf_counter() - started
# VmHWM, this process's own high-water mark: ru_maxrss would carry the forking parent's from before exec
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "peak_kib": peak, **counts}))
"""

MODES = ("reader", "audit-near20k", "audit")


def _rows(rows: int, shape: str, duplicates: int, seed: int):
    """The generator's rows with ``duplicates`` of them replaced by copies of earlier ones (new ids)."""
    source = long_chat_rows if shape == "long-chat" else synthetic_rows
    rng = random.Random(seed)
    every = max(2, rows // max(1, duplicates))
    recent: list[dict] = []
    for index, row in enumerate(source(rows, seed)):
        if duplicates and index % every == every - 1 and recent:
            copy = dict(rng.choice(recent))
            copy["id"] = f"copy-{index}"
            yield copy
            continue
        if len(recent) < 1000:
            recent.append(row)
        else:
            recent[rng.randrange(1000)] = row
        yield row


def _run(mode: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=900_000)
    parser.add_argument("--shape", choices=("mixed", "long-chat"), default="mixed")
    parser.add_argument("--duplicates", type=int, default=0, help="copies planted (default: 5%% of --rows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--keep", type=Path, default=None, help="write the file here and keep it")
    args = parser.parse_args()
    duplicates = args.duplicates or args.rows // 20
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "prompts.jsonl"
        started = time.perf_counter()
        if not path.exists():
            write_rows(path, _rows(args.rows, args.shape, duplicates, args.seed))
        print(
            f"{args.rows:,} {args.shape} rows, ~{duplicates:,} planted copies, {path.stat().st_size / 2**20:,.0f} MiB "
            f"({time.perf_counter() - started:,.0f} s to write)"
        )
        results = {}
        for mode in args.modes.split(","):
            results[mode] = _run(mode, path)
            base = results.get("reader")
            ratio = ""
            if base and mode != "reader":
                ratio = (
                    f"  (x{results[mode]['peak_kib'] / base['peak_kib']:.2f} the reader's memory, "
                    f"x{results[mode]['seconds'] / base['seconds']:.2f} its time)"
                )
            print(
                f"{mode:15} peak RSS {results[mode]['peak_kib'] / 1024:8,.0f} MiB  {results[mode]['seconds']:8,.1f} s"
                f"{ratio}  {json.dumps({k: v for k, v in results[mode].items() if k not in ('seconds', 'peak_kib')})}"
            )


if __name__ == "__main__":
    main()
