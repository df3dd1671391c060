"""Prompt files → normalized prompt rows, streamed, with malformed rows set aside (never raised mid-run).

Accepted row shapes (docs/design.md#prompt-rows): ``{"id"?, "messages": [{"role", "content"}, ...]}``,
ShareGPT ``{"id"?, "conversations": [{"from", "value"}, ...]}`` and ``{"id"?, "prompt": "..."}``. Trailing
assistant turns are dropped (we regenerate them; ShareGPT rows always end with one, so they are never a reason
to reject). A tool turn without a preceding assistant turn and an empty user turn are rejected with the
reason. A missing id becomes a stable hash of the messages. A conversation the file already held under another id
is rejected as "duplicate of ID" unless duplicates are kept (docs/design.md#prompt-rows).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from draftgen.paths import resolve_path, root_note
from draftgen.prompts.synthetic import BUNDLED_PROMPTS

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "chatgpt": "assistant",
    "bing": "assistant",
}
PARQUET_BATCH_ROWS = 4096
# Where prompt sets name a row's kind, most specific first: ``category`` (MT-Bench, SPEED-Bench, Dolly, ModelOpt's
# per-category evaluation), ``task_category`` (Magpie), ``source`` (Tulu, OpenHermes and most mixtures), ``task``,
# ``domain``, ``subset``. A ``category_field`` parameter names any other.
CATEGORY_FIELDS = ("category", "task_category", "source", "task", "domain", "subset")
CATEGORY_MAX_CHARS = 100
SYNTHETIC = "synthetic"  # ``prompts: synthetic`` → the bundled 2,000-row synthetic set
DUPLICATE_OF = "duplicate of "  # how the reason of a conversation seen earlier under another id begins


@dataclass(frozen=True)
class PromptRow:
    id: str
    messages: tuple[dict[str, str], ...]
    row: int  # 1-based row (JSONL line) number in the source file
    category: str | None = None  # the row's category or source field, when it has one (CATEGORY_FIELDS)
    # With a sampling plan (draftgen.sampling_plan) each row is one sample: ``id`` is the sample's,
    # ``prompt_id`` the prompt's, ``arm`` and ``sample`` say which; None without a plan.
    prompt_id: str | None = None
    arm: str | None = None
    sample: int | None = None


@dataclass(frozen=True)
class RejectedRow:
    row: int
    id: str | None
    reason: str
    raw: str  # the offending row, truncated, so it can be fixed by hand

    @property
    def duplicate(self) -> bool:
        """A conversation the file held earlier under another id: skipped, not malformed."""
        return self.reason.startswith(DUPLICATE_OF)


class PromptFileError(ValueError):
    """The file itself is unusable (missing, wrong format, unreadable): nothing was read."""


# PromptRow's fields that are bookkeeping: everything else is what the model sees, and decides a duplicate.
_NOT_SEEN_BY_THE_MODEL = frozenset({"id", "row", "category", "prompt_id", "arm", "sample"})


def conversation_digest(value: Any, size: int = 8) -> bytes:
    """blake2b of a JSON value (keys sorted): the one hash of conversation content (ids, duplicates, the audit)."""
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(blob, digest_size=size).digest()


def stable_id(messages: tuple[dict[str, str], ...]) -> str:
    return "h-" + conversation_digest(messages, 10).hex()


def duplicate_key(row: PromptRow) -> int:
    """What makes two rows the same prompt: every field the model sees (the normalized messages, and any field
    that later reaches the request), hashed; the id, row number, category and sample are not part of it."""
    seen = {
        f.name: getattr(row, f.name) for f in dataclasses.fields(row) if f.name not in _NOT_SEEN_BY_THE_MODEL
    }
    return int.from_bytes(conversation_digest(seen), "little")


def folded(text: str) -> str:
    """Text compared as a reader would: case folded, whitespace collapsed (the audit's shared first turns)."""
    return " ".join(text.split()).casefold()


def shard_of(prompt_id: str, count: int) -> int:
    """Deterministic shard of an id: several client processes split one dataset without overlap."""
    digest = hashlib.blake2b(prompt_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % count


HOLDOUT_KEY = b"draftgen-holdout"  # keys the hash, so the held-out set is independent of the shards


def holdout_fraction(prompt_id: str) -> float:
    """A stable point in [0, 1) for an id: the held-out split takes the ids below its share, on every node and every
    rerun alike (a keyed hash, unrelated to ``shard_of``)."""
    digest = hashlib.blake2b(prompt_id.encode(), digest_size=8, key=HOLDOUT_KEY).digest()
    return int.from_bytes(digest, "little") / 2**64


def _truncate(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _messages_from(record: dict[str, Any]) -> tuple[dict[str, str], ...]:
    """Normalize one record's conversation or raise ValueError with the reason."""
    if "messages" in record and record["messages"] is not None:
        raw = record["messages"]
        if not isinstance(raw, list):
            raise ValueError("'messages' must be a list")
        messages = []
        for index, message in enumerate(raw):
            if not isinstance(message, dict):
                raise ValueError(f"messages[{index}] is not an object")
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise ValueError(
                    f"messages[{index}] has unknown role {role!r} (expected one of {', '.join(ROLES)})"
                )
            if not isinstance(content, str):
                raise ValueError(f"messages[{index}].content must be a string, got {type(content).__name__}")
            messages.append({"role": role, "content": content})
    elif "conversations" in record and record["conversations"] is not None:
        raw = record["conversations"]
        if not isinstance(raw, list):
            raise ValueError("'conversations' must be a list")
        messages = []
        for index, turn in enumerate(raw):
            if not isinstance(turn, dict):
                raise ValueError(f"conversations[{index}] is not an object")
            speaker = turn.get("from", turn.get("role"))
            value = turn.get("value", turn.get("content"))
            role = SHAREGPT_ROLES.get(str(speaker).lower()) if speaker is not None else None
            if role is None:
                raise ValueError(f"conversations[{index}] has unknown speaker {speaker!r}")
            if not isinstance(value, str):
                raise ValueError(f"conversations[{index}].value must be a string")
            messages.append({"role": role, "content": value})
    elif "prompt" in record and record["prompt"] is not None:
        if not isinstance(record["prompt"], str):
            raise ValueError("'prompt' must be a string")
        messages = [{"role": "user", "content": record["prompt"]}]
    else:
        raise ValueError("no 'messages', 'conversations' or 'prompt' field")
    field = "messages" if "messages" in record and record["messages"] is not None else "conversations"
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()  # ShareGPT data ends with the answer: it is regenerated, never rejected
    if not messages:
        raise ValueError("empty conversation (nothing left to answer)")
    _check_turns(messages, field)
    if messages[-1]["role"] not in ("user", "tool"):
        raise ValueError(f"conversation ends with a {messages[-1]['role']} turn, not a user turn")
    if not messages[-1]["content"].strip():
        raise ValueError("the last user message is empty")
    if "\x00" in "".join(m["content"] for m in messages):
        raise ValueError("text contains NUL characters")
    return tuple(messages)


def _check_turns(messages: list[dict[str, str]], field: str) -> None:
    """Turn order a chat template cannot render sensibly: a tool result nobody asked for, an empty question."""
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            before = next((m["role"] for m in reversed(messages[:index]) if m["role"] != "tool"), None)
            if before != "assistant":
                raise ValueError(
                    f"{field}[{index}] is a tool turn without a preceding assistant turn "
                    f"(it follows {'the start' if before is None else f'a {before} turn'})"
                )
        elif role == "user" and not message["content"].strip() and index < len(messages) - 1:
            raise ValueError(f"{field}[{index}] is an empty user turn")


def row_category(record: dict[str, Any], field: str | None = None) -> str | None:
    """The row's category: the named ``field``, else the first of CATEGORY_FIELDS present. A scalar becomes
    text (cut to CATEGORY_MAX_CHARS); a missing, empty or structured value is no category, never a rejection:
    the category only groups the figures."""
    names = (field,) if field else CATEGORY_FIELDS
    for name in names:
        value = record.get(name)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value).strip()
            if text:
                return text[:CATEGORY_MAX_CHARS]
    return None


def normalize_record(
    record: Any, row: int, raw_text: str | None = None, category_field: str | None = None
) -> PromptRow | RejectedRow:
    raw = raw_text if raw_text is not None else json.dumps(record, ensure_ascii=False, default=str)
    if not isinstance(record, dict):
        return RejectedRow(row, None, f"row is a JSON {type(record).__name__}, not an object", _truncate(raw))
    given_id = record.get("id")
    if (given_id is not None and not isinstance(given_id, (str, int))) or isinstance(given_id, bool):
        return RejectedRow(
            row, None, f"'id' must be a string or integer, got {type(given_id).__name__}", _truncate(raw)
        )
    if isinstance(given_id, str) and not given_id.strip():
        return RejectedRow(row, None, "'id' is empty", _truncate(raw))
    prompt_id = None if given_id is None else str(given_id)
    try:
        messages = _messages_from(record)
    except ValueError as exc:
        return RejectedRow(row, prompt_id, str(exc), _truncate(raw))
    return PromptRow(prompt_id or stable_id(messages), messages, row, row_category(record, category_field))


def check_prompt_source(value: str, *, allow_empty: bool = False) -> str:
    """A config validator for a ``prompts`` parameter: "synthetic" or an existing .jsonl/.parquet file.

    A relative path is resolved against the project root (``draftgen.paths``); the absolute path is returned.
    """
    if value == SYNTHETIC or (allow_empty and value == ""):
        return value
    path = resolve_path(value)
    try:
        _check_path(path)
    except PromptFileError as exc:
        raise ValueError(
            f"{exc}{root_note(value)} (give a .jsonl/.parquet path, or 'synthetic' for the bundled set)"
        ) from None
    return str(path)


def prompt_source_path(value: str) -> Path:
    """The file behind a ``prompts`` parameter ("synthetic" and "" name the bundled set)."""
    return BUNDLED_PROMPTS if value in ("", SYNTHETIC) else Path(value)


def _check_path(path: Path) -> None:
    if not path.exists():
        raise PromptFileError(f"prompt file {path} does not exist")
    if path.is_dir():
        raise PromptFileError(f"prompt file {path} is a directory")
    if path.suffix not in (".jsonl", ".parquet"):
        raise PromptFileError(f"prompt file {path} must be .jsonl or .parquet")


def _iter_jsonl(path: Path, category_field: str | None) -> Iterator[PromptRow | RejectedRow]:
    with open(path, "rb") as handle:
        for row, line in enumerate(handle, start=1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield RejectedRow(
                    row,
                    None,
                    f"not valid UTF-8 ({exc.reason} at byte {exc.start})",
                    _truncate(line.decode("utf-8", "replace")),
                )
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                yield RejectedRow(
                    row, None, f"invalid JSON: {exc.msg} at column {exc.colno}", _truncate(text.strip())
                )
                continue
            yield normalize_record(record, row, text.strip(), category_field)


def _iter_parquet(path: Path, category_field: str | None) -> Iterator[PromptRow | RejectedRow]:
    try:
        frames = pl.scan_parquet(path).collect_batches(chunk_size=PARQUET_BATCH_ROWS)
        row = 0
        for frame in frames:
            for record in frame.iter_rows(named=True):
                row += 1
                yield normalize_record(
                    {k: v for k, v in record.items() if v is not None}, row, category_field=category_field
                )
    except (pl.exceptions.ComputeError, OSError) as exc:
        raise PromptFileError(f"prompt file {path} is not readable parquet: {exc}") from exc


def iter_prompts(
    path: str | Path,
    shard: tuple[int, int] | None = None,
    category_field: str | None = None,
    keep_duplicates: bool = False,
) -> Iterator[PromptRow | RejectedRow]:
    """Stream normalized rows; ``shard=(index, count)`` keeps one part; ``category_field`` names the field rows
    carry their category in (default: the first of CATEGORY_FIELDS).

    A row with an id seen earlier is rejected ("duplicate id"), and so, unless ``keep_duplicates``, is a row whose
    conversation (``duplicate_key``) the file held earlier under another id ("duplicate of ID"): the first is
    kept. Both are decided over the whole file in file order, before the shard is taken, so every shard, every
    resume and validate's coverage reach the same decision; a shard yields the rejections of its own ids only.
    Memory: one hash per id, and one hash and the first id per distinct conversation.
    """
    path = Path(path)
    _check_path(path)
    rows = (
        _iter_jsonl(path, category_field) if path.suffix == ".jsonl" else _iter_parquet(path, category_field)
    )
    seen: set[int] = set()
    first_with: dict[int, str] = {}  # duplicate_key → the id that carried the conversation first
    for item in rows:
        if not isinstance(item, PromptRow):
            yield item
            continue
        mine = shard is None or shard_of(item.id, shard[1]) == shard[0]
        rejected = None
        key = hash(item.id)
        if key in seen:
            rejected = f"duplicate id {item.id!r} (first occurrence kept)"
        else:
            seen.add(key)
            if not keep_duplicates:
                first = first_with.setdefault(duplicate_key(item), item.id)
                if first != item.id:
                    rejected = f"{DUPLICATE_OF}{first} (the same conversation; the first is kept)"
        if not mine:
            continue
        if rejected is not None:
            yield RejectedRow(
                item.row, item.id, rejected, _truncate(json.dumps(item.messages, ensure_ascii=False))
            )
            continue
        yield item


def count_rows(path: str | Path) -> int:
    """Number of non-blank rows (for progress bars), without parsing them."""
    path = Path(path)
    _check_path(path)
    if path.suffix == ".parquet":
        return int(pl.scan_parquet(path).select(pl.len()).collect().item())
    count = 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                count += 1
    return count
