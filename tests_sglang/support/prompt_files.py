"""Prompt files for the tier's notebook runs, small enough for two shared cores, each row with a known shape."""

from __future__ import annotations

import json
from pathlib import Path

SYSTEM = "You are terse."
# A prompt of more tokens than the tiny model's context (max_position_embeddings 4096): SGLang refuses it with a 400
# before it reaches the scheduler, as it would a too-long prompt on the GPU node.
TOO_LONG_WORDS = 5000


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def single_turn(prefix: str, count: int) -> list[dict]:
    return [
        {
            "id": f"{prefix}-{i:03d}",
            "messages": [{"role": "user", "content": f"Question {i}: what is the answer?"}],
        }
        for i in range(count)
    ]


def three_turns(prefix: str, count: int) -> list[dict]:
    """System prompt, then three user turns with the source's own (old) assistant answers between them: with
    ``turns: all`` the target answers after each user turn, its own earlier answers replacing the old ones."""
    rows = []
    for i in range(count):
        rows.append(
            {
                "id": f"{prefix}-{i:03d}",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"First question {i}?"},
                    {"role": "assistant", "content": "An old answer the target replaces."},
                    {"role": "user", "content": f"A follow-up {i}?"},
                    {"role": "assistant", "content": "Another old answer."},
                    {"role": "user", "content": f"The last one {i}?"},
                ],
            }
        )
    return rows


def too_long(prompt_id: str) -> dict:
    return {"id": prompt_id, "messages": [{"role": "user", "content": "word " * TOO_LONG_WORDS}]}


def ids_of(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
