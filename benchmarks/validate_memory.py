"""Does validate stream a 1M-row generation in bounded memory? Peak RSS at two sizes of the same corpus.

Takes a run folder with the server's token ids (default: a generate run made here on two simulated servers over
the bundled synthetic prompts, multi-turn rows among them, with short completions, ``--max-tokens`` 64, so that a
million rows validate in tens of minutes; ``--source`` takes any run folder, e.g. the demo's) and replicates its shards under new prompt ids up to ``--rows`` rows (ids change, everything else
is the simulator's real output, so validate does its full work per row: per-turn rows from the server's ids, the
comparison with re-tokenizing, every check, the export). Then validate runs in a fresh interpreter at ``--rows``
and at a tenth of it, and the script prints each run's peak RSS, time and rows/s, and the memory slope between them
in bytes per row: what grows with the corpus (the corpus-wide index of id and answer hashes, 24 bytes a stored row
while it is built; the records are streamed to samples.parquet, not held), beside what does not (one batch of
``batch_size`` rows in flight, however long the answers are; the streaming sink's buffers).

The replicated answers repeat, so ``duplicate_answer_min_prompts`` is set past the replication factor (the check
still runs over every answer's hash; it just flags none), and no row is dropped for being a copy.

    .venv/bin/python benchmarks/validate_memory.py [--rows 1000000] [--max-tokens 64] [--source RUN --tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
from sim_generate import run_generate, sim_generate_config

from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim import SimFleet

SOURCE_PROMPTS = 2000  # as many as the bundled set: multi-turn rows among them
CHILD = r"""
import json, resource, sys, time
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import validate_generation
args = json.loads(sys.argv[1])
started = time.perf_counter()
result = validate_generation(ValidateConfig(**args), progress=False)
print(json.dumps({
    "seconds": time.perf_counter() - started,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rows": result.counts["in"],  # not result.records: that reads every record into this process
    "kept": result.counts["in"] - result.counts["dropped"],
    "server_id_rows": int(result.counts["token_source"]["server"]),
}))
"""


def make_source(work: Path, max_tokens: int) -> tuple[Path, Path]:
    """(run folder, tokenizer folder): generate over the bundled synthetic prompts on two simulated servers."""
    prompts = work / "prompts.jsonl"
    write_synthetic(prompts, SOURCE_PROMPTS)
    with SimFleet(servers=2, profile="instant", work_dir=work / "sim") as fleet:
        config = sim_generate_config(fleet, prompts, work / "source", max_tokens=max_tokens)
        run_generate(config, progress=False)
        return work / "source", work / "sim" / "tokenizer"


def replicate(source: Path, target: Path, rows: int) -> int:
    """Copies of the source's shards, each copy's ids suffixed, until ``rows`` rows; returns the copies made."""
    shards = sorted((source / "shards").glob("part-*.parquet"))
    frames = [pl.read_parquet(s) for s in shards]
    per_copy = sum(f.height for f in frames)
    (target / "shards").mkdir(parents=True)
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.pop(
        "prompt_file", None
    )  # the copies' ids are not the prompt file's: coverage is not what is measured
    for key in ("parameters",):
        if isinstance(manifest.get(key), dict):
            manifest[key].pop("prompts", None)
    (target / "manifest.json").write_text(json.dumps(manifest))
    written, seq, copy = 0, 0, 0
    while written < rows:
        for frame in frames:
            take = frame.head(rows - written)
            if take.height == 0:
                break
            take = take.with_columns((pl.col("id") + f"~{copy}").alias("id"))
            seq += 1
            take.write_parquet(target / "shards" / f"part-{seq:06d}.parquet", compression="zstd")
            written += take.height
        copy += 1
    print(f"  {written:,} rows in {seq:,} shards ({copy} copies of {per_copy:,} rows)", flush=True)
    return copy


def run_validate(run_dir: Path, out_dir: Path, tokenizer: Path, copies: int, batch_size: int) -> dict:
    args = {
        "generation_dir": str(run_dir),
        "tokenizer": str(tokenizer),
        "out_dir": str(out_dir),
        "duplicate_answer_min_prompts": copies + 10,
        "batch_size": batch_size,
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"validate failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source", type=Path, default=None, help="a generate run folder (default: made here)"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="the made run's max_tokens")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--tokenizer", type=Path, default=None, help="with --source: the servers' tokenizer")
    args = parser.parse_args()
    if args.source and not args.tokenizer:
        parser.error("--source needs --tokenizer (the folder of the tokenizer its servers used)")
    work = Path(tempfile.mkdtemp(prefix="validate-memory-"))
    try:
        if args.source:
            source, tokenizer = args.source, args.tokenizer
        else:
            source, tokenizer = make_source(work, args.max_tokens)
        print(f"source run: {source}", flush=True)
        results = {}
        for rows in (args.rows // 10, args.rows):
            run_dir = work / f"run-{rows}"
            t0 = time.perf_counter()
            copies = replicate(source, run_dir, rows)
            print(f"  built in {time.perf_counter() - t0:.0f} s; validating {rows:,} rows ...", flush=True)
            results[rows] = run_validate(
                run_dir, work / f"validate-{rows}", Path(tokenizer), copies, args.batch_size
            )
            shutil.rmtree(run_dir)
            shutil.rmtree(work / f"validate-{rows}")
            r = results[rows]
            print(
                f"  {rows:>9,} rows: peak RSS {r['peak_rss_mib']:,.0f} MiB, {r['seconds']:,.0f} s "
                f"({r['rows'] / r['seconds']:,.0f} training rows/s), {r['rows']:,} training rows, "
                f"{r['kept']:,} kept, {r['server_id_rows']:,} from the server's ids",
                flush=True,
            )
        small, large = (results[k] for k in sorted(results))
        slope = (large["peak_rss_mib"] - small["peak_rss_mib"]) * 2**20 / (large["rows"] - small["rows"])
        print(
            f"memory growth: {slope:,.0f} bytes per training row between the two sizes "
            f"({large['peak_rss_mib'] / small['peak_rss_mib']:.2f}x the peak for {large['rows'] / small['rows']:.0f}x "
            "the rows); this process's own peak: "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
