"""Nothing generated past what the trainer keeps: each turn's max_tokens is min(max_tokens, max_length − prompt).

The rule (``draftgen.generate.length_cap``) with a fake counter; dispatch's use of it with fake servers on a virtual
clock (the cap sent, retries sending the same, a turn that could train nothing set aside, not sent); and one run on
the simulator, whose ground truth records every request's max_tokens and prompt tokens.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest
from dispatch_fakes import FakeServer, Reply, dispatch, prompts

from draftgen.client.errors import RequestError
from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.generate.length_cap import LengthCap, tokenizer_counter
from draftgen.params import build_config
from draftgen.prompts.rows import PromptRow
from draftgen.sim.tokenizer import SimTokenizer

MAX_TOKENS = 100


def words(messages, enable_thinking: bool, tools=None) -> int:
    """A fake tokenizer: one token per word, and 10 for the template's own text around them."""
    return 10 + sum(len(str(m["content"]).split()) for m in messages)


def fake_config(**changes: object) -> GenerateConfig:
    values: dict[str, object] = {
        "servers": ["http://a", "http://b"],
        "model": "m",
        "prompts": "synthetic",
        "out_dir": "/tmp/unused",
        "max_tokens": MAX_TOKENS,
        "concurrency_per_server": 2,
        "backoff_base_s": 1.0,
        "backoff_max_s": 2.0,
        "hedge_slow_ratio": 0.0,
        "server_silence_s": 0.0,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


def row(prompt_id: str, *questions: str) -> PromptRow:
    messages: list[dict[str, str]] = []
    for i, question in enumerate(questions):
        if i:
            messages.append({"role": "assistant", "content": "an older answer"})
        messages.append({"role": "user", "content": f"{prompt_id} {question}"})
    return PromptRow(prompt_id, tuple(messages), 1)


# ----- the rule ------------------------------------------------------------------------------------------------
def test_the_cap_is_max_length_minus_the_prompt_and_never_above_max_tokens():
    cap = LengthCap(200, words)
    short = cap.limit([{"role": "user", "content": "one two three"}], MAX_TOKENS, True)  # 13 tokens
    assert (short.prompt_tokens, short.max_tokens, short.capped, short.trains_nothing) == (
        13,
        100,
        False,
        False,
    )
    long = cap.limit([{"role": "user", "content": " ".join(["w"] * 150)}], MAX_TOKENS, True)  # 160 tokens
    assert (long.prompt_tokens, long.max_tokens, long.capped, long.trains_nothing) == (160, 40, True, False)
    full = cap.limit([{"role": "user", "content": " ".join(["w"] * 190)}], MAX_TOKENS, True)  # 200: no room
    assert (full.max_tokens, full.trains_nothing) == (0, True)
    assert "200 tokens" in full.reason(200) and "train_max_length" in full.reason(200)
    over = cap.limit([{"role": "user", "content": " ".join(["w"] * 250)}], MAX_TOKENS, True)
    assert over.trains_nothing and over.max_tokens < 0

    def unrenderable(messages, enable_thinking: bool, tools=None) -> int:
        raise ValueError("the chat template raised: no user message")

    sent = LengthCap(200, unrenderable).limit([{"role": "system", "content": "x"}], MAX_TOKENS, True)
    assert (sent.prompt_tokens, sent.max_tokens, sent.trains_nothing) == (None, MAX_TOKENS, False)


def test_the_tokenizer_counts_the_prompt_as_the_simulated_server_renders_it(sim_tokenizer_dir):
    count = tokenizer_counter(sim_tokenizer_dir)
    server = SimTokenizer(sim_tokenizer_dir)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3, with a longer question that has more words in it?"},
    ]
    for thinking in (True, False):
        expected = len(server.encode(server.render(messages, enable_thinking=thinking)))
        assert count(messages, thinking) == expected
    assert count(messages, True) != count(messages[:2], True)


def test_a_folder_that_is_no_tokenizer_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        tokenizer_counter(tmp_path)


# ----- dispatch with the cap -----------------------------------------------------------------------------------
def test_each_request_is_sent_with_the_cap_and_a_prompt_past_max_length_is_set_aside():
    cap = LengthCap(120, words)
    rows = [
        row("short", "a b c"),  # 10 + 4 = 14 tokens: max_tokens 100 stays
        row("long", " ".join(["w"] * 80)),  # 91 tokens: capped at 29
        row("full", " ".join(["w"] * 109)),  # 120 tokens: nothing could train
    ]
    servers = [FakeServer("http://a"), FakeServer("http://b")]
    outcome, recorder, _ = dispatch(fake_config(), servers, rows, length_cap=cap)
    sent = {r.prompt_id: r.max_tokens for s in servers for r in s.requests}
    assert sent == {"short": MAX_TOKENS, "long": 29}
    assert outcome.status == "complete" and outcome.completed == 2 and outcome.set_aside == 1
    stored = {r["id"]: r for r in recorder.stored}
    assert stored["short"]["turn_max_tokens"] == [MAX_TOKENS]
    assert stored["long"]["turn_max_tokens"] == [29]
    assert stored["long"]["turns_set_aside"] == 0
    [(label, reason, kept_row, rejected)] = recorder.aside
    assert (label, kept_row) == ("full", None)
    assert rejected["id"] == "full" and rejected["reason"] == reason and "120 tokens" in reason


