"""The simulator's tool calls (docs/simulator.md, "Tool calls"): a request with ``tools`` that ends with a user
message is answered with the calls the simulator's rule gives, written in Qwen3.5/3.6's format; with a tool-call
parser that reads it they come back in ``message.tool_calls`` / ``delta.tool_calls`` with ``finish_reason``
``tool_calls``, without one as text in ``content`` (as SGLang without ``--tool-call-parser``); the ids the server
reports decode to the whole text, calls included, and are what the chat template renders for the same answer."""

from __future__ import annotations

import json

import pytest
from sim_helpers import post, post_json, prompt_ids, sse_json, tokenizer_of

from draftgen.sim.toolcalls import SimCall, call_text, diverged, planned_calls

MODEL = "Qwen/Qwen3.6-27B"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_local_time",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "What weather and local time will Nairobi have in 3 days?"}]
IDS = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}


def body(**changes: object) -> dict:
    return {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], "max_tokens": 4000, **IDS, **changes}


def test_the_rule_names_mentioned_tools_and_takes_arguments_from_the_message():
    calls = planned_calls([WEATHER, TIME], ASK)
    assert calls == (
        SimCall("get_weather", {"city": "Nairobi", "days": 3}),
        SimCall("get_local_time", {"city": "Nairobi"}),
    )
    assert planned_calls([TIME, WEATHER], [{"role": "user", "content": "hello"}]) == (
        SimCall("get_local_time", {"city": "hello"}),
    )
    assert (
        planned_calls(
            [WEATHER], [*ASK, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "r"}]
        )
        == ()
    )
    assert diverged(calls)[0].arguments == {"city": "Nairobi 2", "days": 3}


@pytest.mark.parametrize("stream", [False, True])
def test_with_a_parser_calls_come_back_parsed_and_the_ids_hold_their_text(instant_fleet, stream):
    fleet = instant_fleet()
    url = f"{fleet.urls[0]}/v1/chat/completions"
    if stream:
        status, data = post(url, body(stream=True))
        chunks, done = sse_json(data)
        assert done
        pieces = [d for c in chunks for ch in c["choices"] for d in ch["delta"].get("tool_calls") or ()]
        # SGLang's shape: per call, id and name first with empty arguments, then the arguments, id and name null
        assert [(p["index"], p["id"] is not None, p["function"]["name"]) for p in pieces] == [
            (0, True, "get_weather"),
            (0, False, None),
            (1, True, "get_local_time"),
            (1, False, None),
        ]
        calls = [
            {"name": pieces[i]["function"]["name"], "arguments": pieces[i + 1]["function"]["arguments"]}
            for i in (0, 2)
        ]
        content = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        finish = next(ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"])
        output_ids = next(c["sglext"]["output_ids"][0] for c in chunks if c.get("sglext"))
        reasoning = "".join(ch["delta"].get("reasoning_content") or "" for c in chunks for ch in c["choices"])
    else:
        status, raw = post_json(url, body())
        assert status == 200
        choice = raw["choices"][0]
        calls = [c["function"] for c in choice["message"]["tool_calls"]]
        assert all(
            c["id"].startswith("call_") and c["type"] == "function" for c in choice["message"]["tool_calls"]
        )
        content, finish = choice["message"]["content"], choice["finish_reason"]
        output_ids, reasoning = raw["sglext"]["output_ids"][0], choice["message"]["reasoning_content"]
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Nairobi", "days": 3}),
        ("get_local_time", {"city": "Nairobi"}),
    ]
    assert "<tool_call>" not in content  # the parser took the calls out of the text
    tokenizer = tokenizer_of(fleet)
    text = tokenizer.decode(output_ids)
    made = [SimCall(c["name"], json.loads(c["arguments"])) for c in calls]
    assert text == reasoning + "</think>" + content + call_text(made, after_answer=False)
    # ... exactly what draftgen's template renders for this answer after this prompt (ids = re-tokenized text)
    answer = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in made
        ],
    }
    prompt = prompt_ids(fleet, ASK, True, [WEATHER, TIME])
    rendered = tokenizer._template.render(
        messages=[*ASK, answer],
        add_generation_prompt=False,
        enable_thinking=True,
        tools=[WEATHER, TIME],
        eos_token="<|im_end|>",
    )
    assert tokenizer.encode(rendered)[: len(prompt) + len(output_ids)] == [*prompt, *output_ids]


def test_without_a_parser_the_calls_stay_text_in_content(sim_fleet):
    fleet = sim_fleet(servers=1, profile="instant", tool_call_parser=None)
    status, raw = post_json(f"{fleet.urls[0]}/v1/chat/completions", body())
    assert status == 200
    choice = raw["choices"][0]
    assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
    assert (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNairobi\n</parameter>"
        in choice["message"]["content"]
    )


def test_string_arguments_in_the_history_are_rendered_as_objects_and_bad_ones_refused(instant_fleet):
    fleet = instant_fleet()
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Nairobi"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    status, raw = post_json(f"{fleet.urls[0]}/v1/chat/completions", body(messages=history))
    assert status == 200 and raw["choices"][0]["finish_reason"] == "stop"  # after a result: text
    as_objects = json.loads(json.dumps(history))
    as_objects[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Nairobi"}
    assert raw["sglext"]["input_ids"] == prompt_ids(fleet, as_objects, True, [WEATHER, TIME])
    history[1]["tool_calls"][0]["function"]["arguments"] = '{"city": '
    status, error = post_json(f"{fleet.urls[0]}/v1/chat/completions", body(messages=history))
    assert status == 400 and "must be valid JSON" in error["message"]
