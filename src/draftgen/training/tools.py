"""Tool schemas and tool calls in one canonical form, and the one rule that says whether the target's calls are the
original's (pure; docs/design.md#prompt-rows, docs/generate.md#agentic-conversations).

Canonical forms, as every part of draftgen holds them in memory:

* a **tool schema**: OpenAI's ``{"type": "function", "function": {"name", "description"?, "parameters"?, ...}}``,
  its keys in the order given. A bare ``{"name", ...}`` (the form glaive / LLaMA-Factory rows use) is wrapped, because
  SGLang accepts only the wrapped form (its ``Tool`` model requires ``function``) and renders what it accepted.
* a **source tool call** (an assistant message of a prompt row): ``{"id"?, "type": "function", "function": {"name",
  "arguments"}}`` with ``arguments`` a JSON *object* (a dict). Rows give it as an object or as a JSON string; both
  become the dict, because that is what the chat template renders: SGLang parses a string argument to a dict before
  rendering (``normalize_assistant_tool_call_arguments``, strict: not a JSON object → refused) and so does
  SpecForge 0.2.0's parser (``Parser._sanitize_message``). ``id`` is kept only where the row gave one.
* a **target call** (what the server answered): the same shape with ``arguments`` the *string* the server sent, kept
  as sent: it may not be valid JSON (validate flags that ``invalid_tool_arguments``).

On the wire (``wire_messages``) and in the export (``export_calls``) arguments are JSON strings, OpenAI's shape;
SpecForge parses them back (a column of dicts would be unified by Arrow's JSON reader, adding null keys).
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FUNCTION = "function"


class ToolFormatError(ValueError):
    """A tool schema or call that cannot be rendered faithfully; the message names the field."""


def _json_value(value: Any, field: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ToolFormatError(
                f"{field} is a string that is not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
    return value


def normalize_tools(value: Any, field: str = "tools") -> tuple[dict[str, Any], ...] | None:
    """A row's tool schemas in the canonical form; None when it has none. A JSON string is read too."""
    value = _json_value(value, field)
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise ToolFormatError(f"{field} must be a list of tool schemas, got {type(value).__name__}")
    tools = []
    for index, tool in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(tool, dict):
            raise ToolFormatError(f"{where} is not an object")
        if "function" in tool:
            kind = tool.get("type", FUNCTION)
            if kind != FUNCTION:
                raise ToolFormatError(f"{where}.type is {kind!r}: draftgen sends function tools only")
            function = tool["function"]
            wrapped = copy.deepcopy(tool)
        else:
            function = tool
            wrapped = {"type": FUNCTION, "function": copy.deepcopy(tool)}
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise ToolFormatError(f"{where} has no function name")
        tools.append(wrapped)
    return tuple(tools)


def tool_names(tools: Iterable[Mapping[str, Any]] | None) -> frozenset[str]:
    return frozenset(str(t["function"]["name"]) for t in tools or ())