def test_without_a_cap_every_request_carries_the_runs_max_tokens():
    rows = [row("long", " ".join(["w"] * 200))]
    servers = [FakeServer("http://a")]
    outcome, recorder, _ = dispatch(fake_config(), servers, rows)
    assert [r.max_tokens for r in servers[0].requests] == [None]
    assert recorder.stored[0]["turn_max_tokens"] == [MAX_TOKENS] and outcome.set_aside == 0


def test_a_retried_turn_is_sent_with_the_same_cap():
    cap = LengthCap(120, words)
    failing = RequestError("http", "503", status=503)
    answers = iter([Reply(error=failing), Reply(error=failing), Reply()])
    servers = [FakeServer("http://a", script=lambda server, request: next(answers))]
    outcome, recorder, _ = dispatch(
        fake_config(servers=["http://a"]), servers, [row("long", " ".join(["w"] * 80))], length_cap=cap
    )
    assert [r.max_tokens for r in servers[0].requests] == [29, 29, 29]
    assert outcome.completed == 1 and recorder.stored[0]["attempts"] == 3


def test_later_turns_see_the_history_as_generated_and_stop_where_nothing_could_train():
    # Each answer adds its words to the next prompt: turn 1 has 14 tokens, turn 2 the history + 4 more, and turn 3
    # would start past max_length, so the conversation is stored with two turns and its messages end there.
    cap = LengthCap(60, words)
    long_answer = Reply(content=" ".join(["x"] * 30))
    servers = [FakeServer("http://a", script=lambda server, request: long_answer)]
    conversation = row("conv", "q one", "q two", "q three")
    outcome, recorder, _ = dispatch(
        fake_config(servers=["http://a"]), servers, [conversation], length_cap=cap
    )
    requests = servers[0].requests
    assert [r.turn for r in requests] == [0, 1]  # the third turn was never sent
    # turn 1: 60 − 13; turn 2: its prompt holds turn 1's answer as generated (34 words) and the next question
    assert [r.max_tokens for r in requests] == [60 - 13, 60 - (10 + 3 + 34 + 3)]
    [stored] = recorder.stored
    assert stored["turn_after"] == [0, 2] and len(stored["messages"]) == 3
    assert stored["turns_set_aside"] == 1 and stored["turn_max_tokens"] == [47, 10]
    [(label, _, kept_row, rejected)] = recorder.aside
    assert "turn 3/3" in label and kept_row is stored and rejected is None
    assert outcome.completed == 1 and outcome.set_aside == 1


def test_a_turn_left_less_room_than_the_floor_is_set_aside_and_the_turns_before_it_are_stored():
    # min_turn_budget 20: turn 1 (room 47) is sent, turn 2 (room 10 after turn 1's 30-word answer) is not.
    cap = LengthCap(60, words, min_budget=20)
    long_answer = Reply(content=" ".join(["x"] * 30), finish_reason="length", completion_tokens=47)
    servers = [FakeServer("http://a", script=lambda server, request: long_answer)]
    outcome, recorder, _ = dispatch(
        fake_config(servers=["http://a"]), servers, [row("conv", "q one", "q two", "q three")], length_cap=cap
    )
    assert [(r.turn, r.max_tokens) for r in servers[0].requests] == [(0, 47)]
    [stored] = recorder.stored
    assert stored["turn_after"] == [0] and stored["turns_set_aside"] == 2
    assert stored["turns_set_aside_by"] == "min_turn_budget"
    # turn 1 was capped by the trainer's room (47 < max_tokens 100): its cut is the expected kind
    assert stored["turn_budget_by"] == ["max_length"] and recorder.budgets == ["max_length"]
    [(label, reason, _, rejected)] = recorder.aside
    assert recorder.aside_why == ["min_turn_budget"] and rejected is None
    assert "turn 2/3" in label and "fewer than min_turn_budget 20" in reason
    assert outcome.set_aside == 1 and outcome.completed == 1


