"""Agentic conversations on the simulated fleet, end to end (issue 39): generate → validate → export.

* A prompt file mixing OpenAI rows with tools and parallel calls, ShareGPT rows (function_call / observation, a
  system field, tools as a JSON string), SpecForge-style conversations (role/content), content-part lists and an
  image part: every field of every input row is found in a request sent (seen through a recording proxy), in a
  rejection's reason, or in preflight's ignored-field count — or it is an answer the target regenerated.
* Splicing and divergence by construction: the simulator's calls follow a rule (draftgen.sim.toolcalls), so rows are
  written whose source calls match it (parallel ones in another order), differ from it, are missing, or are
  answered in text; and a fleet told to diverge.
* The tool canary: a server that returns calls as text fails preflight when the prompt set has tools.
* A client SIGKILLed mid-conversation and resumed: every agentic conversation stored once, its results spliced.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest
from generate_helpers import generate_here, sigkill_client_after_shards
from test_generate_multiturn import (
    LOOKUP,
    agent_loop,
    config_for,
    expected_prompt_tokens,
    run,
    sent_seed,
    write_rows,
)
from test_generate_notebook import base_params
from test_router import _recording_proxy_module

from draftgen.generate import preflight
from draftgen.generate.preflight import PreflightError
from draftgen.generate.store import REJECTED, read_manifest
from draftgen.params import build_config
from draftgen.prompts.rows import SHAREGPT_ROLES
from draftgen.sim.toolcalls import planned_calls
from draftgen.training.conversation import answer_points, generated_calls, stored_messages
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import finalize_export, validate_generation

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_local_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def sim_calls(tools: list[dict], question: str, prefix: str, *, reverse: bool = False) -> list[dict]:
    """The calls the simulated target makes for ``question``, as a source row writes them (ids ``prefix``-k)."""
    made = planned_calls(tools, [{"role": "user", "content": question}])
    calls = [
        {
            "id": f"{prefix}-{k}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for k, c in enumerate(made)
    ]
    return calls[::-1] if reverse else calls


def results(calls: list[dict], texts: list[str]) -> list[dict]:
    return [
        {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": t}
        for c, t in zip(calls, texts, strict=True)
    ]


# ----- the mixed prompt file ------------------------------------------------------------------------------------
def mixed_rows() -> list[dict]:
    q1 = "I am in Lisbon: what is the weather and the local time?"
    parallel = sim_calls([WEATHER, TIME], q1, "oa", reverse=True)  # the other order: still the same calls
    q2 = "Weather in Quito, please."
    shared = sim_calls([WEATHER], q2, "sg")[0]["function"]
    return [
        {  # OpenAI messages with tools and parallel calls, names, an unused source field and a top-level one
            "id": "openai-parallel",
            "tools": [WEATHER, TIME],
            "category": "agentic",
            "meta": {"annotator": "n7"},
            "messages": [
                {"role": "user", "content": q1},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "Two tools at once.",
                    "tool_calls": parallel,
                },
                *results(parallel, ["18:05", "sunny, 24 C"]),
                {"role": "assistant", "content": "Sunny, and it is five past six."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "And what "}, {"type": "text", "text": "to wear?"}],
                },
            ],
        },
        {  # ShareGPT (LLaMA-Factory): a system field, bare tools as a JSON string, function_call / observation
            "id": "sharegpt-tools",
            "system": "You answer as a ship's navigator.",
            "tools": json.dumps([WEATHER["function"]]),
            "conversations": [
                {"from": "human", "value": q2},
                {
                    "from": "function_call",
                    "value": json.dumps({"name": shared["name"], "arguments": shared["arguments"]}),
                },
                {"from": "observation", "value": "fog, 11 C"},
                {"from": "gpt", "value": "Fog in Quito."},
                {"from": "human", "value": "Should I sail?", "weight": 1},
                {"from": "gpt", "value": "Not in fog."},
            ],
        },
        {  # SpecForge's own conversations (role/content keys under "conversations")
            "id": 7,
            "conversations": [
                {"role": "user", "content": "Name a prime above 90."},
                {"role": "assistant", "content": "97.", "reasoning_content": "97 is prime."},
            ],
            "source": "specforge-style",
        },
        {  # a top-level system prompt and a plain prompt
            "id": "system-prompt",
            "system_prompt": "Reply in French.",
            "prompt": "What colour is the sky?",
        },
        {  # a content-part list that is text only: joined
            "id": "text-parts",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Explain tides "},
                        {"type": "text", "text": "briefly."},
                    ],
                }
            ],
        },
        {  # an image part: refused, with the part named
            "id": "with-image",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
                    ],
                }
            ],
        },
        {  # a result for a call nobody made: refused, the field named
            "id": "orphan-result",
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "x1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "x2", "content": "rain"},
            ],
        },
    ]


REJECTED_FIELDS = {"with-image": "messages[0].content[1]", "orphan-result": "messages[2].tool_call_id"}


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, scalar) of every leaf; a string holding a JSON object or list is read as what it holds."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}[{index}]")
    else:
        yield path, value


def field_name(path: str) -> str:
    """The name preflight counts a leaf under: its top-level field, or 'messages[].key' for a message's own key."""
    top = path.split(".")[0].split("[")[0]
    parts = path.split(".")
    if top in ("messages", "conversations") and len(parts) > 1:
        return f"{top}[].{parts[1].split('[')[0]}"
    return top


