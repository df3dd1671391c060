"""Multi-turn generation (``turns: all``): every assistant turn regenerated in order, each request carrying the
target's own earlier answers; stored once per conversation, resumable, failures naming the turn."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from generate_helpers import generate_here, sigkill_client_after_shards
from sim_helpers import prompt_count
from test_generate_notebook import base_params

from draftgen.client.records import ChatResult
from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.generate.store import FAILED, read_done_ids, read_manifest
from draftgen.generate.turns import Conversation
from draftgen.params import ParameterError, build_config
from draftgen.prompts.rows import PromptRow, RejectedRow, iter_prompts, normalize_record
from draftgen.prompts.synthetic import synthetic_rows
from draftgen.sim.textgen import request_seed
from draftgen.sim.toolcalls import planned_calls
from draftgen.training.conversation import (
    Answer,
    answer_points,
    assemble,
    generated_calls,
    request_messages,
    stored_messages,
    stored_tools,
)
from draftgen.training.tools import wire_messages

MODEL = "Qwen/Qwen3.6-27B"
SOURCE_MARK = "SOURCE-ANSWER"  # every source assistant message in the test prompts carries it


def u(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": f"{SOURCE_MARK} {text}"}


def conversations(count: int, seed: int) -> list[dict]:
    """Deterministic prompts: 1 to 3 answer points, system prompts, a tool loop, ShareGPT-style endings."""
    rows = []
    for index in range(count):
        shape = index % 5
        q = f"question {index} about topic {seed}-{index % 7}"
        if shape == 0:
            messages = [u(q)]
        elif shape == 1:
            messages = [u(q), a("one"), u(f"follow-up {index}")]
        elif shape == 2:
            messages = [
                {"role": "system", "content": "be brief"},
                u(q),
                a("one"),
                u("and then?"),
                a("two"),
                u("why?"),
            ]
        elif shape == 3:  # ShareGPT rows end with the answer: dropped and regenerated
            messages = [u(q), a("one"), u(f"more on {index}"), a("final")]
        else:  # an agent loop: the assistant's tool call, the result, the assistant's reply, a new question
            rows.append(agent_loop(f"mt-{seed}-{index:04d}", q, f"result {index}"))
            continue
        rows.append({"id": f"mt-{seed}-{index:04d}", "messages": messages})
    return rows


LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_topic",
        "parameters": {"type": "object", "properties": {"topic": {"type": "string"}}},
    },
}


def agent_loop(prompt_id: str, question: str, result: str) -> dict:
    """A question the source answered with a tool call, the tool's result, the source's reply, a new question. The
    source's call is the one the simulator makes for the question (draftgen.sim.toolcalls), so the target's call
    matches it and the result is spliced in: three answer points, every one generated."""
    call = planned_calls([LOOKUP], [u(question)])[0]
    source_call = {
        "id": f"call-{prompt_id}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }
    messages = [
        u(question),
        {"role": "assistant", "content": f"{SOURCE_MARK} calling the tool", "tool_calls": [source_call]},
        {"role": "tool", "tool_call_id": f"call-{prompt_id}", "content": result},
        a("done"),
        u("thanks, now?"),
    ]
    return {"id": prompt_id, "tools": [LOOKUP], "messages": messages}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config_for(fleet, prompts: Path, out_dir: Path, **changes: object) -> GenerateConfig:
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": MODEL,
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "max_tokens": 256,
        "concurrency_per_server": 6,
        "batch_save_size": 40,
        "max_truncated_rate": 1.0,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.2,
        "canary": False,
        "hedge_slow_ratio": 0.0,  # requests are counted on the servers: no tail copies
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


def run(config: GenerateConfig):
    async def go():
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    return asyncio.run(go())


def sent_messages(row: dict, turn: int) -> tuple[dict[str, str], ...]:
    """The messages of ``turn``'s request if it carried the target's own earlier answers (and calls)."""
    points = row["turn_after"]
    calls = generated_calls(row, len(points))
    earlier = [
        (p, Answer(content, made))
        for p, content, made in zip(points[:turn], row["turn_content"][:turn], calls[:turn], strict=True)
    ]
    return request_messages(stored_messages(row), points[turn], earlier, row["turns_mode"])


def expected_prompt_tokens(fleet, row: dict, turn: int) -> int:
    """What the server must have counted for ``turn`` if it was sent the target's own earlier answers."""
    return prompt_count(fleet, list(sent_messages(row, turn)), True, stored_tools(row))