def test_the_floor_never_exceeds_the_runs_max_tokens_and_spares_uncapped_turns():
    # max_tokens 100 under a floor of 500: an uncapped turn is sent with its 100; a capped one (room 29) is not.
    cap = LengthCap(120, words, min_budget=500)
    servers = [FakeServer("http://a")]
    rows = [row("short", "a b c"), row("long", " ".join(["w"] * 80))]
    outcome, recorder, _ = dispatch(fake_config(servers=["http://a"]), servers, rows, length_cap=cap)
    assert [(r.prompt_id, r.max_tokens) for r in servers[0].requests] == [("short", MAX_TOKENS)]
    assert recorder.stored[0]["turn_budget_by"] == ["max_tokens"]
    [(label, reason, _, rejected)] = recorder.aside
    assert label == "long" and rejected["reason"] == reason and "fewer than min_turn_budget 100" in reason
    assert outcome.set_aside == 1


def test_a_server_that_counts_the_prompt_otherwise_is_noted_once():
    cap = LengthCap(500, words)  # the fake server says 10 prompt tokens; the counter says more
    servers = [FakeServer("http://a")]
    _, recorder, _ = dispatch(fake_config(servers=["http://a"]), servers, prompts(3), length_cap=cap)
    assert len(recorder.noted("the server counted 10 prompt tokens")) == 1


# ----- one simulated run ---------------------------------------------------------------------------------------
def _long_conversations(count: int) -> list[dict]:
    """Conversations whose later turns carry long histories, and one prompt too long to train anything."""
    rows = []
    for i in range(count):
        filler = " ".join(f"detail{j}" for j in range(40 * (i % 4)))
        rows.append(
            {
                "id": f"c{i:03d}",
                "messages": [
                    {"role": "user", "content": f"question {i}: {filler}"},
                    {"role": "assistant", "content": "old"},
                    {"role": "user", "content": f"follow-up {i}: {filler}"},
                    {"role": "assistant", "content": "old"},
                    {"role": "user", "content": f"last {i}"},
                ],
            }
        )
    rows.append(
        {"id": "too-long", "messages": [{"role": "user", "content": " ".join(f"w{j}" for j in range(900))}]}
    )
    return rows


def test_a_simulated_run_never_asks_past_max_length_and_records_each_turns_cap(
    sim_fleet, sim_tokenizer_dir, tmp_path
):
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=50.0)
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(r) + "\n" for r in _long_conversations(24)))
    max_length = 700
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": "Qwen/Qwen3.6-27B",
            "prompts": str(prompts_file),
            "out_dir": str(tmp_path / "run"),
            "max_tokens": 512,
            "train_max_length": max_length,
            "min_turn_budget": 0,  # the cap alone: every turn with room is sent
            "tokenizer": str(sim_tokenizer_dir),
            "concurrency_per_server": 8,
            "max_truncated_rate": 1.0,
            "canary": False,
            "hedge_slow_ratio": 0.0,
        },
    )

    async def go():
        plan = await preflight(config)
        return plan, await generate(config, plan, progress=False)

    plan, result = asyncio.run(go())
    assert any(c.check == "max_length" and "min(512, 700" in c.detail for c in plan.checks)
    records = [r for r in fleet.truth() if r.get("kind") == "chat"]
    assert records, "the simulator recorded no chat request"
    for record in records:
        assert record["max_tokens"] <= max_length - record["prompt_tokens"], record
        assert record["max_tokens"] > 0
    capped = [r for r in records if r["max_tokens"] < 512]
    assert capped, "no request was capped: the test prompts are too short to test anything"
    assert all(r["completion_tokens"] <= r["max_tokens"] for r in records)

    rows = pl.read_parquet(Path(config.out_dir) / "shards" / "*.parquet")
    assert "too-long" not in rows["id"].to_list()
    for stored in rows.iter_rows(named=True):
        for prompt, limit, made in zip(
            stored["turn_prompt_tokens"],
            stored["turn_max_tokens"],
            stored["turn_completion_tokens"],
            strict=True,
        ):
            assert limit == min(512, max_length - prompt) and made <= limit
        assert len(stored["turn_after"]) + stored["turns_set_aside"] == 3
    rejected = pl.read_parquet(Path(config.out_dir) / "rejected.parquet")
    [reason] = rejected.filter(pl.col("id") == "too-long")["reason"].to_list()
    assert "train_max_length" in reason and "nothing generated after it could train" in reason
    manifest = json.loads((Path(config.out_dir) / "manifest.json").read_text())
    session = manifest["sessions"][-1]
    assert manifest["counts"]["rejected"] == 1 and session["set_aside"] == 1
    assert session["turns_set_aside"] == int(rows["turns_set_aside"].sum())
    assert result.completed == 24 and result.outcome.set_aside == 1 + int((rows["turns_set_aside"] > 0).sum())
    assert manifest["fingerprint_fields"]["length_cap"] == max_length
    # a fingerprint field: resuming without the cap (or with another max_length) is refused unless forced
    uncapped = config.model_copy(update={"tokenizer": ""})
    other = config.model_copy(update={"train_max_length": 800})
    assert len({config.fingerprint(), uncapped.fingerprint(), other.fingerprint()}) == 3
