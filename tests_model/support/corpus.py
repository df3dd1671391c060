"""Real prompts with their own answers: the English conversations of ``chatterbot-corpus`` (PyPI, BSD-3), people's
questions and the short replies its authors wrote for a chatbot, in 21 topics (trivia, coding, science, AI, small
talk, ...), a few dozen of them multi-turn.

Why this set: the loop's second arm trains on "the answers you had before", so the prompts must come with answers
someone other than the target wrote, in real language; chatterbot-corpus is the one public chat set shipped in a
PyPI package that does (others hold prompts only, or download their data at run time). Each conversation becomes a
prompt row ``{"id", "category", "messages"}`` alternating user and assistant, ending with an answer (a trailing
unanswered line is dropped); a conversation whose first line was seen before is skipped (the set repeats some).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "chatterbot_corpus"


def english_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{PACKAGE} is not installed: make test-model installs chatterbot-corpus==1.3.3"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "english"


def conversations() -> Iterator[dict]:
    """Every usable English conversation as a prompt row, in file and then file-order."""
    import yaml

    seen: set[str] = set()
    for path in sorted(english_dir().glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        category = (data.get("categories") or [path.stem])[0]
        for index, lines in enumerate(data.get("conversations") or []):
            turns = [str(line).strip() for line in lines]
            turns = turns[: len(turns) - len(turns) % 2]
            if not turns or not all(turns) or turns[0].lower() in seen:
                continue
            seen.add(turns[0].lower())
            messages = [
                {"role": "user" if j % 2 == 0 else "assistant", "content": text}
                for j, text in enumerate(turns)
            ]
            yield {"id": f"{path.stem}-{index}", "category": category, "messages": messages}


def spread(count: int) -> list[dict]:
    """``count`` rows spread evenly over the whole set (every topic in proportion), always the same ones."""
    rows = list(conversations())
    if count >= len(rows):
        return rows
    step = len(rows) / count
    return [rows[int(i * step)] for i in range(count)]


def write_prompts(path: Path, count: int) -> Path:
    path.write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in spread(count)), encoding="utf-8"
    )
    return path