def source_history_tokens(fleet, row: dict, turn: int) -> int:
    """What the server would have counted had the source's own assistant text been sent instead."""
    sent = stored_messages(row)[: row["turn_after"][turn] + 1]
    return prompt_count(fleet, list(sent), True, stored_tools(row))


def sent_seed(row: dict, turn: int) -> int:
    """The simulator's seed of ``turn``'s request: a hash of the messages as sent (and the tools)."""
    payload = {"messages": wire_messages(sent_messages(row, turn)), "thinking": True}
    if row.get("tools"):
        payload["tools"] = stored_tools(row)
    return request_seed(payload, None)


def chat_records(fleet) -> list[dict]:
    return [r for r in fleet.truth() if r["kind"] == "chat" and r["outcome"] == "ok"]


# ----- units ------------------------------------------------------------------------------------------------
def result(content: str, tokens: int | None, accept: float | None, server: str = "http://s") -> ChatResult:
    return ChatResult(
        server=server,
        response_id=f"r-{content}",
        reasoning_content=f"thinking {content}",
        content=content,
        finish_reason="stop" if tokens != 99 else "length",
        prompt_tokens=10 * (tokens or 1),
        completion_tokens=tokens,
        usage_reported=tokens is not None,
        spec_accept_length=accept,
        spec_verify_ct=None if accept is None else (tokens or 0) // 3,
        started_at=100.0 + (tokens or 0),
        latency_s=2.0,
    )


def test_a_conversation_asks_turn_by_turn_with_its_own_answers_and_aggregates_the_row():
    messages = ({"role": "system", "content": "s"}, u("q1"), a("x"), u("q2"), a("y"), u("q3"))
    conversation = Conversation(PromptRow("c", messages, 3), "all")
    assert (conversation.turns, conversation.turn, conversation.label()) == (3, 0, "c (turn 1/3)")
    assert conversation.request() == (messages[0], messages[1])
    conversation.record(result("one", 30, 2.0), attempts=2)
    assert conversation.request() == (
        messages[0],
        messages[1],
        {"role": "assistant", "content": "one"},
        messages[3],
    )
    conversation.record(result("two", 10, 4.0), attempts=1)
    assert [m["content"] for m in conversation.request()] == ["s", "q1", "one", "q2", "two", "q3"]
    with pytest.raises(RuntimeError, match="before its last turn"):
        conversation.output_row()
    conversation.record(result("three", 99, None, server="http://last"), attempts=1)
    assert conversation.finished
    row = conversation.output_row()
    assert row["turn_after"] == [1, 3, 5] and row["turns_mode"] == "all"
    assert row["turn_content"] == ["one", "two", "three"]
    assert row["turn_completion_tokens"] == [30, 10, 99] and row["completion_tokens"] == 139
    assert row["spec_accept_length"] == pytest.approx((2.0 * 30 + 4.0 * 10) / 40)  # reported turns, by tokens
    assert row["spec_verify_ct"] == 10 + 3
    assert (row["content"], row["finish_reason"], row["server"], row["prompt_tokens"]) == (
        "three",
        "length",
        "http://last",
        990,
    )
    assert (row["attempts"], row["latency_s"], row["started_at"]) == (4, 6.0, 130.0)
    with pytest.raises(RuntimeError, match="after its last turn"):
        conversation.record(result("four", 1, None), attempts=1)


