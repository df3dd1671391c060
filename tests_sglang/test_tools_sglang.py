"""Tool calls through real SGLang 0.5.23 and its own ``qwen3_coder`` parser (issue 39): generated, stored, validated
and exported by draftgen.

The ``tools`` model (support/tiny_qwen3.py) answers every turn with the same known text: a short reasoning, then a
call to get_weather for Paris. ``draftgen serve`` starts it with its defaults (the qwen3_5 family:
``--tool-call-parser qwen3_coder``), so SGLang's parser turns the call into ``tool_calls``; generate (streamed,
``turns: all``) splices the source's tool result where the source called the same, and ends a conversation, flagged,
where it did not. validate trains on SGLang's own ids; re-rendering the text through the chat template writes the
call with newlines the model did not write (and SGLang renders the tool schemas with a ``defer_loading`` key its
``Tool`` model adds), so those rows are ``retokenized_differs``, kept, their server ids exported.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import requests
from conftest import READY_TIMEOUT_S, Models
from notebook_runs import draftgen_run, notebook_text, stored_rows
from prompt_files import write_rows
from serve_runs import ServeRun, start_serve
from tier_runs import GREEDY, SERVED_MODEL
from tiny_qwen3 import IM_END, THINK_CLOSE, TOOL_ARGUMENTS, TOOL_CALL, TOOL_NAME, TOOL_REASONING

from draftgen.client.sse import iter_events

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def asked(city: str, prompt_id: str) -> dict:
    """The source asked get_weather for ``city``, got its result, and the user thanked it."""
    call = {
        "id": f"src-{prompt_id}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }
    return {
        "id": prompt_id,
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"src-{prompt_id}", "content": f"Sunny in {city}."},
            {"role": "user", "content": "Thanks!"},
        ],
    }


ROWS = [
    asked(
        "Paris", "match"
    ),  # the model calls get_weather(Paris) too: the result is spliced, the thanks answered
    asked("London", "other-city"),  # it calls for Paris: the conversation ends at its first turn
    {  # the source answered in text; the model calls: the conversation ends there
        "id": "text-answer",
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Nothing, thanks."},
        ],
    },
]


@pytest.fixture(scope="module")
def tools_server(draftgen: str, models: Models, tmp_path_factory: pytest.TempPathFactory):
    run = start_serve(
        draftgen,
        "tools",
        models.tools,
        tmp_path_factory.mktemp("tools-serve"),
        server_args=("--served-model-name", SERVED_MODEL),
    )
    try:
        run.wait_ready(READY_TIMEOUT_S)
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def tools_run(
    draftgen: str, tools_server: ServeRun, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """generate (streamed, turns: all, the canaries on) then validate on its folder with the model's tokenizer."""
    root = tmp_path_factory.mktemp("tools-runs")
    prompts = write_rows(root / "prompts" / "tools.jsonl", ROWS)
    generate = draftgen_run(
        draftgen,
        "generate",
        root,
        "tools",
        {
            **GREEDY,
            "servers": [tools_server.url],
            "prompts": str(prompts),
            "stream": True,
            "turns": "all",
            "enable_thinking": True,
            "max_tokens": 64,
            "concurrency_per_server": 2,
            "batch_save_size": 2,
        },
    )
    validate = draftgen_run(
        draftgen,
        "validate",
        root,
        "tools",
        {
            "generation_dir": str(generate),
            "tokenizer": str(tools_server.model),
            "enable_thinking": True,
            "export_tokens": True,
            "min_assistant_tokens": 4,  # the designed turn is ~25 tokens; the production floor is 16 all the same
            "holdout_share": 0.0,
        },
    )
    return generate, validate


