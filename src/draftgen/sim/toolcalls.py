"""The simulated model's tool calls: when it calls, what it calls, and the text it writes for a call.

A request that carries ``tools`` and ends with a user message is answered with tool calls for a share of prompts
(``tool_call_rate``, all of them unless set; drawn from the request's seed: the same prompt calls on every server and
attempt); an answer
after tool results is text, as an agent's model answers once it has the results. What it calls is a rule anyone can
reproduce from the request (docs/simulator.md, "Tool calls"), so a test row's original calls can be written to match
the simulator's, or to differ from them, by construction:

* **which tools**: every tool a word of whose name (split at ``_``, words of 4 letters or more) the last user message
  mentions, in the order of ``tools``; the first tool when it mentions none. Several tools: parallel calls.
* **arguments**: each property of the tool's ``parameters`` in schema order: a string takes the message's last
  capitalized word (else its last word), an integer or number the first number in the message (else 1), a boolean
  true, an enum its first value, an array ``[the string]``, an object ``{}``.
* **divergence** (``tool_divergence_rate`` of the answers that call, a draw of their own): the first argument is
  changed (a string gets `` 2`` appended, a number 1 added, a boolean flipped; no arguments: ``{"again": true}``).

The call's text is Qwen3.5/3.6's format, exactly as draftgen's chat template renders the same call
(``data/qwen3_chat_template.jinja``), so the ids the server reports are the template's: ``<tool_call>\\n<function=NAME>
\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``, a newline between calls.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftgen.sglang_rules.parsers import CALL_FORMAT

SIM_FORMAT = "xml"  # the call format the simulated model writes (Qwen3.5/3.6's)
_CAPITALIZED = re.compile(r"\b[A-Z][\w-]*")
_WORD = re.compile(r"[\w-]+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class SimCall:
    name: str
    arguments: dict[str, Any]

    def as_openai(self, call_id: str, index: int) -> dict[str, Any]:
        """The call as SGLang's parser returns it in ``message.tool_calls``."""
        return {
            "id": call_id,
            "index": index,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


def parses(parser: str | None) -> bool:
    """Whether a server started with this ``--tool-call-parser`` turns the simulated model's calls into
    ``tool_calls`` (a parser that reads another format, or none, leaves them as text in ``content``)."""
    return parser is not None and CALL_FORMAT.get(parser) == SIM_FORMAT


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    if not messages or messages[-1].get("role") != "user":
        return None
    content = messages[-1].get("content")
    if isinstance(content, list):  # text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _value(schema: Any, text: str) -> Any:
    schema = schema if isinstance(schema, Mapping) else {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind in ("integer", "number"):
        found = _NUMBER.search(text)
        if found is None:
            return 1
        number = float(found.group())
        return int(number) if kind == "integer" or number.is_integer() else number
    if kind == "boolean":
        return True
    if kind == "object":
        return {}
    capitalized = _CAPITALIZED.findall(text)
    words = _WORD.findall(text)
    word = capitalized[-1] if capitalized else (words[-1] if words else "x")
    return [word] if kind == "array" else word


def arguments_for(function: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The arguments the simulated model passes to ``function`` (a tool's ``function`` object) for ``text``."""
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(properties, Mapping):
        return {}
    return {str(name): _value(schema, text) for name, schema in properties.items()}


def _mentioned(name: str, text: str) -> bool:
    lowered = text.lower()
    return any(len(word) >= 4 and word in lowered for word in name.lower().split("_"))


def planned_calls(
    tools: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> tuple[SimCall, ...]:
    """The calls the simulated model makes for a request with ``tools`` whose last message is ``messages[-1]``
    (none when that is not a user message). Public: tests and the bundled prompts write rows with these calls."""
    text = _last_user_text(messages)
    functions = [t.get("function", t) for t in tools if isinstance(t, Mapping)]
    functions = [f for f in functions if isinstance(f, Mapping) and isinstance(f.get("name"), str)]
    if text is None or not functions:
        return ()
    chosen = [f for f in functions if _mentioned(f["name"], text)] or functions[:1]
    return tuple(SimCall(f["name"], arguments_for(f, text)) for f in chosen)


def diverged(calls: Sequence[SimCall]) -> tuple[SimCall, ...]:
    """The same calls with the first one's first argument changed (``tool_divergence_rate``)."""
    if not calls:
        return ()
    first, rest = calls[0], tuple(calls[1:])
    arguments = dict(first.arguments)
    if not arguments:
        arguments = {"again": True}
    else:
        key = next(iter(arguments))
        value = arguments[key]
        if isinstance(value, bool):
            arguments[key] = not value
        elif isinstance(value, (int, float)):
            arguments[key] = value + 1
        elif isinstance(value, str):
            arguments[key] = value + " 2"
        else:
            arguments[key] = [value]
    return (SimCall(first.name, arguments), *rest)


def call_text(calls: Sequence[SimCall], *, after_answer: bool) -> str:
    """The calls as the model writes them (and draftgen's template renders them): a newline before each call but a
    first one with no answer before it."""
    blocks = []
    for number, call in enumerate(calls):
        lines = [f"<tool_call>\n<function={call.name}>\n"]
        for key, value in call.arguments.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines.append(f"<parameter={key}>\n{shown}\n</parameter>\n")
        lines.append("</function>\n</tool_call>")
        blocks.append(("\n" if after_answer or number else "") + "".join(lines))
    return "".join(blocks)


def call_id(rid: str, index: int) -> str:
    """A call's id, as SGLang makes them (``call_`` and 24 hex digits), here derived from the request."""
    return "call_" + hashlib.blake2b(f"{rid}/{index}".encode(), digest_size=12).hexdigest()
