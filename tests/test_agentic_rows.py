"""The prompt reader with agentic and other real-world rows (issue 39): every value that changes what the model sees
reaches the normalized row, what cannot be rendered faithfully is refused naming the field, and what the reader does
not use is named in ``PromptRow.ignored`` (counted in preflight)."""

from __future__ import annotations

import json

import pytest

from draftgen.prompts.rows import PromptRow, RejectedRow, normalize_record, stable_id

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def call(call_id: str | None, city: str, *, as_string: bool = True) -> dict:
    arguments = json.dumps({"city": city}) if as_string else {"city": city}
    made = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return {"id": call_id, **made} if call_id is not None else made


def agentic(**changes: object) -> dict:
    row = {
        "id": "a1",
        "tools": [WEATHER],
        "messages": [
            user("Weather in Paris?"),
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "Paris")]},
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"},
            user("Thanks, and tomorrow?"),
        ],
    }
    row.update(changes)
    return row


def read(record: dict) -> PromptRow:
    row = normalize_record(record, 1)
    assert isinstance(row, PromptRow), row
    return row


def refused(record: dict) -> str:
    row = normalize_record(record, 1)
    assert isinstance(row, RejectedRow), row
    return row.reason


def test_tools_calls_ids_and_names_reach_the_row_in_one_canonical_form():
    row = read(agentic())
    assert row.tools == (WEATHER,)
    assistant, result = row.messages[1], row.messages[2]
    # arguments as a JSON object: what SGLang and SpecForge render (a JSON string is parsed)
    assert assistant == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert result == {"role": "tool", "content": "sunny", "name": "get_weather", "tool_call_id": "c1"}
    assert read(agentic(tools=json.dumps([WEATHER]))).tools == (WEATHER,)  # tools as a JSON string
    object_arguments = agentic()
    object_arguments["messages"][1]["tool_calls"] = [call("c1", "Paris", as_string=False)]
    assert read(object_arguments).messages == row.messages
    as_string = agentic()
    as_string["messages"][1]["tool_calls"] = json.dumps([call("c1", "Paris")])  # the whole list as a string
    assert read(as_string).messages == row.messages
    bare = read(
        agentic(tools=[WEATHER["function"]])
    )  # a bare schema is wrapped: SGLang accepts only that form
    assert bare.tools == (WEATHER,)


def test_the_id_of_a_row_is_a_hash_of_what_the_model_sees_tools_included():
    row = agentic()
    del row["id"]
    first = read(row)
    other_tools = read(
        {**row, "tools": [{**WEATHER, "function": {**WEATHER["function"], "description": "x"}}]}
    )
    assert first.id != other_tools.id  # the same messages with other tools: another prompt
    plain = read({"messages": [user("hello")]})
    assert plain.id == stable_id(({"role": "user", "content": "hello"},))  # no tools: the id it always had


def test_a_system_field_becomes_the_leading_system_message():
    row = read({"system": "You are a pirate.", "messages": [user("hi")]})
    assert row.messages[0] == {"role": "system", "content": "You are a pirate."}
    same = read(
        {"system_prompt": "Be kind.", "messages": [{"role": "system", "content": "Be kind."}, user("hi")]}
    )
    assert [m["role"] for m in same.messages] == ["system", "user"]  # given twice, the same: once
    assert read({"system": "", "messages": [user("hi")]}).messages == ({"role": "user", "content": "hi"},)
    reason = refused({"system": "A", "messages": [{"role": "system", "content": "B"}, user("hi")]})
    assert "'system' and messages[0]" in reason
    assert "'system' and 'system_prompt' differ" in refused(
        {"system": "A", "system_prompt": "B", "prompt": "hi"}
    )
    sharegpt = read({"system": "S", "conversations": [{"from": "human", "value": "q"}]})
    assert sharegpt.messages[0] == {"role": "system", "content": "S"}


