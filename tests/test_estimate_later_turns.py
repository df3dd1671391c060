"""The estimate prices a conversation's later turns with the answers the target writes, not the source's.

Hand-made inputs, no servers: a counter of one token per character, answers drawn from fixed pairs, conversations
given by their rooms. Pinned here: what a regenerated answer leaves in a later prompt (kept_answer), how the
drawn answers move later turns' rooms and set them aside (classify), a turn ending in tool calls (its reasoning
and calls; a cut before them ends the conversation), the mean of clipped draws, and the fleet simulation playing a
conversation's turns one after another, in the set's order when it has the whole set.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.conversations import Conversations
from draftgen.estimate.inputs import load_benchmark, measured_answers, sent_conversations
from draftgen.estimate.model import LengthSample, RateModel, estimate_wall, with_answer_tokens
from draftgen.estimate.plan import run_estimate
from draftgen.generate.length_cap import BELOW_FLOOR, NO_ROOM, LengthCap
from draftgen.params import build_config
from draftgen.prompts.answer_lengths import MIN_CATEGORY_REQUESTS, AnswerLengths, kept_answer
from draftgen.prompts.audit import AuditSettings, audit_prompts
from draftgen.prompts.turn_budgets import CAPPED, ENDED, _Prompts, classify, turn_budgets

RATE = RateModel(alpha_s=0.004, beta_s=0.0004, max_running=48)


def _chars(messages, enable_thinking, tools=None):
    """One token per character of content, and of each tool call's JSON."""
    calls = sum(len(json.dumps(c, sort_keys=True)) for m in messages for c in m.get("tool_calls") or ())
    return sum(len(m["content"]) for m in messages) + calls


CAP = LengthCap(max_length=1000, count=_chars, tokenizer="chars", min_budget=100)
CHAT = [
    {"role": "user", "content": "u" * 100},
    {"role": "assistant", "content": "a" * 10},  # the source's short answers
    {"role": "user", "content": "u" * 100},
    {"role": "assistant", "content": "a" * 10},
    {"role": "user", "content": "u" * 100},
]


def _always(completion: int, answer: int):
    return lambda: (completion, answer)


def _classified(messages, answers=None, max_tokens=950, tools=None):
    prompts = _Prompts(messages, CAP, True, "all", tools, drawn=answers is not None)
    return [(c.name, c.prompt_tokens, c.call_tokens) for c in classify(prompts, CAP, max_tokens, answers)]


# ----- what a regenerated answer leaves in a later prompt ----------------------------------------------------
def test_a_regenerated_answer_keeps_what_falls_within_its_room():
    assert kept_answer(500, 300, 900) == 300  # ended within its room: all of its answer
    assert kept_answer(500, 300, 400) == 200  # cut 100 tokens short: the answer's last 100 lost
    assert kept_answer(500, 300, 150) == 0  # cut inside the reasoning: no answer at all
    assert kept_answer(500, 300, 500) == 300


def test_the_answer_is_the_completions_share_of_answer_text():
    requests = pl.DataFrame(
        {
            "completion_tokens": [1000, 1000, 800, None],
            "content_chars": [200, 0, 500, 0],
            "reasoning_chars": [800, 4000, 0, 0],
        }
    )
    assert with_answer_tokens(requests)["answer_tokens"].to_list() == [200, 0, 800, 0]


# ----- later turns' rooms from the drawn answers ---------------------------------------------------------------
def test_later_turns_are_priced_with_the_answers_the_target_writes():
    # The source's 10-character answers leave every turn room (prompts 100, 210, 320: all capped).
    assert _classified(CHAT) == [(CAPPED, 100, 0), (CAPPED, 210, 0), (CAPPED, 320, 0)]
    # The target's: 500 tokens, 350 of them after the reasoning. Turn 1 (room 900) keeps all 350; turn 2's prompt is
    # 100 + 100 + 350 = 550, room 450, so its 500 are cut 50 short and keep 300; turn 3's prompt is
    # 300 + 350 + 300 = 950: room 50, below min_turn_budget 100, set aside.
    assert _classified(CHAT, _always(500, 350)) == [
        (CAPPED, 100, 0),
        (CAPPED, 550, 0),
        (BELOW_FLOOR, 950, 0),
    ]
    # Longer still: turn 2's prompt (100 + 100 + 900) reaches max_length, and the turn after it is not counted.
    assert _classified(CHAT, _always(900, 900)) == [(CAPPED, 100, 0), (NO_ROOM, 1100, 0), (NO_ROOM, None, 0)]


AGENT = [
    {"role": "user", "content": "u" * 100},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "r" * 50},
]


def test_a_turn_ending_in_tool_calls_writes_its_reasoning_and_calls():
    calls = _classified(AGENT, _always(500, 300))[0][2]
    assert (
        calls > 1
    )  # the source's calls as the template renders them: what the turn writes after its reasoning
    # 500 − 300 + calls fits turn 1's room (900): the conversation goes on, the calls (not a drawn answer) in its
    # prompt
    first, second = _classified(AGENT, _always(500, 300))
    assert first[0] == CAPPED and second[0] == CAPPED and second[2] == 0
    assert second[1] == 100 + calls + 50
    # a reasoning longer than the room: cut before its calls, generate ends the conversation there
    assert _classified(AGENT, _always(990, 10)) == [(CAPPED, 100, calls), (ENDED, None, 0)]
    # without drawn answers (the audit's view) nothing is priced as calls
    assert [c[2] for c in _classified(AGENT)] == [0, 0]


