"""Prompt files → normalized prompt rows, streamed, with malformed rows set aside (never raised mid-run).

Accepted row shapes (docs/design.md#prompt-rows): ``{"id"?, "messages": [...], "tools"?, "system"?}`` in OpenAI's
shape (tool calls, tool results, names and content-part lists included), ShareGPT ``{"id"?, "conversations":
[{"from", "value"}, ...], "tools"?, "system"?}`` (``function_call`` / ``observation`` turns too) and ``{"id"?,
"prompt": "..."}``. Every value that changes what the model sees reaches the normalized row; what cannot be rendered
faithfully rejects the row with the field named; every other field is reported by name (``PromptRow.ignored``,
counted in generate's preflight). Trailing assistant turns are dropped (we regenerate them; ShareGPT rows always end
with one, so they are never a reason to reject). A missing id becomes a stable hash of what the model sees. A
conversation the file already held under another id is rejected as "duplicate of ID" unless duplicates are kept
(docs/design.md#prompt-rows).
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
from draftgen.prompts.bundled import BUNDLED_PROMPTS
from draftgen.training.tools import ToolFormatError, normalize_calls, normalize_tools, tool_names

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
    "function_call": "assistant",  # LLaMA-Factory's ShareGPT: a call (value: JSON of one call or a list of them)
    "observation": "tool",  # ... and the tool's result
}
SHAREGPT_CALL = "function_call"
# A message's keys the reader uses besides role and content, kept in the normalized message when given.
MESSAGE_FIELDS = ("name", "tool_calls", "tool_call_id")
SYSTEM_FIELDS = ("system", "system_prompt")  # a row-level system prompt, under its common names
TEXT_PART_TYPES = ("text", "input_text")
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
    # OpenAI shape: role and content, and name / tool_calls / tool_call_id where given (training.tools)
    messages: tuple[dict[str, Any], ...]
    row: int  # 1-based row (JSONL line) number in the source file
    category: str | None = None  # the row's category or source field, when it has one (CATEGORY_FIELDS)
    # With a sampling plan (draftgen.sampling_plan) each row is one sample: ``id`` is the sample's,
    # ``prompt_id`` the prompt's, ``arm`` and ``sample`` say which; None without a plan.
    prompt_id: str | None = None
    arm: str | None = None
    sample: int | None = None
    # The row's tool schemas (training.tools), sent with every turn of the conversation; None without tools.
    tools: tuple[dict[str, Any], ...] | None = None
    # Fields of the row the reader did not use, by name ("metadata", "messages[].reasoning_content"): counted in
    # preflight, never dropped without a word.
    ignored: tuple[str, ...] = ()


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
_NOT_SEEN_BY_THE_MODEL = frozenset({"id", "row", "category", "prompt_id", "arm", "sample", "ignored"})


def conversation_digest(value: Any, size: int = 8) -> bytes:
    """blake2b of a JSON value (keys sorted): the one hash of conversation content (ids, duplicates, the audit)."""
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(blob, digest_size=size).digest()


def stable_id(messages: tuple[dict[str, Any], ...], tools: tuple[dict[str, Any], ...] | None = None) -> str:
    """A hash of everything the model sees: the messages and, where there are any, the tool schemas (so a row's id
    changes when its tools do; rows without tools keep the ids they always had)."""
    content: Any = messages if tools is None else {"messages": messages, "tools": tools}
    return "h-" + conversation_digest(content, 10).hex()


def duplicate_key(row: PromptRow) -> int:
    """What makes two rows the same prompt: every field the model sees (the normalized messages, the tools, and any
    field that later reaches the request), hashed; the id, row number, category, ignored fields and sample are not
    part of it."""
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


def _text(value: Any, where: str, *, nullable: bool = False) -> str:
    """A message's content as text: a string; a list of text parts, joined with nothing between them (as Qwen's
    templates render consecutive text parts); or, for an assistant message that calls tools, null ("")."""
    if isinstance(value, str):
        return value
    if value is None and nullable:
        return ""
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind is None or kind in TEXT_PART_TYPES:
                raise ValueError(f"{where}[{index}] is not a text part ({{'type': 'text', 'text': ...}})")
            else:
                raise ValueError(
                    f"{where}[{index}] is a {kind!r} part: draftgen regenerates text conversations, and the target "
                    "would answer without it"
                )
        return "".join(texts)
    raise ValueError(f"{where} must be a string or a list of text parts, got {type(value).__name__}")


def _fields(raw: dict[str, Any], message: dict[str, Any], where: str) -> None:
    """The message's name, tool calls and tool-call id, into ``message`` where given."""
    role = message["role"]
    for key in MESSAGE_FIELDS:
        value = raw.get(key)
        if value is None:
            continue
        if key == "tool_calls":
            if role != "assistant":
                raise ValueError(
                    f"{where}.tool_calls on a {role} message: only assistant messages call tools"
                )
            calls = normalize_calls(value, f"{where}.tool_calls")
            if calls:
                message["tool_calls"] = list(calls)
        elif not isinstance(value, str):
            raise ValueError(f"{where}.{key} must be a string, got {type(value).__name__}")
        elif key == "tool_call_id" and role != "tool":
            raise ValueError(f"{where}.tool_call_id on a {role} message: only tool results carry one")
        else:
            message[key] = value


