"""Helpers for the generate tests: a stored completion row, and the ``draftgen run generate`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

URL = "http://127.0.0.1:9"


def row(prompt_id: str, tokens: int = 5) -> dict:
    """One completed prompt as generate stores it (for RunStore tests that need no server)."""
    return {
        "id": prompt_id,
        "messages": [{"role": "user", "content": "q " + prompt_id}],
        "reasoning_content": "thought",
        "content": "answer",
        "finish_reason": "stop",
        "prompt_tokens": 3,
        "completion_tokens": tokens,
        "spec_accept_length": None,
        "spec_verify_ct": None,
        "server": URL,
        "latency_s": 0.1,
        "attempts": 1,
        "response_id": "r-" + prompt_id,
        "started_at": 1.0,
        "usage_reported": True,
        "ttft_s": None,
        "source_row": 1,
    }


def run_command(out_root: Path, name: str, params: dict, *extra: str) -> list[str]:
    """``python -m draftgen run generate --name NAME --out-root ROOT -p KEY VALUE ...`` as an argv list."""
    command = [
        sys.executable,
        "-m",
        "draftgen",
        "run",
        "generate",
        "--name",
        name,
        "--out-root",
        str(out_root),
    ]
    for key, value in params.items():
        command += ["-p", key, json.dumps(value) if not isinstance(value, str) else value]
    return [*command, *extra]
