"""draftgen.training.conversation: answer points, per-turn request histories and assembled rows (the multi-turn contract)."""

from __future__ import annotations

import polars as pl
import pytest

from draftgen.client.records import ChatResult
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.generate.turns import Conversation
from draftgen.prompts.rows import PromptRow
from draftgen.training.conversation import Turn, answer_points, assemble, request_messages


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


SYS = msg("system", "be brief")
U1, U2, U3 = msg("user", "first question"), msg("user", "second question"), msg("user", "third question")
A1, A2 = msg("assistant", "SOURCE ANSWER ONE"), msg("assistant", "SOURCE ANSWER TWO")
THREE_TURNS = [SYS, U1, A1, U2, A2, U3]


@pytest.mark.parametrize(
    ("messages", "mode", "points"),
    [
        ([U1], "all", (0,)),
        ([U1], "last", (0,)),
        ([U1, A1, U2], "all", (0, 2)),
        ([U1, A1, U2], "last", (2,)),
        (THREE_TURNS, "all", (1, 3, 5)),
        (THREE_TURNS, "last", (5,)),
        # an agent loop: the assistant's tool call, the tool's result, the assistant's reply, a new question
        ([U1, A1, msg("tool", "42"), A2, U2], "all", (0, 2, 4)),
        # two user messages in a row are one run: answered once, after the second
        ([U1, U2, A1, U3], "all", (1, 3)),
        # a greeting after the system prompt answers nobody: no answer point before it
        ([SYS, A1, U1], "all", (2,)),
        # two source assistant messages in a row are replaced by one answer
        ([U1, A1, A2, U2], "all", (0, 3)),
    ],
)
def test_answer_points(messages, mode, points):
    assert answer_points(messages, mode) == points


@pytest.mark.parametrize(
    ("messages", "mode", "error"),
    [
        ([], "all", "empty conversation"),
        ([U1, A1], "all", "ends with an assistant message"),
        ([U1], "every", "must be one of all, last"),
    ],
)
def test_answer_points_rejects(messages, mode, error):
    with pytest.raises(ValueError, match=error):
        answer_points(messages, mode)


def test_each_turn_request_carries_the_targets_own_earlier_answers_and_no_source_answer():
    first = request_messages(THREE_TURNS, 1, [])
    assert first == (SYS, U1)
    second = request_messages(THREE_TURNS, 3, [(1, "MINE ONE")])
    assert second == (SYS, U1, msg("assistant", "MINE ONE"), U2)
    third = request_messages(THREE_TURNS, 5, [(1, "MINE ONE"), (3, None)])
    assert third == (SYS, U1, msg("assistant", "MINE ONE"), U2, msg("assistant", ""), U3)
    assert not any("SOURCE" in m["content"] for m in first + second + third)


def test_mode_last_sends_the_source_history_as_given():
    assert request_messages(THREE_TURNS, 5, [], mode="last") == tuple(THREE_TURNS)


@pytest.mark.parametrize(
    ("turn_after", "earlier", "mode", "error"),
    [
        (6, [], "all", "outside the conversation"),
        (3, [(3, "x")], "all", "does not come before"),
        (5, [(1, "x"), (1, "y")], "all", "exactly once"),
        (5, [(1, "x")], "last", "no earlier answers"),
    ],
)
def test_request_messages_rejects_inconsistent_turns(turn_after, earlier, mode, error):
    with pytest.raises(ValueError, match=error):
        request_messages(THREE_TURNS, turn_after, earlier, mode=mode)


def all_row(**changes):
    row = {
        "id": "c1",
        "messages": THREE_TURNS,
        "turn_after": [1, 3, 5],
        "turn_content": ["gen one", "gen two", "gen three"],
        "turn_reasoning": ["think one", None, "think three"],
        "turns_mode": "all",
        "content": "gen three",
        "reasoning_content": "think three",
    }
    row.update(changes)
    return row


def test_assemble_all_replaces_every_source_answer_with_the_generated_one():
    turns = assemble(all_row())
    assert turns == [
        Turn("system", "be brief"),
        Turn("user", "first question"),
        Turn("assistant", "gen one", "think one", generated=True, turn=0),
        Turn("user", "second question"),
        Turn("assistant", "gen two", "", generated=True, turn=1),
        Turn("user", "third question"),
        Turn("assistant", "gen three", "think three", generated=True, turn=2),
    ]
    assert all(t.generated for t in turns if t.role == "assistant")


