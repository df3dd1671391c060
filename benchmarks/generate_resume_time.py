"""Figure (c): how long resuming takes with 1M ids already stored.

Writes ``--rows`` rows (default 1,000,000) as ``--rows / --shard-rows`` parquet shards with the real output
schema (reasoning and answer filled with incompressible text, 2,000 + 400 characters by default, so
the files are as large as real ones), then times ``RunStore.open`` — what a resumed
run does before sending anything: take the lock, clear leftovers, read the manifest, check the fingerprint,
read the id column of every shard, check for duplicates and build the skip set. The baseline in the same run
is reading the shards whole (every column), which is what a naive resume would do.

    .venv/bin/python benchmarks/generate_resume_time.py [--rows 1000000] [--shard-rows 500]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import polars as pl

from draftgen.generate.config import GenerateConfig
from draftgen.generate.store import OUTPUT_SCHEMA, RunStore, shard_paths
from draftgen.params import build_config


def text(chars: int) -> str:
    """Incompressible text, so shards are as large on disk as real ones (real text compresses ~3x; this ~2x)."""
    return os.urandom(chars // 2).hex()


def write_shards(out_dir: Path, rows: int, shard_rows: int, chars: int) -> None:
    shard_dir = out_dir / "shards"
    shard_dir.mkdir(parents=True)
    for seq, start in enumerate(range(0, rows, shard_rows), start=1):
        n = min(shard_rows, rows - start)
        ids = [f"prompt-{i:09d}" for i in range(start, start + n)]
        columns = {
            "id": ids,
            "messages": [[{"role": "user", "content": f"question {i}"}] for i in range(start, start + n)],
            "reasoning_content": [text(chars) for _ in range(n)],
            "content": [text(chars // 5) for _ in range(n)],
            "finish_reason": ["stop"] * n,
            "prompt_tokens": [40] * n,
            "completion_tokens": [900] * n,
            "spec_accept_length": [3.5] * n,
            "spec_verify_ct": [257] * n,
            "server": ["http://127.0.0.1:30000"] * n,
            "latency_s": [30.0] * n,
            "attempts": [1] * n,
            "response_id": ids,
            "started_at": [1.7e9] * n,
            "usage_reported": [True] * n,
            "ttft_s": [None] * n,
            "source_row": list(range(start + 1, start + n + 1)),
        }
        missing = {name: [None] * n for name in OUTPUT_SCHEMA if name not in columns}  # the per-turn columns
        frame = pl.DataFrame({**columns, **missing}, schema=OUTPUT_SCHEMA)
        frame.write_parquet(shard_dir / f"part-{seq:06d}.parquet", compression="zstd", statistics=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shard-rows", type=int, default=500)
    parser.add_argument(
        "--text-chars", type=int, default=2000, help="reasoning length; answers are 1/5 of it"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp:
        out_dir = Path(tmp) / "run"
        started = time.perf_counter()
        write_shards(out_dir, args.rows, args.shard_rows, args.text_chars)
        shards = shard_paths(out_dir)
        size = sum(p.stat().st_size for p in shards)
        print(
            f"wrote {args.rows:,} rows in {len(shards):,} shards ({size / 1e6:,.0f} MB) in "
            f"{time.perf_counter() - started:.1f} s"
        )
        config = build_config(
            GenerateConfig,
            {
                "servers": ["http://127.0.0.1:30000"],
                "model": "m",
                "prompts": "synthetic",
                "out_dir": str(out_dir),
            },
        )
        with RunStore.open(config) as store:  # writes the manifest, as a first session would have
            store.close("interrupted")
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            store = RunStore.open(config)
            times.append(time.perf_counter() - t0)
            assert len(store.done_ids) == args.rows
            store.release()
        t0 = time.perf_counter()
        whole = pl.read_parquet(shards)
        naive = time.perf_counter() - t0
        assert whole.height == args.rows
    best, worst = min(times), max(times)
    print(
        f"resume (RunStore.open: lock, manifest, fingerprint, id column of every shard, skip set): "
        f"best {best:.2f} s, worst {worst:.2f} s of 3   (goal <= 2 s)"
    )
    print(f"baseline: reading every shard whole: {naive:.2f} s  → resume is {naive / best:.1f}x faster")
    print(
        json.dumps(
            {
                "rows": args.rows,
                "shards": len(shards),
                "resume_s_best": round(best, 3),
                "resume_s_worst": round(worst, 3),
                "read_whole_s": round(naive, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