def _arguments(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ToolFormatError(
                f"{field} is not valid JSON ({exc.msg} at column {exc.colno}): a call the template cannot render"
            ) from None
    if not isinstance(value, dict):
        raise ToolFormatError(f"{field} must be a JSON object, got {type(value).__name__}")
    return value


def normalize_calls(value: Any, field: str) -> tuple[dict[str, Any], ...]:
    """A source assistant message's tool calls in the canonical form (a list, or a JSON string of one; each call
    OpenAI's ``{"id", "type", "function": {"name", "arguments"}}`` or a flat ``{"name", "arguments"}``)."""
    value = _json_value(value, field)
    if value is None:
        return ()
    if isinstance(value, dict):
        value = [value]  # one call written as an object (ShareGPT function_call values)
    if not isinstance(value, list):
        raise ToolFormatError(f"{field} must be a list of calls, got {type(value).__name__}")
    calls = []
    for index, call in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(call, dict):
            raise ToolFormatError(f"{where} is not an object")
        kind = call.get("type", FUNCTION)
        if kind != FUNCTION:
            raise ToolFormatError(f"{where}.type is {kind!r}: draftgen renders function calls only")
        function = call.get("function", call)
        if not isinstance(function, dict):
            raise ToolFormatError(f"{where}.function is not an object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolFormatError(f"{where} has no function name")
        arguments = _arguments(function.get("arguments"), f"{where}.function.arguments")
        canonical: dict[str, Any] = {}
        if call.get("id") is not None:
            if not isinstance(call["id"], str):
                raise ToolFormatError(f"{where}.id must be a string")
            canonical["id"] = call["id"]
        canonical["type"] = FUNCTION
        canonical["function"] = {"name": name, "arguments": arguments}
        calls.append(canonical)
    return tuple(calls)


def target_calls(raw: Sequence[Mapping[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    """The server's calls (``message.tool_calls`` or the streamed ones, accumulated) as stored: id, name and the
    arguments string as sent (``""`` when none came)."""
    out = []
    for call in raw or ():
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
        out.append(
            {
                "id": call.get("id"),
                "type": FUNCTION,
                "function": {"name": function.get("name") or "", "arguments": arguments},
            }
        )
    return tuple(out)


def parsed_arguments(call: Mapping[str, Any]) -> dict[str, Any] | None:
    """A call's arguments as a JSON object, or None when they are not one (a target's malformed arguments)."""
    arguments = call["function"].get("arguments")
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None
    return None


def call_key(call: Mapping[str, Any]) -> tuple[str, str] | None:
    """What makes two calls the same request: the function's name and the arguments compared as parsed JSON."""
    arguments = parsed_arguments(call)
    if arguments is None:
        return None
    return str(call["function"]["name"]), json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def match_calls(
    original: Sequence[Mapping[str, Any]], target: Sequence[Mapping[str, Any]]
) -> list[tuple[int, int]] | None:
    """(original index, target index) pairs, in the target's order, when the target asked for exactly what the
    original asked for (same names, same arguments as parsed JSON, any order: a multiset match); else None. Two empty
    lists match (nothing to pair)."""
    if len(original) != len(target):
        return None
    waiting: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, call in enumerate(original):
        key = call_key(call)
        if key is None:
            return None
        waiting[key].append(index)
    pairs = []
    for index, call in enumerate(target):
        key = call_key(call)
        if key is None or not waiting.get(key):
            return None
        pairs.append((waiting[key].pop(0), index))
    return pairs


def history_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Calls as a later request's history (and the chat template) carries them: arguments as the JSON object where
    they are one (SGLang and SpecForge render the dict), else as given."""
    out = []
    for call in calls:
        arguments = parsed_arguments(call)
        item = {k: copy.deepcopy(v) for k, v in call.items() if k != "function" and v is not None}
        item["type"] = FUNCTION
        item["function"] = {
            "name": call["function"]["name"],
            "arguments": arguments if arguments is not None else call["function"].get("arguments"),
        }
        out.append(item)
    return out


def export_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Calls in OpenAI's and SpecForge's shape for a file: ``{"id", "type", "function": {"name", "arguments"}}``
    with the arguments a JSON string (a target's malformed arguments as sent)."""
    out = []
    for call in calls:
        arguments = call["function"].get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append(
            {
                "id": call.get("id") or "",
                "type": FUNCTION,
                "function": {"name": call["function"]["name"], "arguments": arguments},
            }
        )
    return out


def wire_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as an OpenAI request carries them: tool-call arguments as JSON strings (the server parses them back),
    absent fields left out."""
    out = []
    for message in messages:
        item = {k: v for k, v in message.items() if v is not None and k != "tool_calls"}
        if message.get("tool_calls"):
            item["tool_calls"] = export_calls(message["tool_calls"])
            for call, given in zip(item["tool_calls"], message["tool_calls"], strict=True):
                if given.get("id") is None:
                    del call["id"]
        out.append(item)
    return out
