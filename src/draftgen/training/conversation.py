"""Where a conversation's answers go, what each answer request sends, and the finished conversation (pure).

The one place that puts a prompt's source messages and the target model's generated answers together
(docs/design.md#multi-turn-conversations, issue 10). generate asks ``answer_points`` where to answer and
``request_messages`` what to send for each answer; validate and export call ``assemble`` on a stored row.

A stored row keeps the normalized *source* conversation in ``messages`` (role and content; the other fields of each
message, its tool calls, tool-call id and name, in ``message_extras``: ``message_columns`` writes them and
``stored_messages`` is the one reader) and, per generated turn i, the index ``turn_after[i]`` of the last source
message before that answer, with the answer's text in ``turn_content[i]`` / ``turn_reasoning[i]`` and its tool calls
in ``turn_tool_calls[i]``. With ``turns_mode`` "all" every source assistant message is replaced: the target answers
after every user (or tool) run that the source followed with an assistant message, and at the end. With "last" only
the end is answered and source assistant messages stay in the history (text the target did not write:
``Turn.generated`` is False). Rows from shards written before these columns existed are single-turn "last" rows.

Agentic conversations (docs/generate.md#agentic-conversations): where the source answered a turn with tool calls and
then gives their results, the target's answer replaces the source's, and the results go on only when the target
asked for the same thing (``follow_up``: same functions and arguments, any order); they are then re-addressed to the
target's call ids, in the target's call order. Otherwise the conversation ends at that turn (a ``Divergence``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from draftgen.training.tools import export_calls, history_calls, match_calls

MODES = ("all", "last")
ANSWERED_ROLES = ("user", "tool")  # a run of messages holding one of these gets an answer
EXTRA_FIELDS = ("tool_calls", "tool_call_id", "name")  # a message's fields beyond role and content


@dataclass(frozen=True)
class Turn:
    """One message of an assembled conversation."""

    role: str  # system, user, assistant, tool
    content: str
    reasoning_content: str | None = None  # a generated answer's reasoning ("" if none); None otherwise
    generated: bool = False  # True only for assistant text the target model wrote in this run
    turn: int | None = None  # for a generated answer: its index in the row's turn_* columns
    # an assistant message's calls (a generated answer's: the target's)
    tool_calls: tuple[dict[str, Any], ...] = ()
    # a tool result: the call it answers (re-addressed to the target's when spliced)
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Answer:
    """A generated turn as later requests and the assembled conversation carry it: its answer and its calls."""

    content: str | None
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Divergence:
    """The target's answer at ``turn`` (after source message ``after``) did not ask for what the source's did, so the
    source's next messages (tool results, or a reply to a text answer) do not follow from it: the conversation ends
    there (docs/generate.md#agentic-conversations)."""

    turn: int
    after: int
    reason: str
    original: tuple[dict[str, Any], ...]
    target: tuple[dict[str, Any], ...]

    def as_json(self, turns_left: int = 0) -> str:
        """The stored row's ``tool_divergence``: turn, after, reason, both call lists (arguments as JSON strings) and
        the source's answer points after it that were not generated."""
        return json.dumps(
            {
                "turn": self.turn,
                "after": self.after,
                "reason": self.reason,
                "original": export_calls(self.original),
                "target": export_calls(self.target),
                "turns_left": turns_left,
            },
            ensure_ascii=False,
        )


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


def source_reply(messages: Sequence[Mapping[str, Any]], after: int) -> Mapping[str, Any] | None:
    """The source's assistant message right after answer point ``after``: what ``follow_up`` compares the target's
    answer with (None: the source says nothing more there, so nothing is compared)."""
    if after + 1 >= len(messages) or messages[after + 1]["role"] != "assistant":
        return None
    return messages[after + 1]


def compared_points(messages: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
    """The answer points (mode ``all``) the source followed with an assistant message: where ``follow_up`` compares
    the target's answer with the source's, so an agentic conversation can diverge (every point but the last)."""
    return tuple(p for p in answer_points(messages, "all") if source_reply(messages, p) is not None)


def source_answers(messages: Sequence[Mapping[str, Any]], points: Sequence[int]) -> dict[int, Answer]:
    """For each answer point, the source's assistant text and tool calls after it: what stands in for a regenerated
    answer before the target wrote one (with the source's calls, its tool results follow as they will when the
    target asks the same)."""
    answers = {}
    for point in points:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for message in messages[point + 1 :]:
            if message["role"] != "assistant":
                break
            texts.append(str(message["content"] or ""))
            calls += list(message.get("tool_calls") or ())
        answers[point] = Answer("\n\n".join(texts), tuple(calls))
    return answers


def _names(calls: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(str(c["function"]["name"]) for c in calls)


def follow_up(
    messages: Sequence[Mapping[str, Any]],
    after: int,
    calls: Sequence[Mapping[str, Any]],
    turn: int = 0,
    cut: str | None = None,
) -> tuple[list[dict[str, Any]], Divergence | None]:
    """What the source says after the target answered at ``after`` (with ``calls``), mode ``all``.

    Returns (the source's tool results for that turn re-addressed to the target's calls, None) when the conversation
    can go on: the target asked for exactly what the source's assistant message did (``match_calls``: same names,
    same arguments as parsed JSON, any order), or neither called. The results come in the target's call order, each
    with ``tool_call_id`` set to the target's id for the call it answers (matched by the source's ids, else by
    position). Otherwise ([], a Divergence): the target called where the source answered in text, answered in text
    where the source called (``cut``: the finish reason of an answer that ended before its stop token, named in the
    reason), or called for something else. After the final message nothing follows: ([], None)."""
    source = source_reply(messages, after)
    if source is None:
        return [], None
    original = tuple(source.get("tool_calls") or ())
    target = tuple(calls)
    if not original and not target:
        return [], None
    pairs = match_calls(original, target)
    if pairs is None:
        if not original:
            reason = f"the target called {_names(target)} where the source answered in text"
        elif not target and cut:
            reason = f"the target's answer ended ({cut}) before it called {_names(original)}"
        elif not target:
            reason = f"the target answered without calling {_names(original)}"
        else:
            reason = (
                f"the target called {_names(target)} with other arguments or functions than the source's "
                f"{_names(original)}"
            )
        return [], Divergence(turn, after, reason, original, target)
    start = after + 2
    results = list(messages[start : start + len(original)])
    by_id = {r.get("tool_call_id"): r for r in results if r.get("tool_call_id") is not None}
    spliced = []
    for source_index, target_index in pairs:
        call_id = original[source_index].get("id")
        result = dict(by_id[call_id] if call_id is not None else results[source_index])
        target_id = target[target_index].get("id")
        result.pop("tool_call_id", None)
        if target_id is not None:
            result["tool_call_id"] = target_id
        spliced.append(result)
    return spliced, None


def _message(source: Mapping[str, Any]) -> dict[str, Any]:
    """A source message as a request or an assembled conversation carries it (calls' arguments as JSON objects)."""
    out = {"role": str(source["role"]), "content": str(source.get("content") or "")}
    for key in EXTRA_FIELDS:
        value = source.get(key)
        if value:
            out[key] = history_calls(value) if key == "tool_calls" else value
    return out


def _history(
    messages: Sequence[Mapping[str, Any]], end: int, answers: Mapping[int, Answer], mode: str
) -> list[tuple[dict[str, Any] | None, int | None]]:
    """Source messages ``0..end`` interleaved with ``answers`` (answer point → answer), as (message, None) or
    (None, answer point) pairs. Mode ``last`` keeps the source's assistant messages (and their results) as given;
    mode ``all`` leaves them out and puts each answer's re-addressed results (``follow_up``) where the source's were.
    ValueError where an answer before ``end`` diverged: a conversation never continues past a divergence."""
    replaced: dict[int, list[dict[str, Any]]] = {}  # first result index → the results in the target's order
    skipped: set[int] = set()
    if mode == "all":
        for point, answer in answers.items():
            if point >= end:
                continue
            results, divergence = follow_up(messages, point, answer.tool_calls)
            if divergence is not None:
                raise ValueError(
                    f"the answer after message {point} diverged from the source ({divergence.reason}); the "
                    "conversation cannot continue past it"
                )
            if results:
                replaced[point + 2] = results
                skipped.update(range(point + 2, point + 2 + len(results)))
    out: list[tuple[dict[str, Any] | None, int | None]] = []
    for index in range(end + 1):
        message = messages[index]
        if index in replaced:
            out.extend((result, None) for result in replaced[index])
        elif index not in skipped and (message["role"] != "assistant" or mode == "last"):
            out.append((_message(message), None))
        if index in answers:
            out.append((None, index))
    return out


def _answer(answer: Answer | str | None) -> Answer:
    return answer if isinstance(answer, Answer) else Answer(answer)


def request_messages(
    messages: Sequence[Mapping[str, Any]],
    turn_after: int,
    earlier_answers: Sequence[tuple[int, Answer | str | None]],
    mode: str = "all",
) -> tuple[dict[str, Any], ...]:
    """The chat messages sent to ask for the answer after ``messages[turn_after]``.

    ``earlier_answers`` are this conversation's earlier generated turns as (turn_after, answer) pairs, in order (an
    answer is an ``Answer`` or its content alone). They go in as assistant messages holding the content and the
    target's tool calls, not the reasoning: Qwen3 chat templates render earlier assistant turns without their
    reasoning at inference, so the request carries what the model would see in a real chat. In mode ``all`` the
    source's assistant messages are left out (the target's own answers replace them) and the source's tool results
    follow the target's calls (``follow_up``); in ``last`` they are sent as given (there are no earlier generated
    answers then). Tool-call arguments are JSON objects (``training.tools.wire_messages`` makes the wire's strings).
    """
    _check_mode(mode)
    if not 0 <= turn_after < len(messages):
        raise ValueError(f"turn_after {turn_after} is outside the conversation's {len(messages)} messages")
    answers: dict[int, Answer] = {}
    for point, answer in earlier_answers:
        if not 0 <= point < turn_after or point in answers:
            raise ValueError(
                f"earlier answer after message {point} does not come before turn_after {turn_after} exactly once"
            )
        answers[point] = _answer(answer)
    if mode == "last" and answers:
        raise ValueError("mode 'last' generates one answer: there are no earlier answers to send")
    out = []
    for message, point in _history(messages, turn_after, answers, mode):
        if message is not None:
            out.append(message)
        else:
            answer = answers[point]
            turn = {"role": "assistant", "content": answer.content or ""}
            if answer.tool_calls:
                turn["tool_calls"] = history_calls(answer.tool_calls)
            out.append(turn)
    return tuple(out)


# ----- the stored row ----------------------------------------------------------------------------------------------
def message_columns(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, str]], list[str | None] | None]:
    """A conversation as the stored row keeps it: ``messages`` (role, content) and ``message_extras`` (per message,
    its other fields as a JSON object, or null; the whole list null when no message has any)."""
    plain = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]
    extras = []
    for message in messages:
        fields = {k: message[k] for k in EXTRA_FIELDS if message.get(k)}
        extras.append(json.dumps(fields, ensure_ascii=False) if fields else None)
    return plain, (extras if any(e is not None for e in extras) else None)