def test_turns_last_is_one_request_with_the_history_as_given():
    messages = (u("q1"), a("x"), u("q2"))
    conversation = Conversation(PromptRow("c", messages, 1), "last")
    assert conversation.turns == 1 and conversation.label() == "c"
    assert conversation.request() == messages


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (
            {"messages": [{"role": "tool", "content": "42"}, u("q")]},
            "messages[0] is a tool turn without a preceding assistant tool call (it follows the start)",
        ),
        (
            {"messages": [u("q"), {"role": "tool", "content": "42"}]},
            "messages[1] is a tool turn without a preceding assistant tool call (it follows a user turn)",
        ),
        (  # a tool result after an assistant message that called nothing: a result nobody asked for
            {"messages": [u("q"), a("call"), {"role": "tool", "content": "1"}]},
            "messages[2] is a tool turn without a preceding assistant tool call (it follows an assistant turn "
            "without tool calls)",
        ),
        ({"messages": [u("q"), a("x"), u("  "), a("y"), u("q2")]}, "messages[2] is an empty user turn"),
        (
            {
                "conversations": [
                    {"from": "human", "value": ""},
                    {"from": "gpt", "value": "x"},
                    {"from": "human", "value": "q"},
                ]
            },
            "conversations[0] is an empty user turn",
        ),
    ],
)
def test_bad_conversations_are_rejected_with_the_reason(record, reason):
    rejected = normalize_record(record, 5)
    assert isinstance(rejected, RejectedRow) and rejected.row == 5
    assert reason in rejected.reason


@pytest.mark.parametrize(
    "record",
    [
        {
            "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "the answer"}]
        },  # ShareGPT
        {
            "tools": [LOOKUP],
            "messages": [
                u("q"),
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "lookup_topic", "arguments": "{}"}},
                        {"function": {"name": "lookup_topic", "arguments": {"topic": "b"}}},
                    ],
                },
                {"role": "tool", "content": "1"},
                {"role": "tool", "content": "2"},
            ],
        },
        {"messages": [u("q"), a("x"), u("q2"), a("y")]},
    ],
)
def test_good_conversations_are_kept_and_trailing_answers_dropped(record):
    row = normalize_record(record, 1)
    assert isinstance(row, PromptRow)
    assert row.messages[-1]["role"] in ("user", "tool")


def test_a_file_of_bad_conversations_streams_rejections_never_raises(tmp_path):
    rows = [
        {"id": "ok", "messages": [u("q")]},
        {"id": "tool", "messages": [{"role": "tool", "content": "x"}]},
        {"id": "empty", "messages": [u(""), a("x"), u("q")]},
    ]
    items = list(iter_prompts(write_rows(tmp_path / "p.jsonl", rows)))
    assert [type(i).__name__ for i in items] == ["PromptRow", "RejectedRow", "RejectedRow"]
    assert [i.id for i in items] == ["ok", "tool", "empty"]


