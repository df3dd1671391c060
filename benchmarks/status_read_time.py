"""Figure: how long ``draftgen status`` and monitor.ipynb take on a run folder holding 1M rows.

Builds a run folder as a ~28-hour generate would leave it: ``--rows`` rows (default 1,000,000) in shards of
``--shard-rows`` with the real output schema (reasoning and answer of incompressible text, so the files are as
large as real ones; finish reasons, completion lengths and servers varied), a manifest, progress.json and
progress-history.jsonl (one line every 5 s across the run, seven servers), all written by draftgen's own writer.
Then times, best and worst of three:

* ``draftgen status RUN`` as a user runs it (a new interpreter each time); baseline: ``draftgen --version``,
  which imports every command's module (what any command cost before a command line loaded only its own);
* monitor.ipynb's reads (shards' two columns, scanned lazily; the history; the binned rates); baseline: reading
  the shards whole, every column;
* the whole notebook once through ``draftgen run monitor`` (kernel start-up and four figures included).

    .venv/bin/python benchmarks/status_read_time.py [--rows 1000000] [--shard-rows 500]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from draftgen.generate.status_file import FleetSnapshot, ServerSnapshot, StatusWriter
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.watch import monitor

SERVERS = [f"http://127.0.0.1:{30000 + i}" for i in range(7)]
HISTORY_INTERVAL_S = 5.0
RATE = 10.0  # conversations per second: 1M rows in ~28 h


def write_shards(out_dir: Path, rows: int, shard_rows: int, chars: int, rng: np.random.Generator) -> None:
    shard_dir = out_dir / "shards"
    shard_dir.mkdir(parents=True)
    # Rows take slices of one 64M-character random pool: far apart, so zstd finds nothing to share within a shard
    # and the files are as large as real text makes them (~4 bits per character).
    noise = rng.bytes(32 << 20).hex()
    for seq, start in enumerate(range(0, rows, shard_rows), start=1):
        n = min(shard_rows, rows - start)
        offsets = rng.integers(0, len(noise) - chars, size=n)
        tokens = np.minimum(rng.lognormal(7.0, 0.6, size=n).astype(np.int64), 4096)
        ids = [f"prompt-{i:09d}" for i in range(start, start + n)]
        frame = pl.DataFrame(
            {
                "id": ids,
                "messages": [[{"role": "user", "content": f"question {i}"}] for i in range(start, start + n)],
                "reasoning_content": [noise[o : o + chars] for o in offsets],
                "content": [noise[o : o + chars // 5] for o in offsets],
                "finish_reason": np.where(tokens >= 4096, "length", "stop").tolist(),
                "prompt_tokens": rng.integers(20, 400, size=n).tolist(),
                "completion_tokens": tokens.tolist(),
                "spec_accept_length": rng.normal(3.5, 0.2, size=n).tolist(),
                "spec_verify_ct": (tokens // 3).tolist(),
                "server": [SERVERS[i % len(SERVERS)] for i in range(start, start + n)],
                "latency_s": rng.uniform(5, 60, size=n).tolist(),
                "attempts": [1] * n,
                "response_id": ids,
                "started_at": (1.7e9 + np.arange(start, start + n) / RATE).tolist(),
                "usage_reported": [True] * n,
                "ttft_s": [None] * n,
                "source_row": list(range(start + 1, start + n + 1)),
            },
        )
        frame = (
            frame.with_columns(  # single-turn rows: each turn_* list holds the one completion
                pl.lit([0]).alias("turn_after"),
                pl.concat_list("reasoning_content").alias("turn_reasoning"),
                pl.concat_list("content").alias("turn_content"),
                pl.concat_list("finish_reason").alias("turn_finish_reason"),
                pl.concat_list("prompt_tokens").alias("turn_prompt_tokens"),
                pl.concat_list("completion_tokens").alias("turn_completion_tokens"),
                pl.concat_list("spec_accept_length").alias("turn_spec_accept_length"),
                pl.concat_list("spec_verify_ct").alias("turn_spec_verify_ct"),
                pl.lit("last").alias("turns_mode"),
            )
            .cast(dict(OUTPUT_SCHEMA))
            .select(OUTPUT_SCHEMA.names())
        )
        frame.write_parquet(shard_dir / f"part-{seq:06d}.parquet", compression="zstd", statistics=False)


def write_watch_files(out_dir: Path, rows: int) -> int:
    """progress.json and progress-history.jsonl as the writer leaves them after the whole run (state running)."""
    steps = int(rows / RATE / HISTORY_INTERVAL_S)
    clock = [time.time() - steps * HISTORY_INTERVAL_S]  # the run started ~28 h ago and is writing now
    writer = StatusWriter(
        out_dir,
        interval_s=HISTORY_INTERVAL_S,
        total=rows + rows // 10,
        done_at_start=0,
        clock=lambda: clock[0],
    )
    per_step = rows / steps
    for step in range(steps + 1):
        done = int(step * per_step)
        share = done // len(SERVERS)
        servers = tuple(
            ServerSnapshot(url, True, 64, share, share * 1100, share * 3.5, share, 0, 0) for url in SERVERS
        )
        guard = {"empty_answer": 0.004, "empty_reasoning": 0.0, "truncated": 0.03, "failed": 0.0}
        writer.update(FleetSnapshot(done, 0, done * 1100, 0, servers, guard, {}, done))
        clock[0] += HISTORY_INTERVAL_S
    clock[0] = time.time()  # the job is alive and writing now
    writer.update(FleetSnapshot(done, 0, done * 1100, 0, servers, guard, {}, done), force=True)
    (out_dir / "manifest.json").write_text(
        json.dumps({"status": "running", "parameters": {"max_tokens": 4096}})
    )
    return steps + 2  # one line per step, and the last heartbeat's


def timed(function, repeats: int = 3) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        function()
        times.append(time.perf_counter() - t0)
    return times


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftgen", *args], capture_output=True, text=True, check=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shard-rows", type=int, default=500)
    parser.add_argument(
        "--text-chars", type=int, default=2000, help="reasoning length; answers are 1/5 of it"
    )
    parser.add_argument(
        "--folder",
        type=Path,
        help="build the run folder here and keep it; an existing one with the same --rows is reused "
        "(building 1M rows takes minutes)",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        run_dir = args.folder or Path(tmp) / "run"
        started = time.perf_counter()
        built = run_dir / "built.json"
        reused = built.exists() and json.loads(built.read_text()) == {"rows": args.rows}
        if not reused:
            shutil.rmtree(run_dir, ignore_errors=True)
            write_shards(run_dir, args.rows, args.shard_rows, args.text_chars, rng)
            built.write_text(json.dumps({"rows": args.rows}))
        for name in ("progress.json", "progress-history.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
        lines = write_watch_files(run_dir, args.rows)
        shards = monitor.shard_files(run_dir)
        size = sum(p.stat().st_size for p in shards)
        history_mb = (run_dir / "progress-history.jsonl").stat().st_size / 1e6
        print(
            f"{'reused' if reused else 'wrote'} {args.rows:,} rows in {len(shards):,} shards ({size / 1e6:,.0f} MB), "
            f"wrote {lines:,} history lines ({history_mb:.1f} MB); {time.perf_counter() - started:.1f} s"
        )

        result = cli("status", str(run_dir))
        assert result.returncode == 0 and "ETA" in result.stdout, result.stdout + result.stderr
        status_times = timed(lambda: cli("status", str(run_dir)))
        startup_times = timed(lambda: cli("--version"))

        def read() -> None:
            rows = monitor.read_shard_columns(run_dir)
            assert rows.height == args.rows
            history = monitor.history_frame(run_dir)
            assert history.height == lines * len(SERVERS)
            monitor.binned(history, 120)

        read_times = timed(read)
        t0 = time.perf_counter()
        assert pl.read_parquet(shards).height == args.rows
        whole = time.perf_counter() - t0

        out_root = Path(tmp) / "outputs"
        t0 = time.perf_counter()
        result = cli(
            "run",
            "monitor",
            "-p",
            "run_dir",
            str(run_dir),
            "--name",
            "bench",
            "--out-root",
            str(out_root),
            "--no-html",
        )
        notebook = time.perf_counter() - t0
        assert result.returncode == 0, result.stderr[-2000:]

    print(
        f"draftgen status: best {min(status_times):.2f} s, worst {max(status_times):.2f} s of 3   (goal <= 1 s); "
        f"baseline draftgen --version, which imports every command as each command once did: "
        f"{min(startup_times):.2f} s ({min(startup_times) / min(status_times):.1f}x status)"
    )
    print(
        f"monitor.ipynb's reads: best {min(read_times):.2f} s, worst {max(read_times):.2f} s of 3   (goal <= 10 s); "
        f"baseline reading the shards whole {whole:.2f} s ({whole / min(read_times):.1f}x slower)"
    )
    print(f"monitor.ipynb end to end (draftgen run monitor: kernel, reads, four figures): {notebook:.1f} s")
    print(
        json.dumps(
            {
                "rows": args.rows,
                "shards": len(shards),
                "status_s_best": round(min(status_times), 3),
                "status_s_worst": round(max(status_times), 3),
                "startup_s_best": round(min(startup_times), 3),
                "monitor_read_s_best": round(min(read_times), 3),
                "monitor_read_s_worst": round(max(read_times), 3),
                "read_whole_s": round(whole, 3),
                "monitor_notebook_s": round(notebook, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