def test_every_field_of_a_mixed_prompt_file_reaches_a_request_a_rejection_or_the_ignored_count(
    instant_fleet, tmp_path
):
    rows = mixed_rows()
    prompts = write_rows(tmp_path / "mixed.jsonl", rows)
    fleet = instant_fleet()
    proxy = _recording_proxy_module().RecordingProxy(fleet.urls[0])
    proxy.start()
    try:
        # turns: last — the source's own assistant messages are history then, sent as given; only the trailing
        # answer of a ShareGPT row is regenerated (the next test's default turns: all run shows the splicing)
        config = config_for(
            fleet, prompts, tmp_path / "run", turns="last", max_rejected_rate=0.5, canary=True
        )
        config = config.model_copy(update={"servers": [proxy.url]})
        checks = asyncio.run(preflight(config))
        checks.release()
        outcome = run(config)
        chats = [e.request_json() for e in proxy.chats()]
    finally:
        proxy.stop()
    assert outcome.status == "complete" and outcome.completed == len(rows) - len(REJECTED_FIELDS)
    ignored = read_manifest(tmp_path / "run")["prompts"]["ignored_fields"]
    assert ignored == {
        "meta": 1,
        "messages[].reasoning_content": 1,
        "conversations[].weight": 1,
        "conversations[].reasoning_content": 1,
    }
    shown = next(c.detail for c in checks.checks if c.check == "ignored fields")
    assert (
        shown.startswith("ignored fields: ") and "meta 1 rows" in shown
    )  # preflight names them, with counts
    rejected = {
        r["id"]: r["reason"] for r in pl.read_parquet(tmp_path / "run" / REJECTED).iter_rows(named=True)
    }
    for prompt_id, field in REJECTED_FIELDS.items():
        assert rejected[prompt_id].startswith(field), rejected
    stored = {r["id"]: r for r in pl.read_parquet(tmp_path / "run" / "shards").iter_rows(named=True)}

    for row in rows:
        prompt_id = str(row["id"])
        if prompt_id in rejected:
            continue  # refused whole, the reason naming the field (checked above): no value of it was sent
        first_user = next(m for m in stored_messages(stored[prompt_id]) if m["role"] == "user")["content"]
        sent = [c for c in chats if any(m.get("content") == first_user for m in c["messages"])]
        assert sent, prompt_id
        sent_values = {
            v for c in sent for _, v in leaves({"messages": c["messages"], "tools": c.get("tools")})
        }
        sent_strings = [v for v in sent_values if isinstance(v, str)]
        sent_roles = {m["role"] for c in sent for m in c["messages"]}
        turns = row.get("messages") or row.get("conversations") or []
        answers = {
            i
            for i, t in enumerate(turns)
            if SHAREGPT_ROLES[str(t.get("role", t.get("from"))).lower()] == "assistant"
        }
        trailing = set()
        while turns and len(turns) - 1 - len(trailing) in answers:
            trailing.add(len(turns) - 1 - len(trailing))
        for path, value in leaves(row):
            name = field_name(path)
            where = (prompt_id, path, value)
            if value is None:
                continue  # null is no value (an assistant's null content next to its calls is "")
            if name == "id":
                assert prompt_id in stored, where
            elif name in ("category", "source"):
                assert stored[prompt_id]["category"] == str(value), where
            elif name in ignored:
                continue  # counted by name in preflight
            elif any(path.startswith((f"messages[{i}]", f"conversations[{i}]")) for i in trailing):
                continue  # a trailing answer: what the target regenerates, by design
            elif path.endswith((".role", ".from")):
                assert SHAREGPT_ROLES[str(value).lower()] in sent_roles, where
            elif path.endswith(".type") and value in ("text", "function"):
                continue  # a part's or a call's kind: its text or call is checked as a leaf of its own
            else:
                found = value in sent_values or (
                    isinstance(value, str) and any(value in s for s in sent_strings)
                )
                assert found, f"{where} is nowhere: not sent, not rejected, not counted"
    # every request carried its conversation's tools; the tool canary ran (the file has tools) and passed
    assert all(c.get("tools") for c in chats if "Lisbon" in json.dumps(c) or "Quito" in json.dumps(c))
    canaries = [c for c in chats if "get_word_length" in json.dumps(c.get("tools"))]
    assert canaries, "preflight sent a canary request with a tool"