def test_turns_parameter_and_fingerprint(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", conversations(3, 0))
    values = {
        "servers": ["http://x:1"],
        "model": MODEL,
        "prompts": str(prompts),
        "out_dir": str(tmp_path / "r"),
    }
    assert build_config(GenerateConfig, values).turns == "all"
    with pytest.raises(ParameterError, match="turns"):
        build_config(GenerateConfig, {**values, "turns": "every"})
    last = build_config(GenerateConfig, {**values, "turns": "last"})
    everything = build_config(GenerateConfig, values)
    assert last.fingerprint() != everything.fingerprint()
    assert last.fingerprint_fields()["turns"] == "last"


# ----- on the simulated fleet ---------------------------------------------------------------------------------
def test_every_turn_stored_once_each_request_carrying_the_models_own_answers(instant_fleet, tmp_path):
    rows = conversations(60, seed=1) + list(synthetic_rows(140, seed=21))
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = instant_fleet(2)
    before = len(chat_records(fleet))
    outcome = run(config_for(fleet, prompts, tmp_path / "run"))
    assert outcome.status == "complete" and outcome.completed == len(rows)

    stored = pl.read_parquet(tmp_path / "run" / "shards").rows(named=True)
    assert sorted(r["id"] for r in stored) == sorted(r["id"] for r in rows)
    total_turns = 0
    own_differs = later_turns = 0
    for row in stored:
        points = answer_points(row["messages"], "all")
        assert row["turn_after"] == list(points), row["id"]
        assert row["turns_mode"] == "all"
        for column in ("turn_content", "turn_reasoning", "turn_finish_reason", "turn_prompt_tokens"):
            assert len(row[column]) == len(points), (row["id"], column)
        for turn in range(len(points)):
            assert row["turn_prompt_tokens"][turn] == expected_prompt_tokens(fleet, row, turn), (
                row["id"],
                turn,
            )
            if turn > 0:
                later_turns += 1
                own_differs += expected_prompt_tokens(fleet, row, turn) != source_history_tokens(
                    fleet, row, turn
                )
        total_turns += len(points)
        assembled = assemble(row)
        assert all(t.generated for t in assembled if t.role == "assistant"), row["id"]
        assert not any(SOURCE_MARK in t.content for t in assembled), row["id"]
        assert not any("Here is a short answer" in t.content for t in assembled), row["id"]  # synthetic's
    assert total_turns > len(rows) * 1.4  # the set really is multi-turn
    assert own_differs > later_turns * 0.9  # the check above tells our history from the source's
    assert outcome.outcome.turns == total_turns
    # The servers answered each turn exactly once: no request was sent twice, none is missing.
    assert len(chat_records(fleet)) - before == total_turns + 2  # + one preflight probe per server
    # ... each turn's own request exactly once (the simulator records a hash of the messages it was sent)
    seeds = Counter(r["seed"] for r in chat_records(fleet))
    for row in stored:
        for turn in range(len(row["turn_after"])):
            seed = sent_seed(row, turn)
            assert seeds[seed] == 1, (row["id"], turn, seeds[seed])
    summary = read_manifest(tmp_path / "run")["sessions"][-1]
    assert (summary["completed"], summary["turns"]) == (len(rows), total_turns)


def test_turns_last_keeps_todays_behaviour(instant_fleet, tmp_path):
    rows = conversations(30, seed=2)
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = instant_fleet()
    outcome = run(config_for(fleet, prompts, tmp_path / "run", turns="last"))
    assert outcome.completed == 30 and outcome.outcome.turns == 30
    for row in pl.read_parquet(tmp_path / "run" / "shards").rows(named=True):
        assert row["turn_after"] == [len(row["messages"]) - 1] and row["turns_mode"] == "last"
        assert row["prompt_tokens"] == prompt_count(fleet, stored_messages(row), True, stored_tools(row))
        assert row["turn_content"] == [row["content"]]


def test_a_failed_turn_sends_the_conversation_to_failed_parquet_with_its_turn(instant_fleet, tmp_path):
    # Turn 1 fits the instant profile's 32,768-token context; turn 2's question does not: a 400, not retried.
    huge = "x " * 33_000
    rows = [*conversations(10, seed=3), {"id": "too-long", "messages": [u("short"), a("x"), u(huge)]}]
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = instant_fleet()
    outcome = run(config_for(fleet, prompts, tmp_path / "run"))
    assert outcome.status == "complete_with_failures" and outcome.failed == 1
    failed = pl.read_parquet(tmp_path / "run" / FAILED).row(0, named=True)
    assert (failed["id"], failed["turn"], failed["status"], failed["attempts"]) == ("too-long", 1, 400, 1)
    assert "context length" in failed["error"]
    assert "too-long" not in read_done_ids(tmp_path / "run").to_list()


def test_kill_9_mid_conversation_then_resume_stores_every_turn_once(sim_fleet, tmp_path):
    rows = [
        r
        for r in conversations(200, seed=4)  # 160 with later turns: 100 stored at the kill
        if len(answer_points(normalize_record(r, 1).messages, "all")) > 1
    ]
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=20.0)
    params = base_params(fleet, prompts, max_truncated_rate=1.0, batch_save_size=50, max_tokens=192)
    run_dir = tmp_path / "run"
    killed_at = sigkill_client_after_shards(run_dir, params, 2)
    stored = {r["id"] for r in pl.read_parquet(run_dir / "shards").rows(named=True)}
    assert 0 < len(stored) < len(rows)

    assert generate_here(run_dir, params).result.status == "complete"  # the resume
    final = pl.read_parquet(run_dir / "shards").rows(named=True)
    ids = [r["id"] for r in final]
    assert len(ids) == len(set(ids)) and set(ids) == {r["id"] for r in rows}
    for row in final:
        # an agent loop whose first answer was cut before its call (max_tokens 192) ends there, flagged
        assert len(row["turn_content"]) == len(answer_points(row["messages"], "all"))
        assert len(row["turn_content"]) >= 2 or row["tool_divergence"] is not None
        for turn in range(len(row["turn_after"])):
            assert row["turn_prompt_tokens"][turn] == expected_prompt_tokens(fleet, row, turn), (
                row["id"],
                turn,
            )
    # The kill really came mid-conversation: some conversation stored only after the resume had a later turn's
    # request sent before the kill (so its earlier answers were in the dead client's memory) and its last turn
    # not answered before the kill. The simulator records each request's seed, a hash of the messages it got.
    turn_of: dict[int, tuple[str, int]] = {}
    last_turn = {row["id"]: len(row["turn_after"]) - 1 for row in final}
    for row in final:
        for turn in range(len(row["turn_after"])):
            turn_of[sent_seed(row, turn)] = (row["id"], turn)
    sent: dict[str, dict[int, float]] = {}
    answered: dict[str, dict[int, float]] = {}
    for record in fleet.truth():
        if record.get("kind") != "chat" or record.get("seed") not in turn_of:
            continue
        prompt_id, turn = turn_of[record["seed"]]
        times = sent.setdefault(prompt_id, {})
        times[turn] = min(record["arrival"], times.get(turn, float("inf")))
        if record["outcome"] == "ok":
            done = answered.setdefault(prompt_id, {})
            done[turn] = min(record["finished"], done.get(turn, float("inf")))
    assert sum(len(t) for t in sent.values()) == sum(len(r["turn_after"]) for r in final)  # every turn seen
    mid = [
        prompt_id
        for prompt_id, turns in sent.items()
        if prompt_id not in stored
        and any(t >= 1 and at < killed_at for t, at in turns.items())
        and answered.get(prompt_id, {}).get(last_turn[prompt_id], float("inf")) >= killed_at
    ]
    assert mid, "the kill came between conversations: no conversation was part-way"
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "complete"
    assert manifest["sessions"][-1]["completed"] == len(rows) - len(stored)