def test_answers_are_drawn_from_the_conversations_category_when_it_was_measured_enough():
    many = MIN_CATEGORY_REQUESTS
    lengths = AnswerLengths.of(
        completion=[100] * many + [900] * 5,
        answer=[10] * many + [90] * 5,
        categories=["code"] * many + ["chat"] * 5,
        source="test",
    )
    rng = np.random.default_rng(0)
    assert {lengths.drawer("code", rng)() for _ in range(200)} == {(100, 10)}
    assert {lengths.drawer("chat", rng)() for _ in range(200)} == {
        (100, 10),
        (900, 90),
    }  # too few: all of them
    assert {lengths.drawer(None, rng)() for _ in range(200)} == {(100, 10), (900, 90)}
    assert "by category for code" in lengths.note


def test_turn_budgets_play_each_conversation_several_times_and_count_over_all():
    answers = AnswerLengths.of([500, 500], [350, 10], [None, None], "test")
    budgets = turn_budgets([(CHAT, None, None)], CAP, 950, True, "all", 1, answers=answers, draws=40)
    assert budgets.draws == 40 and len(budgets.conversation_rooms) == 40
    assert budgets.turns == 3 * 40
    # draws of 10-token answers send all three turns, of 350-token ones two: between the two, per version
    assert 2.0 < budgets.sent_per_conversation < 3.0
    assert budgets.points(CAPPED) == budgets.by_class[CAPPED] / 40
    assert {len(rooms) for rooms in budgets.conversation_rooms} == {2, 3}
    source = turn_budgets([(CHAT, None, None)], CAP, 950, True, "all", 1)
    assert source.draws == 1 and source.conversation_rooms == ((900.0, 790.0, 680.0),)


# ----- the mean and the simulation -------------------------------------------------------------------------------
def test_a_call_turn_is_clipped_with_its_calls_and_without_the_answer():
    tokens, answers = np.array([100.0]), np.array([40.0])
    # two turns: text at room 70 (writes min(100, 70)), calls of 20 at room inf (writes 100 − 40 + 20)
    turns = Conversations.of([[70.0, np.inf]], [[0, 20]])
    assert turns.mean_work(tokens, tokens, None, answers) == pytest.approx((70 + 80) / 2)
    # the same with the call turn's room 50: min(80, 50)
    assert Conversations.of([[70.0, 50.0]], [[0, 20]]).mean_work(tokens, tokens, None, answers) == 60


def test_a_conversations_turns_follow_one_another_in_one_slot():
    one = np.array([100.0])
    # two servers, one slot each: two independent requests run side by side, one conversation of two does not
    apart = estimate_wall(one, 2, 2, 1, RATE, np.random.default_rng(0))
    together = estimate_wall(
        one, 2, 2, 1, RATE, np.random.default_rng(0), conversations=Conversations.of([[np.inf] * 2])
    )
    assert apart.wall_s == pytest.approx(100 * RATE.tpot(1))
    assert together.wall_s == pytest.approx(200 * RATE.tpot(1))
    # a call turn writes its reasoning and calls: 100 − 40 + 20, then the text turn's 100, on one server
    calls = Conversations.of([[np.inf, np.inf]], [[20, 0]])
    wall = estimate_wall(
        one, 2, 1, 1, RATE, np.random.default_rng(0), conversations=calls, answers=np.array([40.0])
    )
    assert wall.wall_s == pytest.approx(180 * RATE.tpot(1))


def test_the_whole_set_is_played_in_its_order_from_a_version_drawn_at_random():
    # two versions of three conversations: (1 turn, 2 turns, 3 turns) and (3, 2, 1); the last ones end the run
    rooms = [[1.0], [2.0, 2.0], [3.0] * 3, [3.0] * 3, [2.0, 2.0], [1.0]]
    ordered = Conversations.of(rooms, ordered=True, draws=2)
    seen = set()
    for seed in range(20):
        _, _, counts = ordered.draw(np.random.default_rng(seed), 2)
        seen.add(tuple(counts))
    assert seen == {(2, 3), (2, 1)}  # the last two of either version, in order
    _, _, counts = ordered.draw(np.random.default_rng(0), 4)  # more than a version holds: its end, wrapping
    assert tuple(counts) in {(3, 1, 2, 3), (1, 3, 2, 1)}