def test_the_mixed_file_generated_turn_by_turn_then_validated_and_exported(
    instant_fleet, tmp_path, tokenizer_dir
):
    prompts = write_rows(tmp_path / "mixed.jsonl", mixed_rows())
    fleet = instant_fleet(2)
    outcome = run(config_for(fleet, prompts, tmp_path / "gen", max_tokens=2048, max_rejected_rate=0.5))
    assert outcome.status == "complete"
    stored = {r["id"]: r for r in pl.read_parquet(tmp_path / "gen" / "shards").iter_rows(named=True)}
    parallel = stored["openai-parallel"]
    assert parallel["tool_divergence"] is None and len(parallel["turn_after"]) == 3  # spliced, then answered
    calls = generated_calls(parallel, 3)
    assert [c["function"]["name"] for c in calls[0]] == [
        "get_weather",
        "get_local_time",
    ]  # the target's order
    assert calls[1] == ()  # after the results: text (the simulated model calls only after a user message)
    assert [c["function"]["name"] for c in calls[2]] == ["get_weather"]  # no tool named: the first one
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(tmp_path / "gen"),
            "tokenizer": str(tokenizer_dir),
            "out_dir": str(tmp_path / "val"),
            "holdout_share": 0.0,
            "train_max_length": 8192,
            "min_assistant_tokens": 1,
            "max_truncated_share": 1.0,
        },
    )
    result = validate_generation(config, progress=False)
    export = finalize_export(result)
    lines = [json.loads(line) for line in (export / "train.jsonl").read_text().splitlines()]
    second = next(r for r in lines if r["id"] == "openai-parallel#1")
    assert json.loads(second["tools"]) == [WEATHER, TIME]
    call, *spliced = second["conversations"][1:4]
    ids = [c["id"] for c in call["tool_calls"]]
    assert [s["tool_call_id"] for s in spliced] == ids  # the source's results, answering the target's calls
    assert [s["content"] for s in spliced] == ["sunny, 24 C", "18:05"]  # in the target's order
    assert all(isinstance(c["function"]["arguments"], str) for c in call["tool_calls"])  # SpecForge's shape
    card = json.loads((export / "dataset_info.json").read_text())["agentic"]
    with_tools = [r for r in stored.values() if r["tools"]]
    assert card["rows"] == sum(len(r["turn_after"]) for r in with_tools) == 6  # two conversations of 3 turns
    assert card["tool_calls"] == sum(
        len(c) for r in with_tools for c in generated_calls(r, len(r["turn_after"]))
    )