def test_text_parts_are_joined_and_a_non_text_part_is_refused_with_the_reason():
    parts = [{"type": "text", "text": "Look at "}, {"type": "text", "text": "this."}]
    assert read({"messages": [{"role": "user", "content": parts}]}).messages[0]["content"] == "Look at this."
    image = [
        {"type": "text", "text": "What is in"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    ]
    reason = refused({"messages": [{"role": "user", "content": image}]})
    assert reason.startswith("messages[0].content[1] is a 'image_url' part")
    assert "messages[0].content[0] is not a text part" in refused(
        {"messages": [user("x") | {"content": [3]}]}
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda r: r["messages"][2].update(tool_call_id="c9"),
            "messages[2].tool_call_id 'c9' answers no call of messages[1]",
        ),
        (lambda r: r["messages"].pop(2), "messages[1] calls 1 tool(s) and no tool result follows"),
        (lambda r: r.update(tools=None), "calls 'get_weather', which the row has no 'tools'"),
        (
            lambda r: r["messages"][1]["tool_calls"][0]["function"].update(arguments='{"city": "Par'),
            "messages[1].tool_calls[0].function.arguments is not valid JSON",
        ),
        (
            lambda r: r["messages"][1]["tool_calls"][0]["function"].update(arguments="[1, 2]"),
            "messages[1].tool_calls[0].function.arguments must be a JSON object",
        ),
        (lambda r: r.update(tools="[{"), "tools is a string that is not valid JSON"),
        (lambda r: r.update(tools=[{"type": "retrieval"}]), "tools[0] has no function name"),
        (lambda r: r["messages"][0].update(tool_calls=[call("c", "x")]), "messages[0].tool_calls on a user"),
        (lambda r: r["messages"][3].update(tool_call_id="c1"), "messages[3].tool_call_id on a user message"),
        (lambda r: r["messages"][2].update(name=7), "messages[2].name must be a string"),
        (
            lambda r: r["messages"].insert(1, {"role": "assistant", "content": "let me check"}),
            "messages[2] calls tools right after another assistant turn",
        ),
    ],
)
def test_what_cannot_be_rendered_faithfully_is_refused_naming_the_field(change, reason):
    record = agentic()
    change(record)
    assert reason in refused(record)


def test_parallel_calls_are_answered_by_id_in_any_order_or_by_position_without_ids():
    by_id = agentic()
    by_id["messages"][1]["tool_calls"] = [call("c1", "Paris"), call("c2", "Rome")]
    by_id["messages"][2:3] = [
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert [m["role"] for m in read(by_id).messages] == ["user", "assistant", "tool", "tool", "user"]
    twice = json.loads(json.dumps(by_id))
    twice["messages"][2]["tool_call_id"] = "c1"
    assert "every call needs exactly one result" in refused(twice)
    positional = agentic()
    positional["messages"][1]["tool_calls"] = [call(None, "Paris"), call(None, "Rome")]
    positional["messages"][2:3] = [{"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"}]
    assert read(positional).messages[1]["tool_calls"][1]["function"]["arguments"] == {"city": "Rome"}
    short = json.loads(json.dumps(positional))
    del short["messages"][3]
    assert "matched to calls by position" in refused(short)


def test_sharegpt_function_call_and_observation_turns_are_calls_and_results():
    row = read(
        {
            "tools": json.dumps([WEATHER["function"]]),  # LLaMA-Factory: bare schemas, as a JSON string
            "conversations": [
                {"from": "human", "value": "Weather in Oslo?"},
                {
                    "from": "function_call",
                    "value": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}),
                },
                {"from": "observation", "value": "snow"},
                {"from": "gpt", "value": "It snows."},
            ],
        }
    )
    assert row.tools == (WEATHER,)
    assert row.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
        ],
    }
    assert row.messages[2] == {"role": "tool", "content": "snow"}  # the trailing answer is dropped, as always


def test_fields_the_reader_does_not_use_are_named_never_dropped_without_a_word():
    record = agentic(metadata={"source": "x"}, category="agentic", score=None)
    record["messages"][1]["reasoning_content"] = "I should call the tool."
    record["messages"][3]["weight"] = 0.0
    row = read(record)
    # category fields, id, tools, the messages and system fields are used; a null value is no value
    assert row.ignored == ("messages[].reasoning_content", "messages[].weight", "metadata")
    sharegpt = read(
        {"conversations": [{"from": "human", "value": "q", "loss": 1}], "messages": None, "extra": 1}
    )
    assert sharegpt.ignored == ("conversations[].loss", "extra")
    both = read({"messages": [user("q")], "conversations": [{"from": "human", "value": "other"}]})
    assert both.ignored == ("conversations",)  # the messages are read; the other conversation is named