def test_a_sample_without_sends_or_a_set_of_single_full_turns_has_nothing_to_model(tmp_path):
    rows = [{"id": f"q{i}", "prompt": f"{i:02d}" + "x" * 48} for i in range(5)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    roomy = LengthCap(max_length=10_000, count=_chars, tokenizer="chars", min_budget=1)
    audit = audit_prompts(AuditSettings(path, cap=roomy, max_tokens=100, progress=False))
    assert sent_conversations(audit) is None  # every turn alone with the full max_tokens
    capped = audit_prompts(AuditSettings(path, cap=CAP, max_tokens=2000, progress=False))
    turns = sent_conversations(capped)
    assert turns is not None and turns.ordered and turns.rooms.tolist() == [950.0] * 5


# ----- the estimate, end to end -------------------------------------------------------------------------------
def small_fleet_values(prompts, tokenizer_dir, train_max_length: int) -> dict:  # type: ignore[no-untyped-def]
    """An estimate's parameters for a small prompt file under the trainer's cap: one GPU at 8 in flight, 1024
    tokens a turn, a floor of 256, 10 resamples, no other scenario (benchmark_dir added by the caller)."""
    return {
        "prompts": str(prompts),
        "tokenizer": str(tokenizer_dir),
        "train_max_length": train_max_length,
        "min_turn_budget": 256,
        "max_tokens": 1024,
        "gpus": 1,
        "concurrency_per_server": 8,
        "bootstrap": 10,
        "scenarios": [],
    }


def _benchmark(tmp_path, answer_share: float):
    """A benchmark folder: 40 requests of 400 tokens, ``answer_share`` of their characters answer text."""
    folder = tmp_path / f"bench-{answer_share}"
    folder.mkdir()
    n = 40
    pl.DataFrame(
        {
            "server": ["s0"] * 3,
            "gpu": [0] * 3,
            "concurrency": [8] * 3,
            "in_flight": [1, 4, 8],
            "seconds": [10.0, 10.0, 10.0],
            "tokens": [10.0 * RATE.tok_s(b) for b in (1, 4, 8)],
        }
    ).write_parquet(folder / "occupancy.parquet")
    pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(n)],
            "ok": [True] * n,
            "completion_tokens": [400] * n,
            "truncated": [False] * n,
            "content_chars": [round(1000 * answer_share)] * n,
            "reasoning_chars": [round(1000 * (1 - answer_share))] * n,
        }
    ).write_parquet(folder / "requests.parquet")
    pl.DataFrame(
        {
            "server": ["s0"],
            "concurrency": [8],
            "max_running_requests": [48],
            "accept_length": [3.0],
            "accept_length_source": ["sglext"],
            "ttft_s_p50": [0.05],
        }
    ).write_parquet(folder / "results.parquet")
    (folder / "benchmark.json").write_text(json.dumps({"max_tokens": 1024, "failed": 0}))
    return folder


def test_the_estimate_sets_aside_the_later_turns_a_long_answer_leaves_no_room_for(tmp_path, tokenizer_dir):
    """Three-turn chats whose source answers are a word long: priced with a benchmark whose answers are short,
    every turn is sent; with one whose answers are long (half of 400 tokens), the third turn is not."""
    question = "Tell me about tides and the moon in a few sentences, please. " * 8
    rows = [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": f"{i} {question}"},
                {"role": "assistant", "content": "Sure."},
                {"role": "user", "content": question},
                {"role": "assistant", "content": "Yes."},
                {"role": "user", "content": question},
            ],
        }
        for i in range(30)
    ]
    prompts = tmp_path / "chats.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    values = small_fleet_values(prompts, tokenizer_dir, train_max_length=1024)
    terse = run_estimate(
        build_config(EstimateConfig, {**values, "benchmark_dir": str(_benchmark(tmp_path, 0.01))})
    )
    wordy = run_estimate(
        build_config(EstimateConfig, {**values, "benchmark_dir": str(_benchmark(tmp_path, 0.5))})
    )
    assert terse.num_prompts == 90  # 30 conversations × 3 turns
    assert (
        wordy.num_prompts == 60
    )  # the third turn's prompt holds two 300-token answers: no room left under 1024
    assert wordy.audit.budgets.draws > 1 and "as long as the target's" in wordy.audit.budgets.note
    # every turn sent has room for its 400 tokens: the set-aside turns are what the long answers cost
    assert terse.production.total_output_tokens == pytest.approx(90 * 400)
    assert wordy.production.total_output_tokens == pytest.approx(60 * 400)
    answers = measured_answers(load_benchmark(tmp_path / "bench-0.5"))
    assert answers is not None and set(answers.answer.tolist()) == {200}


def test_lengths_carry_their_answers_and_cut_them_with_max_tokens():
    requests = pl.DataFrame(
        {
            "prompt_id": ["a", "b"],
            "ok": [True, True],
            "completion_tokens": [1000, 400],
            "truncated": [False, False],
            "content_chars": [300, 100],
            "reasoning_chars": [700, 300],
        }
    )
    sample = LengthSample.from_requests(requests, 1024)
    assert sample.answers.tolist() == [300.0, 100.0]
    # at max_tokens 800 the first loses 200 of its 300 answer tokens, the second nothing
    assert sample.answers_per_prompt(800).tolist() == [100.0, 100.0]
    bare = LengthSample.from_requests(requests.drop("content_chars"), 1024)
    assert bare.answers is None and bare.answers_per_prompt(800).tolist() == [0.0, 0.0]
