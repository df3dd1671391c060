"""Helpers for the benchmark/estimate notebook tests: run a notebook headless, read the simulator's truth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from draftgen.bench.records import RequestRecord, ServerFacts

RUN_TIMEOUT_S = 300


def run_notebook(notebook: str, out_root: Path, name: str, params: dict) -> Path:
    """``draftgen run NOTEBOOK`` in a subprocess (papermill, python3 kernel); returns the run folder."""
    command = [
        sys.executable,
        "-m",
        "draftgen",
        "run",
        notebook,
        "--name",
        name,
        "--out-root",
        str(out_root),
        "--no-html",
    ]
    for key, value in params.items():
        command += ["-p", key, value if isinstance(value, str) else json.dumps(value)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=os.environ.copy()
    )
    assert done.returncode == 0, f"{notebook} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out_root / notebook / name


def truth_by_level(truth: list[dict], requests) -> dict[tuple[str, int], dict]:  # type: ignore[no-untyped-def]
    """The simulator's own figures for each server × level, from the records of that level's requests."""
    by_rid = {r["rid"]: r for r in truth if r.get("kind") == "chat"}
    out = {}
    for (server, concurrency), group in requests.group_by(["server", "concurrency"]):
        records = [by_rid[rid] for rid in group["response_id"].to_list()]
        tokens = sum(r["completion_tokens"] for r in records)
        window = max(r["finished"] for r in records) - min(r["arrival"] for r in records)
        gaps = [b - a for r in records for a, b in zip(r["emit_times"], r["emit_times"][1:], strict=False)]
        out[(server, concurrency)] = {
            "output_tok_s": tokens / window,
            "output_tokens": tokens,
            "accept_length": tokens / sum(r["verify_steps"] for r in records),
            "ttft_s_p50": float(np.median([r["first_token"] - r["arrival"] for r in records])),
            "itl_s_p50": float(np.median(gaps)),
        }
    return out


# ----- records without servers ---------------------------------------------------------------------------------
URL = "http://127.0.0.1:1"


def facts(**changes) -> ServerFacts:
    base = {
        "index": 0,
        "url": URL,
        "engine": "sglang",
        "version": "0.5.23",
        "model_ids": ("m",),
        "extra_fields": True,
        "sglext": True,
        "metrics": True,
        "max_running_requests": 48,
        "speculative_algorithm": "NEXTN",
        "speculation": True,
    }
    return ServerFacts(**{**base, **changes})


def record(seq: int, **changes) -> RequestRecord:
    base = {
        "server": URL,
        "gpu": 0,
        "concurrency": 2,
        "seq": seq,
        "prompt_id": f"p{seq}",
        "ok": True,
        "error": None,
        "started_at": 100.0 + seq,
        "e2e_s": 2.0,
        "ttft_s": 0.5,
        "chunk_offsets": (0.5, 1.0, 1.5, 2.0),
        "usage_reported": True,
        "completion_tokens": 40,
        "finish_reason": "stop",
        "reasoning_chars": 300,
        "content_chars": 100,
        "content_blank": False,
        "spec_accept_length": 4.0,
        "spec_verify_ct": 10,
        "done_sentinel": True,
    }
    return RequestRecord(**{**base, **changes})
