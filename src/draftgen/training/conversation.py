"""Where a conversation's answers go, what each answer request sends, and the finished conversation (pure).

The one place that puts a prompt's source messages and the target model's generated answers together
(docs/design.md#multi-turn-conversations, issue 10). generate asks ``answer_points`` where to answer and
``request_messages`` what to send for each answer; validate and export call ``assemble`` on a stored row.

A stored row keeps the normalized *source* conversation in ``messages`` and, per generated turn i, the index
``turn_after[i]`` of the last source message before that answer, with the answer's text in ``turn_content[i]``
/ ``turn_reasoning[i]``. With ``turns_mode`` "all" every source assistant message is replaced: the target answers
after every user (or tool) run that the source followed with an assistant message, and at the end. With
"last" only the end is answered and source assistant messages stay in the history (text the target did not
write: ``Turn.generated`` is False). Rows from shards written before these columns existed are single-turn
"last" rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

MODES = ("all", "last")
ANSWERED_ROLES = ("user", "tool")  # a run of messages holding one of these gets an answer


@dataclass(frozen=True)
class Turn:
    """One message of an assembled conversation."""

    role: str  # system, user, assistant, tool
    content: str
    reasoning_content: str | None = None  # a generated answer's reasoning ("" if none); None otherwise
    generated: bool = False  # True only for assistant text the target model wrote in this run
    turn: int | None = None  # for a generated answer: its index in the row's turn_* columns


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"turns mode must be one of {', '.join(MODES)}, got {mode!r}")


def answer_points(messages: Sequence[Mapping[str, Any]], mode: str) -> tuple[int, ...]:
    """Indices of the source messages the target answers after, in order (the row's ``turn_after``).

    ``last``: only after the final message. ``all``: after every run of non-assistant messages that holds a user
    or tool message and is followed by an assistant message, and after the final message. An assistant message
    with no user or tool message before it since the previous one (a greeting after the system prompt) gets no
    answer point; in mode ``all`` it is dropped like every source assistant message.
    """
    _check_mode(mode)
    if not messages:
        raise ValueError("an empty conversation has nothing to answer")
    last = len(messages) - 1
    if messages[last]["role"] == "assistant":
        raise ValueError(
            "the conversation ends with an assistant message: drop trailing assistant turns first"
        )
    if mode == "last":
        return (last,)
    points = []
    asked = False  # the current run of non-assistant messages holds a user or tool message
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "assistant":
            asked = False
            continue
        asked = asked or role in ANSWERED_ROLES
        follows = messages[index + 1]["role"] if index < last else None
        if index == last or (follows == "assistant" and asked):
            points.append(index)
    return tuple(points)


def _history(
    messages: Sequence[Mapping[str, Any]], end: int, answers: Mapping[int, Any], keep_source_assistant: bool
) -> list[tuple[Mapping[str, Any] | None, Any]]:
    """Source messages ``0..end`` interleaved with ``answers`` (answer point → answer), as (source, answer)
    pairs where exactly one side is set; source assistant messages are left out unless ``keep_source_assistant``.
    """
    out: list[tuple[Mapping[str, Any] | None, Any]] = []
    for index in range(end + 1):
        message = messages[index]
        if message["role"] != "assistant" or keep_source_assistant:
            out.append((message, None))
        if index in answers:
            out.append((None, answers[index]))
    return out


def request_messages(
    messages: Sequence[Mapping[str, Any]],
    turn_after: int,
    earlier_answers: Sequence[tuple[int, str | None]],
    mode: str = "all",
) -> tuple[dict[str, str], ...]:
    """The chat messages sent to ask for the answer after ``messages[turn_after]``.

    ``earlier_answers`` are this conversation's earlier generated turns as (turn_after, content) pairs, in order.
    They go in as assistant messages holding the content only: Qwen3 chat templates render earlier assistant
    turns without their reasoning at inference, so the request carries what the model would see in a real chat.
    In mode ``all`` the source's assistant messages are left out (the target's own answers replace them); in
    ``last`` they are sent as given (there are no earlier generated answers then).
    """
    _check_mode(mode)
    if not 0 <= turn_after < len(messages):
        raise ValueError(f"turn_after {turn_after} is outside the conversation's {len(messages)} messages")
    answers: dict[int, str | None] = {}
    for point, content in earlier_answers:
        if not 0 <= point < turn_after or point in answers:
            raise ValueError(
                f"earlier answer after message {point} does not come before turn_after {turn_after} exactly once"
            )
        answers[point] = content
    if mode == "last" and answers:
        raise ValueError("mode 'last' generates one answer: there are no earlier answers to send")
    out = []
    for source, answer in _history(messages, turn_after, answers, keep_source_assistant=mode == "last"):
        if source is not None:
            out.append({"role": str(source["role"]), "content": str(source["content"])})
        else:
            out.append({"role": "assistant", "content": answer or ""})
    return tuple(out)


def generated_turns(row: Mapping[str, Any]) -> tuple[str, list[int], list[Any], list[Any]]:
    """(mode, turn_after, contents, reasonings) of a row; rows without ``turn_after`` are single-turn 'last'."""
    messages = row["messages"]
    points = row.get("turn_after")
    if points is None:
        return "last", [len(messages) - 1], [row.get("content")], [row.get("reasoning_content")]
    mode = row.get("turns_mode") or "last"
    contents = row.get("turn_content")
    reasonings = row.get("turn_reasoning")
    return mode, list(points), list(contents or []), list(reasonings or [])


def assemble(row: Mapping[str, Any]) -> list[Turn]:
    """A stored row as the conversation the trainer sees: source messages with the generated answers in place.

    ``row`` is a mapping with ``messages`` and, for rows written by multi-turn generate, ``turn_after``,
    ``turn_content``, ``turn_reasoning`` and ``turns_mode`` (a polars row as a dict works). Rows without
    ``turn_after`` (older shards) hold one generated answer after the last message (``content`` /
    ``reasoning_content``), mode 'last'. In mode 'all' no source assistant text is returned; in 'last' source
    assistant messages in the history come back with ``generated=False``. A row whose turn columns do not fit
    its messages raises ValueError naming the row's id.
    """
    messages = row["messages"]
    mode, points, contents, reasonings = generated_turns(row)
    name = row.get("id", "?")
    if mode not in MODES:
        raise ValueError(f"row {name}: turns_mode {mode!r} is not one of {', '.join(MODES)}")
    if not points or len(contents) != len(points) or len(reasonings) != len(points):
        raise ValueError(
            f"row {name}: {len(points)} turn_after entries, {len(contents)} turn_content, "
            f"{len(reasonings)} turn_reasoning — they must be equal and at least one"
        )
    if any(b <= a for a, b in pairwise(points)) or not (0 <= points[0] and points[-1] == len(messages) - 1):
        raise ValueError(
            f"row {name}: turn_after {points} must increase and end at the last of its {len(messages)} messages"
        )
    if any(messages[p]["role"] == "assistant" for p in points):
        raise ValueError(f"row {name}: turn_after {points} points at a source assistant message")
    answers = dict(zip(points, range(len(points)), strict=True))
    turns = []
    for source, turn in _history(messages, len(messages) - 1, answers, keep_source_assistant=mode == "last"):
        if source is not None:
            turns.append(Turn(role=str(source["role"]), content=str(source["content"] or "")))
        else:
            turns.append(
                Turn(
                    role="assistant",
                    content=contents[turn] or "",
                    reasoning_content=reasonings[turn] or "",
                    generated=True,
                    turn=turn,
                )
            )
    return turns