def stored_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The source conversation of a stored row (``messages`` with ``message_extras`` put back): the one reader."""
    extras = row.get("message_extras")
    out = []
    for index, message in enumerate(row["messages"]):
        item = {"role": message["role"], "content": message["content"] or ""}
        extra = extras[index] if extras is not None and index < len(extras) else None
        if extra:
            item.update(json.loads(extra))
        out.append(item)
    return out


def stored_tools(row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A stored row's tool schemas (column ``tools``, a JSON string), or None."""
    text = row.get("tools")
    return json.loads(text) if text else None


def encode_calls(calls: Sequence[Mapping[str, Any]]) -> str | None:
    """One turn's calls as the stored row's ``turn_tool_calls`` element (null: the turn called nothing)."""
    return json.dumps(list(calls), ensure_ascii=False) if calls else None


def generated_calls(row: Mapping[str, Any], turns: int) -> list[tuple[dict[str, Any], ...]]:
    """Each generated turn's tool calls (empty where it called nothing, or in rows written before tool calls); a row
    without ``turn_after`` (a training row of one turn) keeps its answer's calls in ``tool_calls``."""
    if row.get("turn_after") is None:
        single = row.get("tool_calls")
        return [tuple(json.loads(single)) if single else ()]
    values = row.get("turn_tool_calls")
    if values is None:
        return [()] * turns
    return [tuple(json.loads(v)) if v else () for v in values]


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

    ``row`` is a mapping with ``messages`` (and ``message_extras``) and, for rows written by multi-turn generate,
    ``turn_after``, ``turn_content``, ``turn_reasoning``, ``turn_tool_calls`` and ``turns_mode`` (a polars row as a
    dict works). Rows without ``turn_after`` (older shards) hold one generated answer after the last message
    (``content`` / ``reasoning_content``), mode 'last'. In mode 'all' no source assistant text is returned, and the
    source's tool results follow the target's calls they answer; in 'last' source assistant messages in the history
    come back with ``generated=False``. A row whose turn columns do not fit its messages raises ValueError naming the
    row's id.
    """
    messages = stored_messages(row)
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
    calls = generated_calls(row, len(points))
    if len(calls) != len(points):
        raise ValueError(f"row {name}: {len(calls)} turn_tool_calls for {len(points)} turns")
    answers = {p: Answer(contents[i], calls[i]) for i, p in enumerate(points)}
    turn_of = {p: i for i, p in enumerate(points)}
    try:
        history = _history(messages, len(messages) - 1, answers, mode)
    except ValueError as exc:
        raise ValueError(f"row {name}: {exc}") from None
    turns = []
    for message, point in history:
        if message is not None:
            turns.append(
                Turn(
                    role=message["role"],
                    content=message["content"],
                    tool_calls=tuple(message.get("tool_calls") or ()),
                    tool_call_id=message.get("tool_call_id"),
                    name=message.get("name"),
                )
            )
        else:
            turn = turn_of[point]
            turns.append(
                Turn(
                    role="assistant",
                    content=contents[turn] or "",
                    reasoning_content=reasonings[turn] or "",
                    generated=True,
                    turn=turn,
                    tool_calls=calls[turn],
                )
            )
    return turns
