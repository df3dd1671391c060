"""The regeneration rule of agentic conversations (docs/generate.md#agentic-conversations), as pure functions and on
one conversation: the target's calls replace the source's; the source's tool results follow only when the target asked
for the same thing (same functions and arguments, any order), re-addressed to the target's call ids; otherwise the
conversation ends at that turn, recorded with both call lists. And the client reads a server's calls, whole or
streamed in SGLang's delta shape."""

from __future__ import annotations

import json

from draftgen.client.records import ChatResult
from draftgen.client.sse import SseEvent
from draftgen.client.stream import ChatAccumulator
from draftgen.generate.turns import Conversation
from draftgen.prompts.rows import PromptRow
from draftgen.training.conversation import (
    Answer,
    answer_points,
    assemble,
    follow_up,
    request_messages,
    stored_messages,
)
from draftgen.training.tools import match_calls, wire_messages
from draftgen.validate.turns import export_turn

TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
)


def source_call(call_id: str | None, name: str, **arguments: object) -> dict:
    made = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": call_id, **made} if call_id is not None else made


def target_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def parallel(ids: bool = True) -> list[dict]:
    """user, assistant calling get_weather(Paris) and get_time(Paris), both results, the reply, a new question."""
    first, second = ("s1", "s2") if ids else (None, None)
    results = [
        {"role": "tool", "content": "sunny", **({"tool_call_id": "s1"} if ids else {})},
        {"role": "tool", "content": "10:00", **({"tool_call_id": "s2"} if ids else {})},
    ]
    return [
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                source_call(first, "get_weather", city="Paris", unit="C"),
                source_call(second, "get_time", city="Paris"),
            ],
        },
        *results,
        {"role": "assistant", "content": "Sunny, ten o'clock."},
        {"role": "user", "content": "And tomorrow?"},
    ]


# The target asked for the same two things in the other order, the weather's arguments written in another key order.
SAME = [
    target_call("t1", "get_time", '{"city": "Paris"}'),
    target_call("t2", "get_weather", '{"unit": "C", "city": "Paris"}'),
]


def test_calls_match_as_a_multiset_of_names_and_parsed_arguments():
    original = parallel()[1]["tool_calls"]
    assert match_calls(original, SAME) == [
        (1, 0),
        (0, 1),
    ]  # (source index, target index), in the target's order
    assert match_calls(original, SAME[:1]) is None  # one call short
    assert (
        match_calls(original, [SAME[0], target_call("t2", "get_weather", '{"city": "Rome", "unit": "C"}')])
        is None
    )
    assert (
        match_calls(original, [SAME[0], target_call("t2", "get_weather", '{"city": "Paris"')]) is None
    )  # not JSON
    assert match_calls([], []) == []


def test_matching_calls_splice_the_results_re_addressed_in_the_target_order():
    messages = parallel()
    results, divergence = follow_up(messages, 0, SAME)
    assert divergence is None
    assert results == [
        {
            "role": "tool",
            "content": "10:00",
            "tool_call_id": "t1",
        },  # get_time's result, answering the target's t1
        {"role": "tool", "content": "sunny", "tool_call_id": "t2"},
    ]
    # without ids the results answer the calls by position, and take the target's ids
    positional, _ = follow_up(parallel(ids=False), 0, SAME)
    assert positional == results
    # the next turn's request: the target's calls (arguments as objects), the results, no source assistant text
    sent = request_messages(messages, 3, [(0, Answer("", tuple(SAME)))])
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert sent[1]["tool_calls"][1]["function"]["arguments"] == {"unit": "C", "city": "Paris"}
    assert sent[2:] == tuple(results)
    # ... and on the wire the arguments are JSON strings again, as OpenAI's API carries them
    assert (
        wire_messages(sent)[1]["tool_calls"][1]["function"]["arguments"] == '{"unit": "C", "city": "Paris"}'
    )


def test_other_calls_no_call_or_a_call_where_the_source_answered_in_text_diverge():
    messages = parallel()
    other = [SAME[0], target_call("t2", "get_weather", '{"city": "Rome", "unit": "C"}')]
    _, differs = follow_up(messages, 0, other, turn=0)
    assert differs is not None and differs.turn == 0 and differs.after == 0
    assert differs.original == tuple(messages[1]["tool_calls"]) and differs.target == tuple(other)
    assert "with other arguments or functions" in differs.reason
    _, silent = follow_up(messages, 0, [])
    assert silent is not None and silent.reason == "the target answered without calling get_weather, get_time"
    _, cut = follow_up(messages, 0, [], cut="length")
    assert cut is not None and "ended (length) before it called" in cut.reason
    _, extra = follow_up(messages, 3, [target_call("t9", "get_weather", "{}")])  # the source answered in text
    assert extra is not None and "where the source answered in text" in extra.reason
    assert follow_up(messages, 3, []) == ([], None)  # text for text: the conversation goes on
    assert follow_up(messages, 5, [target_call("t9", "get_weather", "{}")]) == (
        [],
        None,
    )  # the end: nothing follows
    stored = json.loads(differs.as_json(turns_left=2))
    assert stored["original"][0]["function"]["arguments"] == '{"city": "Paris", "unit": "C"}'
    assert stored["target"] == other and stored["turns_left"] == 2