def _message(raw: Any, where: str) -> tuple[dict[str, Any], set[str]]:
    """One OpenAI-shaped message, and the keys of it the reader did not use."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not an object")
    role = raw.get("role")
    if role not in ROLES:
        raise ValueError(f"{where} has unknown role {role!r} (expected one of {', '.join(ROLES)})")
    calls = role == "assistant" and bool(raw.get("tool_calls"))
    message = {"role": role, "content": _text(raw.get("content"), f"{where}.content", nullable=calls)}
    _fields(raw, message, where)
    used = {"role", "content", *MESSAGE_FIELDS}
    return message, {k for k, v in raw.items() if k not in used and v is not None}


def _sharegpt_turn(raw: Any, where: str) -> tuple[dict[str, Any], set[str]]:
    """One ShareGPT turn (``from``/``value``, or ``role``/``content``), and the keys of it the reader did not use."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not an object")
    speaker_key = "from" if "from" in raw else "role"
    value_key = "value" if "value" in raw else "content"
    speaker, value = raw.get(speaker_key), raw.get(value_key)
    role = SHAREGPT_ROLES.get(str(speaker).lower()) if speaker is not None else None
    if role is None:
        raise ValueError(f"{where} has unknown speaker {speaker!r}")
    if str(speaker).lower() == SHAREGPT_CALL:
        calls = normalize_calls(value, f"{where}.{value_key}")
        if not calls:
            raise ValueError(f"{where} is a function_call turn without a call")
        message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": list(calls)}
    else:
        calls = role == "assistant" and bool(raw.get("tool_calls"))
        message = {"role": role, "content": _text(value, f"{where}.{value_key}", nullable=calls)}
        _fields(raw, message, where)
    used = {speaker_key, value_key, *MESSAGE_FIELDS}
    return message, {k for k, v in raw.items() if k not in used and v is not None}


def _system_prompt(record: dict[str, Any]) -> str | None:
    """A row-level system prompt (``system`` or ``system_prompt``); None when there is none (or it is empty)."""
    given = {name: record[name] for name in SYSTEM_FIELDS if record.get(name) is not None}
    for name, value in given.items():
        if not isinstance(value, str):
            raise ValueError(f"'{name}' must be a string, got {type(value).__name__}")
    if len(set(given.values())) > 1:
        raise ValueError("'system' and 'system_prompt' differ: give the row one system prompt")
    return next(iter(given.values()), None) or None


def _conversation(record: dict[str, Any]) -> tuple[str, list[dict[str, Any]], set[str]]:
    """(the field read, its messages, the message keys not used as 'field[].key')."""
    ignored: set[str] = set()
    if record.get("messages") is not None:
        field, raw, read = "messages", record["messages"], _message
    elif record.get("conversations") is not None:
        field, raw, read = "conversations", record["conversations"], _sharegpt_turn
    elif record.get("prompt") is not None:
        return "prompt", [{"role": "user", "content": _text(record["prompt"], "'prompt'")}], ignored
    else:
        raise ValueError("no 'messages', 'conversations' or 'prompt' field")
    if not isinstance(raw, list):
        raise ValueError(f"'{field}' must be a list")
    messages = []
    for index, item in enumerate(raw):
        message, unused = read(item, f"{field}[{index}]")
        messages.append(message)
        ignored |= {f"{field}[].{key}" for key in unused}
    return field, messages, ignored