# ----- splicing and divergence, by construction ------------------------------------------------------------------
def case_rows() -> list[dict]:
    match_q = "What is the weather in Osaka?"
    match = sim_calls([WEATHER], match_q, "m")
    other = [{**match[0], "function": {"name": "get_weather", "arguments": json.dumps({"city": "Kyoto"})}}]
    second_round = sim_calls([WEATHER], match_q, "r")
    follow = {"role": "user", "content": "Thanks."}
    return [
        {
            "id": "match",
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": match_q},
                {"role": "assistant", "content": "", "tool_calls": match},
                *results(match, ["rain"]),
                {"role": "assistant", "content": "Rain."},
                follow,
            ],
        },
        {
            "id": "other-arguments",
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": match_q},
                {"role": "assistant", "content": "", "tool_calls": other},
                *results(other, ["snow"]),
                follow,
            ],
        },
        {  # the source calls again after the first result; the target answers a result in text
            "id": "no-second-call",
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": match_q},
                {"role": "assistant", "content": "", "tool_calls": match},
                *results(match, ["rain"]),
                {"role": "assistant", "content": "", "tool_calls": [{**second_round[0], "id": "r-0"}]},
                {"role": "tool", "tool_call_id": "r-0", "content": "still rain"},
                follow,
            ],
        },
        {  # the source answered in text where the target calls
            "id": "text-answer",
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": match_q},
                {"role": "assistant", "content": "I think it rains."},
                follow,
            ],
        },
    ]


def test_results_are_spliced_when_the_calls_match_and_the_conversation_ends_when_they_do_not(
    instant_fleet, tmp_path
):
    prompts = write_rows(tmp_path / "cases.jsonl", case_rows())
    fleet = instant_fleet()
    proxy = _recording_proxy_module().RecordingProxy(fleet.urls[0])
    proxy.start()
    try:
        config = config_for(fleet, prompts, tmp_path / "run", max_tokens=2048)
        outcome = run(config.model_copy(update={"servers": [proxy.url]}))
        chats = [e.request_json() for e in proxy.chats()]
    finally:
        proxy.stop()
    assert outcome.status == "complete"
    stored = {r["id"]: r for r in pl.read_parquet(tmp_path / "run" / "shards").iter_rows(named=True)}
    assert stored["match"]["tool_divergence"] is None and len(stored["match"]["turn_after"]) == 3
    target = generated_calls(stored["match"], 3)[0]
    # the match's second request: the target's own call, then the source's result re-addressed to it
    second = [
        c
        for c in chats
        if any(m.get("tool_calls") and m["tool_calls"][0]["id"] == target[0]["id"] for m in c["messages"])
    ]
    assert second
    for request in second:
        assert [m.get("tool_call_id") for m in request["messages"] if m["role"] == "tool"] == [
            target[0]["id"]
        ]
        assert "m-0" not in json.dumps(request)  # the source's call id is gone with the source's call
    reasons = {}
    for prompt_id, turn in (("other-arguments", 0), ("no-second-call", 1), ("text-answer", 0)):
        row = stored[prompt_id]
        divergence = json.loads(row["tool_divergence"])
        assert divergence["turn"] == turn and len(row["turn_after"]) == turn + 1, prompt_id
        assert (
            row["turn_after"][-1] == divergence["after"] == len(row["messages"]) - 1
        )  # stored up to that answer
        assert divergence["target"] == list(generated_calls(row, turn + 1)[turn]), prompt_id
        reasons[prompt_id] = divergence["reason"]
    assert "with other arguments" in reasons["other-arguments"]
    assert reasons["no-second-call"] == "the target answered without calling get_weather"
    assert "where the source answered in text" in reasons["text-answer"]
    # nothing was sent past a divergence: no request of other-arguments holds its source's result
    assert not any("snow" in json.dumps(c) for c in chats)


def test_a_fleet_told_to_diverge_ends_every_matching_conversation_at_its_first_call(sim_fleet, tmp_path):
    rows = [agent_loop(f"loop-{i}", f"question {i} about tides", f"result {i}") for i in range(12)]
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = sim_fleet(servers=1, profile="instant", faults=["tool_divergence_rate=1"])
    outcome = run(config_for(fleet, prompts, tmp_path / "run", max_tokens=2048))
    assert outcome.status == "complete" and outcome.completed == 12
    for row in pl.read_parquet(tmp_path / "run" / "shards").iter_rows(named=True):
        divergence = json.loads(row["tool_divergence"])
        assert (divergence["turn"], divergence["turns_left"]) == (0, 2), row["id"]
        assert json.loads(divergence["target"][0]["function"]["arguments"])["topic"].endswith(" 2")