def result(content: str, calls: list[dict] = (), finish: str = "stop") -> ChatResult:  # type: ignore[assignment]
    return ChatResult(
        server="http://s",
        response_id="r",
        reasoning_content="thinking",
        content=content,
        finish_reason=finish,
        prompt_tokens=10,
        completion_tokens=20,
        usage_reported=True,
        spec_accept_length=None,
        spec_verify_ct=None,
        started_at=0.0,
        latency_s=1.0,
        tool_calls=tuple(calls),
    )


def test_a_conversation_goes_on_after_matching_calls_and_is_stored_whole():
    conversation = Conversation(PromptRow("c", tuple(parallel()), 1, tools=TOOLS), "all")
    assert conversation.points == (0, 3, 5) and conversation.tools == TOOLS
    conversation.record(result("", SAME, "tool_calls"), attempts=1)
    assert not conversation.finished and conversation.divergence is None
    assert [m.get("tool_call_id") for m in conversation.request()[2:4]] == ["t1", "t2"]
    conversation.record(result("Sunny at ten."), attempts=1)
    conversation.record(result("Rain tomorrow."), attempts=1)
    row = conversation.output_row()
    assert row["tool_divergence"] is None and row["turn_after"] == [0, 3, 5]
    assert [json.loads(c) if c else None for c in row["turn_tool_calls"]] == [SAME, None, None]
    assert json.loads(row["tools"]) == list(TOOLS)
    assert stored_messages(row) == parallel()  # the source, whole, through the one reader
    # what the trainer sees: the target's calls, the results addressed to them, no source assistant text
    turns = [export_turn(t) for t in assemble(row)]
    assert [t["role"] for t in turns] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert turns[1]["tool_calls"] == SAME and turns[1]["reasoning_content"] == "thinking"
    assert (turns[2]["tool_call_id"], turns[2]["content"]) == ("t1", "10:00")
    assert "Sunny, ten o'clock." not in json.dumps(turns)


def test_a_divergent_turn_ends_the_conversation_and_is_stored_with_both_calls():
    conversation = Conversation(PromptRow("c", tuple(parallel()), 1, tools=TOOLS), "all")
    rome = [target_call("t1", "get_weather", '{"city": "Rome", "unit": "C"}')]
    conversation.record(result("", rome, "tool_calls"), attempts=2)
    assert conversation.finished and conversation.divergence is not None
    row = conversation.output_row()
    assert row["turn_after"] == [0] and stored_messages(row) == parallel()[:1]  # the source up to that answer
    divergence = json.loads(row["tool_divergence"])
    assert (divergence["turn"], divergence["after"], divergence["turns_left"]) == (0, 0, 2)
    assert [c["function"]["name"] for c in divergence["original"]] == ["get_weather", "get_time"]
    assert divergence["target"] == rome
    turns = assemble(row)  # the divergent turn is the target's own answer: it trains
    assert turns[-1].generated and turns[-1].tool_calls == tuple(rome)


def test_mode_last_sends_the_source_calls_and_results_as_given():
    messages = parallel()
    sent = request_messages(messages, 5, [], "last")
    assert [m["role"] for m in sent] == [m["role"] for m in messages]
    assert sent[2]["tool_call_id"] == "s1" and sent[1]["tool_calls"][0]["id"] == "s1"
    assert answer_points(messages, "last") == (5,)


def test_the_client_reads_calls_whole_and_from_sglangs_streamed_deltas():
    whole = ChatAccumulator("http://s", stream=False)
    whole.add_response(
        {
            "choices": [
                {
                    "message": {"role": "assistant", "content": None, "tool_calls": SAME},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        }
    )
    assert whole.result().tool_calls == tuple(SAME) and whole.result().finish_reason == "tool_calls"
    streamed = ChatAccumulator("http://s", stream=True)
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        # per call: id and name first (arguments empty), then argument pieces with id and name null
        *(
            {"choices": [{"delta": {"tool_calls": [piece]}, "finish_reason": None}]}
            for piece in (
                {
                    "id": "t1",
                    "index": 0,
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                },
                {
                    "id": None,
                    "index": 0,
                    "type": "function",
                    "function": {"name": None, "arguments": '{"city": '},
                },
                {
                    "id": "t2",
                    "index": 1,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                },
                {
                    "id": None,
                    "index": 0,
                    "type": "function",
                    "function": {"name": None, "arguments": '"Paris"}'},
                },
                {
                    "id": None,
                    "index": 1,
                    "type": "function",
                    "function": {"name": None, "arguments": '{"unit": "C", "city": "Paris"}'},
                },
            )
        ),
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]
    for chunk in chunks:
        streamed.add_event(SseEvent(data=json.dumps(chunk)))
    assert streamed.result().tool_calls == tuple(SAME)