def source_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's conversation normalized as generate reads it (roles, system fields), its trailing assistant turns
    kept: the answers the prompt file brought, which the closed loop trains its comparison arm on (ValueError: not
    a conversation)."""
    _, messages, _ = _conversation(record)
    system = _system_prompt(record)
    if system is not None and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _messages_from(
    record: dict[str, Any], tools: tuple[dict[str, Any], ...] | None
) -> tuple[tuple[dict[str, Any], ...], str, set[str]]:
    """Normalize one record's conversation or raise ValueError with the reason; (messages, the field read, the
    message keys not used)."""
    field, messages, ignored = _conversation(record)
    system = _system_prompt(record)
    if system is not None:
        if messages and messages[0]["role"] == "system":
            if messages[0]["content"] != system:
                name = next(n for n in SYSTEM_FIELDS if record.get(n) is not None)
                raise ValueError(
                    f"'{name}' and {field}[0] (a system message) differ: give the row one system prompt"
                )
        else:
            messages.insert(0, {"role": "system", "content": system})
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()  # ShareGPT data ends with the answer: it is regenerated, never rejected
    if not messages:
        raise ValueError("empty conversation (nothing left to answer)")
    _check_turns(messages, field, tools)
    if messages[-1]["role"] not in ("user", "tool"):
        raise ValueError(f"conversation ends with a {messages[-1]['role']} turn, not a user turn")
    if messages[-1]["role"] == "user" and not messages[-1]["content"].strip():
        raise ValueError("the last user message is empty")
    if "\x00" in "".join(m["content"] + m.get("name", "") for m in messages):
        raise ValueError("text contains NUL characters")
    return tuple(messages), field, ignored


def _check_turns(
    messages: list[dict[str, Any]], field: str, tools: tuple[dict[str, Any], ...] | None
) -> None:
    """Turn order a chat template cannot render sensibly: a tool result nobody asked for, a call nobody answered, a
    call to a function the row does not offer, an empty question."""
    offered = tool_names(tools)
    index = 0
    while index < len(messages):
        message, role = messages[index], messages[index]["role"]
        if role == "tool":
            before = messages[index - 1]["role"] if index else None
            raise ValueError(
                f"{field}[{index}] is a tool turn without a preceding assistant tool call "
                f"(it follows {_after(before)})"
            )
        if role == "user" and not message["content"].strip() and index < len(messages) - 1:
            raise ValueError(f"{field}[{index}] is an empty user turn")
        if role == "assistant" and message.get("tool_calls"):
            if index and messages[index - 1]["role"] == "assistant":
                raise ValueError(
                    f"{field}[{index}] calls tools right after another assistant turn: the target answers once per "
                    "turn; merge the two messages"
                )
            end = index + 1
            while end < len(messages) and messages[end]["role"] == "tool":
                end += 1
            _check_calls(messages, index, end, field, offered, tools is not None)
            index = end
            continue
        index += 1


def _after(role: str | None) -> str:
    if role is None:
        return "the start"
    return f"{'an' if role == 'assistant' else 'a'} {role} turn" + (
        " without tool calls" if role == "assistant" else ""
    )


def _check_calls(
    messages: list[dict[str, Any]], at: int, end: int, field: str, offered: frozenset[str], has_tools: bool
) -> None:
    """The calls of ``messages[at]`` are functions the row offers, each answered by one of ``messages[at+1:end]``:
    by ``tool_call_id`` where the calls carry ids, else by position."""
    calls, results = messages[at]["tool_calls"], messages[at + 1 : end]
    for number, call in enumerate(calls):
        name = call["function"]["name"]
        if name not in offered:
            offer = f"its tools offer {', '.join(sorted(offered))}" if has_tools else "the row has no 'tools'"
            raise ValueError(
                f"{field}[{at}].tool_calls[{number}] calls {name!r}, which {offer}: the target is never offered it"
            )
    if not results:
        raise ValueError(f"{field}[{at}] calls {len(calls)} tool(s) and no tool result follows")
    ids = [call.get("id") for call in calls]
    answered = [result.get("tool_call_id") for result in results]
    if any(i is None for i in ids):
        if any(i is not None for i in ids):
            raise ValueError(
                f"{field}[{at}]: some tool calls carry an id and some do not; give every call an id"
            )
        if any(a is not None for a in answered):
            raise ValueError(
                f"{field}[{at + 1}..{end - 1}]: the results carry tool_call_id but the calls of {field}[{at}] have no id"
            )
        if len(results) != len(calls):
            raise ValueError(
                f"{field}[{at}] makes {len(calls)} call(s) without ids and {len(results)} result(s) follow: results "
                "are matched to calls by position, so their numbers must be equal"
            )
        return
    if len(set(ids)) != len(ids):
        raise ValueError(f"{field}[{at}]: two tool calls share an id")
    for offset, call_id in enumerate(answered):
        if call_id not in ids:
            raise ValueError(
                f"{field}[{at + 1 + offset}].tool_call_id {call_id!r} answers no call of {field}[{at}]"
            )
    if sorted(answered) != sorted(ids):
        missing = sorted(set(ids) - set(answered))
        raise ValueError(
            f"{field}[{at}]: every call needs exactly one result (unanswered or answered twice: "
            f"{missing or sorted(answered)})"
        )


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


def _ignored(
    record: dict[str, Any], field: str, category_field: str | None, messages: set[str]
) -> tuple[str, ...]:
    """The row's fields that reach neither the request nor the row's identity: counted by name in preflight."""
    used = {"id", "tools", field, *SYSTEM_FIELDS, *CATEGORY_FIELDS}
    if category_field:
        used.add(category_field)
    top = {k for k, v in record.items() if k not in used and v is not None}
    return tuple(sorted(top | messages))


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
        tools = normalize_tools(record.get("tools"))
        messages, field, unused = _messages_from(record, tools)
    except (ValueError, ToolFormatError) as exc:
        return RejectedRow(row, prompt_id, str(exc), _truncate(raw))
    return PromptRow(
        prompt_id or stable_id(messages, tools),
        messages,
        row,
        row_category(record, category_field),
        tools=tools,
        ignored=_ignored(record, field, category_field, unused),
    )


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