# ----- the tool canary -------------------------------------------------------------------------------------------
def test_a_server_returning_calls_as_text_fails_preflight_when_the_prompts_have_tools(sim_fleet, tmp_path):
    with_tools = write_rows(tmp_path / "tools.jsonl", [agent_loop("a", "question about tides", "r")])
    without = write_rows(tmp_path / "plain.jsonl", [{"id": "p", "prompt": "hello"}])
    raw = sim_fleet(servers=1, profile="instant", tool_call_parser=None)
    with pytest.raises(PreflightError, match="tool canary") as failed:
        asyncio.run(preflight(config_for(raw, with_tools, tmp_path / "a", canary=True)))
    assert "came back as text in content" in str(failed.value) and "--tool-call-parser" in str(failed.value)
    plan = asyncio.run(preflight(config_for(raw, without, tmp_path / "b", canary=True)))  # no tools: no check
    assert not any(c.check == "tool canary" for c in plan.checks)
    plan.release()
    parsed = sim_fleet(servers=1, profile="instant")
    plan = asyncio.run(preflight(config_for(parsed, with_tools, tmp_path / "c", canary=True)))
    assert [c.status for c in plan.checks if c.check == "tool canary"] == ["ok"]
    plan.release()


# ----- a client killed mid-conversation --------------------------------------------------------------------------
@pytest.mark.slow  # started first (tests/long_first.py)
def test_client_sigkilled_mid_agentic_conversation_then_resumed_stores_each_once_results_spliced(
    sim_fleet, tmp_path
):
    # 40 conversations: 20 stored (two shards of 10) when the client dies, 16 of the rest in flight then
    rows = [agent_loop(f"loop-{i:03d}", f"question {i} about tides", f"result {i}") for i in range(40)]
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=25.0)
    params = base_params(fleet, prompts, max_truncated_rate=1.0, batch_save_size=10, max_tokens=4096)
    run_dir = tmp_path / "run"
    killed_at = sigkill_client_after_shards(run_dir, params, 2)
    before = {r["id"] for r in pl.read_parquet(run_dir / "shards").rows(named=True)}
    assert 0 < len(before) < len(rows)
    assert generate_here(run_dir, params).result.status == "complete"  # the resume
    final = pl.read_parquet(run_dir / "shards").rows(named=True)
    ids = [r["id"] for r in final]
    assert len(ids) == len(set(ids)) and set(ids) == {r["id"] for r in rows}
    spliced = 0
    for row in final:
        turns = len(row["turn_after"])
        assert turns == len(answer_points(row["messages"], "all"))
        assert (
            turns == 3 or row["tool_divergence"] is not None
        )  # a first answer cut before its call ends there
        for turn in range(
            turns
        ):  # each turn's prompt as sent: the target's calls, the results spliced after them
            assert row["turn_prompt_tokens"][turn] == expected_prompt_tokens(fleet, row, turn), (
                row["id"],
                turn,
            )
        spliced += turns == 3
    assert spliced > len(rows) // 2
    # The kill came mid-conversation: a conversation not stored before the kill had its first answer (the call)
    # back before it, so the dead client held it part-way. (A first turn's request is the same in both sessions;
    # later turns carry the target's call ids, new on every regeneration, so they are not matched here.)
    first = {sent_seed(row, 0): row["id"] for row in final}
    answered_early = {
        first[r["seed"]]
        for r in fleet.truth()
        if r.get("kind") == "chat"
        and r.get("seed") in first
        and r["outcome"] == "ok"
        and r["finished"] < killed_at
    }
    assert answered_early - before, "no agentic conversation was part-way when the client died"
    assert read_manifest(run_dir)["status"] == "complete"
    assert LOOKUP in json.loads(final[0]["tools"])