def test_sglangs_parser_returns_the_call_whole_and_streamed(tools_server: ServeRun):
    """The server itself: with tools, the call comes back in message.tool_calls, finish_reason tool_calls; streamed,
    as deltas in OpenAI's incremental shape (draftgen's client puts them together: tests/test_agentic_turns.py)."""
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "temperature": 0,
        "max_tokens": 64,
    }
    whole = requests.post(f"{tools_server.url}/v1/chat/completions", json=body, timeout=300).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls", whole
    [call] = choice["message"]["tool_calls"]
    assert (
        call["function"]["name"] == TOOL_NAME and json.loads(call["function"]["arguments"]) == TOOL_ARGUMENTS
    )
    assert choice["message"]["reasoning_content"] == TOOL_REASONING
    assert "<tool_call>" not in (choice["message"]["content"] or "")
    # the shapes the simulator speaks (docs/simulator.md, "Tool calls"): keys of the message and of each call
    assert set(choice["message"]) == {"role", "content", "reasoning_content", "tool_calls"}
    assert set(call) == {"id", "index", "type", "function"} and set(call["function"]) == {"name", "arguments"}
    streamed = requests.post(
        f"{tools_server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=300, stream=True
    )
    events = [e.data for e in iter_events(streamed.iter_content(chunk_size=None))]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    pieces = [p for c in chunks for ch in c["choices"] for p in ch["delta"].get("tool_calls") or ()]
    # SGLang's incremental shape: the first piece names the call (and carries its id), later ones only add arguments
    assert pieces[0]["id"] and pieces[0]["function"]["name"] == TOOL_NAME
    assert all(p["id"] is None and p["function"]["name"] is None for p in pieces[1:])
    assert {p["index"] for p in pieces} == {0}
    assert json.loads("".join(p["function"]["arguments"] or "" for p in pieces)) == TOOL_ARGUMENTS
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["tool_calls"]
    without = requests.post(
        f"{tools_server.url}/v1/chat/completions", json={**body, "tools": None}, timeout=300
    ).json()["choices"][0]
    assert (
        not without["message"].get("tool_calls") and TOOL_CALL in without["message"]["content"]
    )  # no tools: text


def test_the_call_is_stored_the_result_spliced_and_other_calls_end_the_conversation(tools_run):
    generate, _ = tools_run
    assert "tool canary" in notebook_text(generate / "generate.ipynb")
    rows = {r["id"]: r for r in stored_rows(generate).iter_rows(named=True)}
    assert set(rows) == {r["id"] for r in ROWS}
    match = rows["match"]
    assert match["tool_divergence"] is None and match["turn_after"] == [0, 3]
    assert match["turn_finish_reason"] == ["tool_calls", "tool_calls"]
    calls = [json.loads(c) for c in match["turn_tool_calls"]]
    for made in calls:  # parsed by SGLang from the stream: its ids, the arguments as JSON text
        [call] = made
        assert call["id"].startswith("call_") and call["function"]["name"] == TOOL_NAME
        assert json.loads(call["function"]["arguments"]) == TOOL_ARGUMENTS
    assert match["turn_reasoning"] == [TOOL_REASONING, TOOL_REASONING]
    for prompt_id, reason in (("other-city", "with other arguments"), ("text-answer", "answered in text")):
        divergence = json.loads(rows[prompt_id]["tool_divergence"])
        assert divergence["turn"] == 0 and reason in divergence["reason"], divergence
        assert [c["function"]["name"] for c in divergence["target"]] == [TOOL_NAME]
        assert rows[prompt_id]["turn_after"] == [0]


def test_the_export_trains_on_sglangs_ids_with_the_call_and_carries_tools_and_calls(
    tools_run, models: Models
):
    from transformers import AutoTokenizer

    _, validate = tools_run
    summary = json.loads((validate / "summary.json").read_text())
    assert summary["passed"], summary
    samples = pl.read_parquet(validate / "samples.parquet")
    assert samples.height == 2 + 1 + 1 and (samples["token_source"] == "server").all()
    assert samples.filter(pl.col("tool_divergence"))["prompt_id"].sort().to_list() == [
        "other-city",
        "text-answer",
    ]
    assert not samples["dropped"].any(), samples.filter(pl.col("dropped")).select("id", "flags")
    tok = AutoTokenizer.from_pretrained(models.tools)
    tokens = pl.concat(
        [pl.read_parquet(p) for p in sorted((validate / "export" / "tokens").glob("*.parquet"))]
    )
    supervised = TOOL_REASONING + THINK_CLOSE + "\n\n" + TOOL_CALL + IM_END + "\n"
    for row in tokens.iter_rows(named=True):
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == supervised, row["id"]
    lines = {
        r["id"]: r for r in map(json.loads, (validate / "export" / "train.jsonl").read_text().splitlines())
    }
    second = lines["match#1"]
    assert json.loads(second["tools"]) == [WEATHER]
    assistant, result = second["conversations"][1:3]
    assert result == {
        "role": "tool",
        "content": "Sunny in Paris.",
        "tool_call_id": assistant["tool_calls"][0]["id"],
    }
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == TOOL_ARGUMENTS
    card = json.loads((validate / "export" / "dataset_info.json").read_text())["agentic"]
    assert (card["rows"], card["tool_calls"], card["divergences"]) == (4, 4, 2)