def test_assemble_last_keeps_source_answers_marked_not_generated():
    row = all_row(turn_after=[5], turn_content=["gen"], turn_reasoning=["think"], turns_mode="last")
    turns = assemble(row)
    assistants = [t for t in turns if t.role == "assistant"]
    assert [(t.content, t.generated, t.reasoning_content) for t in assistants] == [
        ("SOURCE ANSWER ONE", False, None),
        ("SOURCE ANSWER TWO", False, None),
        ("gen", True, "think"),
    ]
    assert [t.content for t in turns[:-1]] == [m["content"] for m in THREE_TURNS]


def test_assemble_reads_rows_from_before_the_turn_columns_as_one_final_turn():
    row = {"id": "old", "messages": [U1, A1, U2], "content": "answer", "reasoning_content": "why"}
    turns = assemble(row)
    assert turns[-1] == Turn("assistant", "answer", "why", generated=True, turn=0)
    assert turns[1] == Turn("assistant", "SOURCE ANSWER ONE")  # kept: a 'last' row


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"turn_content": ["a", "b"]}, "3 turn_after entries, 2 turn_content"),
        ({"turn_after": [], "turn_content": [], "turn_reasoning": []}, "at least one"),
        ({"turn_after": [3, 1, 5]}, "must increase"),
        ({"turn_after": [1, 3, 4]}, "must increase and end at the last"),
        ({"turn_after": [1, 2, 5]}, "points at a source assistant message"),
        ({"turns_mode": "some"}, "turns_mode 'some'"),
    ],
)
def test_assemble_names_the_row_whose_turn_columns_do_not_fit(changes, error):
    with pytest.raises(ValueError, match=error) as raised:
        assemble(all_row(**changes))
    assert "row c1" in str(raised.value)


def result(content: str, reasoning: str) -> ChatResult:
    return ChatResult(
        server="http://s",
        response_id="r",
        reasoning_content=reasoning,
        content=content,
        finish_reason="stop",
        prompt_tokens=12,
        completion_tokens=30,
        usage_reported=True,
        spec_accept_length=3.5,
        spec_verify_ct=9,
        started_at=1.0,
        latency_s=2.0,
    )


def test_single_turn_rows_fill_the_turn_columns_with_one_element_and_survive_parquet(tmp_path):
    conversation = Conversation(PromptRow("p1", (U1, A1, U2), 7), "last")
    conversation.record(result("the answer", "the thinking"), 1)
    row = conversation.output_row()
    path = tmp_path / "part.parquet"
    pl.DataFrame([row], schema=OUTPUT_SCHEMA).write_parquet(path)
    stored = pl.read_parquet(path).row(0, named=True)
    assert stored["turn_after"] == [2] and stored["turns_mode"] == "last"
    assert stored["turn_content"] == ["the answer"] and stored["turn_completion_tokens"] == [30]
    assert stored["turn_spec_accept_length"] == [3.5] and stored["turn_spec_verify_ct"] == [9]
    assert assemble(stored)[-1] == Turn("assistant", "the answer", "the thinking", generated=True, turn=0)


def test_old_shards_without_turn_columns_still_read_and_assemble(tmp_path):
    old_schema = {k: v for k, v in OUTPUT_SCHEMA.items() if not k.startswith("turn")}
    path = tmp_path / "old.parquet"
    pl.DataFrame(
        [{"id": "o", "messages": [U1], "content": "c", "reasoning_content": "r"}], schema=old_schema
    ).write_parquet(path)
    stored = pl.read_parquet(path).row(0, named=True)
    assert assemble(stored) == [Turn("user", "first question"), Turn("assistant", "c", "r", True, 0)]


def test_a_run_folder_mixing_old_and_new_shards_reads_ids_and_report(tmp_path):
    from draftgen.generate.report import scan_results
    from draftgen.generate.store import read_done_ids

    (tmp_path / "shards").mkdir()
    old_schema = {k: v for k, v in OUTPUT_SCHEMA.items() if not k.startswith("turn")}
    base = {"messages": [U1], "content": "c", "reasoning_content": "r", "completion_tokens": 5}
    pl.DataFrame([{**base, "id": "old"}], schema=old_schema).write_parquet(
        tmp_path / "shards/part-000001.parquet"
    )
    conversation = Conversation(PromptRow("new", (U1,), 2), "all")
    conversation.record(result("c", "r"), 1)
    new = conversation.output_row()
    pl.DataFrame([new], schema=OUTPUT_SCHEMA).write_parquet(tmp_path / "shards/part-000002.parquet")
    assert sorted(read_done_ids(tmp_path).to_list()) == ["new", "old"]
    assert scan_results(tmp_path).collect()["completion_tokens"].to_list() == [5, 30]