def test_the_estimate_counts_one_request_per_answer_with_turns_all(tmp_path):
    from draftgen.estimate.inputs import dataset_size

    rows = conversations(10, seed=5)  # shapes 0..4 twice: 1, 2, 3, 2, 3 answer points
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    assert dataset_size(0, prompts, 0, "last") == (10, f"rows of {prompts}")
    requests, source = dataset_size(0, prompts, 0, "all")
    assert requests == 22 and "x 2.200 answers each (turns: all)" in source
    assert dataset_size(0, prompts, 3, "all")[0] == 6  # the first three prompts: 1 + 2 + 3 answers
    assert dataset_size(1000, prompts, 0, "all")[0] == 2200  # a given size scaled by the file's mean


def test_work_under_way_is_served_before_fresh_prompts():
    from draftgen.generate.work import TurnState, Work, WorkQueue

    def item(name: str, fresh: bool) -> Work:
        state = TurnState.FRESH if fresh else TurnState.QUEUED
        return Work(Conversation(PromptRow(name, (u("q"),), 1), "all"), state=state)

    async def order() -> list[str]:
        queue = WorkQueue()
        assert queue.empty()
        for name, fresh in (("new-1", True), ("new-2", True), ("next-turn", False), ("retry", False)):
            queue.put_nowait(item(name, fresh))
        assert queue.qsize() == 4 and not queue.empty()
        return [(await queue.get("http://s")).conversation.id for _ in range(4)]

    assert asyncio.run(order()) == ["next-turn", "retry", "new-1", "new-2"]


def test_the_estimate_runs_a_conversations_turns_one_after_another():
    import numpy as np

    from draftgen.estimate.conversations import Conversations
    from draftgen.estimate.model import RateModel, estimate_wall

    rate = RateModel(0.02, 0.001, 8, "test")
    lengths = np.full(50, 500.0)  # every request the same length: the draw cannot move the result

    def wall(turns):  # 10 requests on one server with 4 slots
        conversations = None if turns is None else Conversations.uncapped({turns: 1})
        return estimate_wall(lengths, 10, 1, 4, rate, np.random.default_rng(0), conversations=conversations)

    independent, one_each, chained = wall(None), wall(1), wall(5)
    assert one_each.wall_s == pytest.approx(independent.wall_s)
    assert chained.steady_s == pytest.approx(independent.steady_s)  # the same tokens at the same full rate
    # independent: three rounds on four slots; two conversations of five: two slots busy for five rounds
    assert chained.wall_s > 1.4 * independent.wall_s, (chained.wall_s, independent.wall_s)
