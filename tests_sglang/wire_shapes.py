"""One set of requests, sent to real SGLang and to ``draftgen sim``, and the *shapes* of what comes back.

A shape is a response with its values replaced by their JSON types: objects keep their keys, lists become the set
of their elements' shapes, SSE streams become the list of their events' shapes in order (consecutive events of one
shape collapsed, since how many text chunks a stream has is a value). Values differ between the two servers (a
random model against filler text); shapes must not, except where docs/simulator.md's "Known differences from
real SGLang" table says why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import requests

from draftgen.client.sse import decode_events

DONE = "[DONE]"

TIMEOUT_S = 300
PROMPT = [{"role": "user", "content": "Tell me something about the weather today."}]
IDS = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
SPEC = {"return_spec_tokens_details": True}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
LOGPROBS = {"logprobs": True, "top_logprobs": 3}
# Room to finish on their own: the designed model stops after 13 tokens, the simulator's plain server (profile
# instant, a few dozen tokens) far below this, so both sides answer with the same finish and the same chunk kinds.
# The "spec" cases run into max_tokens on both sides (NGRAM serves the random model, which never stops).
ROOM = 2048


@dataclass(frozen=True)
class Case:
    """One request: which server kind answers it ("plain": no speculation; "spec": speculative), where, what."""

    name: str
    server: str
    path: str
    body: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    method: str = "POST"


def _chat(thinking: bool, max_tokens: int, **extra) -> dict:
    return {
        "model": "default",
        "messages": PROMPT,
        "temperature": 0,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": thinking},
        **extra,
    }


CASES = (
    Case("chat plain", "plain", "/v1/chat/completions", _chat(True, ROOM)),
    Case("chat thinking off", "plain", "/v1/chat/completions", _chat(False, ROOM)),
    Case("chat truncated", "plain", "/v1/chat/completions", _chat(True, 3)),
    Case("chat ids", "plain", "/v1/chat/completions", _chat(True, ROOM, **IDS)),
    Case(
        "chat ids by header",
        "plain",
        "/v1/chat/completions",
        _chat(True, ROOM),
        headers={"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"},
    ),
    Case("chat stream", "plain", "/v1/chat/completions", _chat(True, ROOM, **STREAM)),
    Case("chat stream thinking off", "plain", "/v1/chat/completions", _chat(False, ROOM, **STREAM)),
    Case("chat stream truncated", "plain", "/v1/chat/completions", _chat(True, 3, **STREAM)),
    Case("chat stream ids", "plain", "/v1/chat/completions", _chat(True, ROOM, **STREAM, **IDS)),
    Case("chat spec", "spec", "/v1/chat/completions", _chat(True, 16, **SPEC, **IDS)),
    Case("chat stream spec", "spec", "/v1/chat/completions", _chat(True, 16, **STREAM, **SPEC, **IDS)),
    Case("chat logprobs", "plain", "/v1/chat/completions", _chat(True, ROOM, **LOGPROBS)),
    Case("chat logprobs no top", "plain", "/v1/chat/completions", _chat(True, ROOM, logprobs=True)),
    # Cut inside the answer: every step's logprobs ride on its text chunk. A step with no text of its own
    # (</think>, the stop token) gets a chunk of its own, or rides on the step before when SGLang sends the two
    # outputs as one (which depends on timing); a stream that stops at 4 answer tokens has no such step.
    Case("chat stream logprobs", "plain", "/v1/chat/completions", _chat(False, 4, **STREAM, **LOGPROBS)),
    Case("chat spec logprobs", "spec", "/v1/chat/completions", _chat(False, 16, **SPEC, **LOGPROBS)),
    Case("chat empty messages", "plain", "/v1/chat/completions", {"model": "default", "messages": []}),
    Case(
        "generate",
        "plain",
        "/generate",
        {"text": "The weather today is", "sampling_params": {"max_new_tokens": ROOM, "temperature": 0}},
    ),
    Case(
        "generate stream",
        "plain",
        "/generate",
        {
            "text": "The weather today is",
            "sampling_params": {"max_new_tokens": ROOM, "temperature": 0},
            "stream": True,
        },
    ),
    Case(
        "generate spec",
        "spec",
        "/generate",
        {"text": "The weather today is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
    ),
)


def shape(value: object) -> object:
    """``value`` with every leaf replaced by its JSON type name; a list by the sorted set of its elements' shapes."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        shapes = {json.dumps(shape(item), sort_keys=True) for item in value}
        return {"[]": [json.loads(s) for s in sorted(shapes)]}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def stream_shape(raw: bytes) -> list[object]:
    """The shapes of a stream's events in order (draftgen's own decoder), runs of one shape collapsed to one."""
    shapes: list[object] = []
    for event in decode_events(raw):
        data = event.data if event.data == DONE else shape(json.loads(event.data))
        item = {"event": event.event, "data": data}
        if not shapes or shapes[-1] != item:
            shapes.append(item)
    return shapes


def send(base_url: str, case: Case, model: str) -> dict:
    """{"status": int, "body" | "stream": shape} of one case against one server."""
    body = dict(case.body)
    if "model" in body:
        body["model"] = model
    reply = requests.request(
        case.method, base_url + case.path, json=body, headers=case.headers, timeout=TIMEOUT_S
    )
    if body.get("stream") and reply.status_code == 200:
        return {"status": reply.status_code, "stream": stream_shape(reply.content)}
    return {"status": reply.status_code, "body": shape(reply.json())}


def metric_types(base_url: str) -> dict[str, str]:
    """{metric family name: type} of a /metrics page (the ``# TYPE`` lines)."""
    text = requests.get(base_url + "/metrics", timeout=30).text
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """A shape as {dotted path: leaf}, so two shapes differ path by path (lists: ``[]``, stream events: ``#i``)."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}.{key}" if prefix else key)
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out |= flatten(item, f"{prefix}#{index}")
        if not value:
            out[prefix] = "[]"
        return out
    return {prefix: value}


def differences(real: object, sim: object) -> list[str]:
    """Paths where two shapes differ: ``path: real X, sim Y`` (``absent`` where one has no such path)."""
    a, b = flatten(real), flatten(sim)
    return [
        f"{path}: real {a.get(path, 'absent')}, sim {b.get(path, 'absent')}"
        for path in sorted(a.keys() | b.keys())
        if a.get(path) != b.get(path)
    ]


def known_differences(doc: Path) -> dict[tuple[str, str], str]:
    """docs/simulator.md's table: {(case pattern, path pattern): reason}; ``*`` is a wildcard in both."""
    text = doc.read_text(encoding="utf-8")
    section = text.partition("## Known differences from real SGLang")[2].partition("\n## ")[0]
    table: dict[tuple[str, str], str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("case", "") or set(cells[0]) <= {"-", " "}:
            continue
        case, path, reason = (c.strip("`") for c in cells)
        table[(case, path)] = reason
    return table


def listed(case: str, difference: str, table: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    """The table entry (case pattern, path pattern) that explains ``difference`` in ``case``, or None."""
    path = difference.partition(": real ")[0]
    for name, pattern in table:
        if _matches(name, case) and _matches(pattern, path):
            return name, pattern
    return None


def _matches(pattern: str, text: str) -> bool:
    """``pattern`` with ``*`` standing for any run of characters matches the whole of ``text``."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), text) is not None
