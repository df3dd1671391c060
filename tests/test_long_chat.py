"""The long-chat shape of the synthetic generator: real multi-turn sets' shape, planted findings said, reproducible."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from draftgen.cli import main
from draftgen.generate.length_cap import tokenizer_counter
from draftgen.prompts.long_chat import OPENERS, long_chat_conversations, long_chat_rows
from draftgen.prompts.rows import PromptRow, folded, iter_prompts, normalize_record
from draftgen.prompts.synthetic import BUNDLED_PROMPTS, SINGLE_TURN, synthetic_rows
from draftgen.training.local_tokenizer import build_qwen3_tokenizer

N = 1000


@pytest.fixture(scope="module")
def chats():
    return list(long_chat_conversations(N, seed=3))


@pytest.fixture(scope="module")
def normalized(chats):
    rows = [normalize_record(chat.row, index + 1) for index, chat in enumerate(chats)]
    assert all(isinstance(row, PromptRow) for row in rows), [r for r in rows if not isinstance(r, PromptRow)][
        :2
    ]
    return rows


def _users(row: PromptRow) -> list[str]:
    return [m["content"] for m in row.messages if m["role"] == "user"]


def test_reproducible_from_the_seed_and_different_across_seeds():
    assert list(long_chat_rows(60, seed=5)) == list(long_chat_rows(60, seed=5))
    assert list(long_chat_rows(60, seed=5)) != list(long_chat_rows(60, seed=6))


def test_shape_long_conversations_with_pasted_context_and_source_answers(chats, normalized):
    turns = Counter(len(_users(row)) for row in normalized)
    assert max(turns) == 15 and min(turns) == 1
    assert sum(n for k, n in turns.items() if k >= 10) >= 0.35 * N  # many with ten or more
    assert sum(n for k, n in turns.items() if k >= 5) >= 0.6 * N
    # ShareGPT-like: the source's assistant turns sit between the user turns (regenerated with turns: all)
    assert all(
        [m["role"] for m in row.messages if m["role"] != "system"][1::2]
        == ["assistant"] * (len(_users(row)) - 1)
        for row in normalized
    )
    pastes = [len(text) for row in normalized for text in _users(row) if "\n" in text]
    assert len(pastes) >= 0.4 * N and max(pastes) >= 12_000 and statistics.median(pastes) >= 1_500
    formats = Counter("conversations" if "conversations" in chat.row else "messages" for chat in chats)
    assert formats["conversations"] >= 0.6 * N and formats["messages"] >= 0.15 * N
    # odd fields real sets carry, and a category (or only a source) to group by
    assert all({"source", "language", "model", "timestamp"} <= set(chat.row) for chat in chats)
    assert {type(chat.row["timestamp"]) for chat in chats} == {int, str}
    assert sum("tags" in chat.row for chat in chats) >= 0.1 * N
    categories = Counter(row.category for row in normalized)
    assert {"coding", "debugging", "documents", "data", "chat"} <= set(categories)
    assert (
        sum(n for c, n in categories.items() if "-" in (c or "")) > 0
    )  # rows whose only category is a source


def test_planted_copies_are_what_they_say(chats, normalized):
    planted = Counter(chat.planted for chat in chats)
    assert (
        planted["duplicate"] >= 0.02 * N and planted["shared"] >= 0.03 * N and planted["opener"] >= 0.01 * N
    )
    assert planted["near"] >= 1
    by_id = {row.id: row for row in normalized}
    firsts: dict[str, list[str]] = {}
    for chat, row in zip(chats, normalized, strict=True):
        first = _users(row)[0]
        original = by_id.get(chat.of) if chat.of else None
        if chat.planted == "duplicate":
            assert row.messages == original.messages and row.id != original.id
        elif chat.planted == "shared":
            assert folded(first) == folded(_users(original)[0]) and first != _users(original)[0]
            assert row.messages[1:] != original.messages[1:]
        elif chat.planted == "near":
            assert first != _users(original)[0] and _users(original)[0] in first
            assert row.messages[-1] == original.messages[-1]
        elif chat.planted == "opener":
            assert first in OPENERS
        if chat.planted in ("fresh", "near"):
            firsts.setdefault(folded(first), []).append(row.id)
    # nothing copied that was not planted: fresh and near first turns are their own, other conversations distinct
    assert all(len(ids) == 1 for ids in firsts.values())
    kept = [
        json.dumps(row.messages)
        for chat, row in zip(chats, normalized, strict=True)
        if chat.planted != "duplicate"
    ]
    assert len(set(kept)) == len(kept)


def test_median_prompt_by_the_last_turn_with_qwen3s_tokenizer(tmp_path, normalized):
    """The issue's bar: median ≥ 1,500 prompt tokens by the last turn (the source's answers standing in for the
    regenerated ones), counted with Qwen3's real vocabulary and draftgen's Qwen3 chat template, on the first 300
    conversations (about 8 ms each to count: their median is the thousand's, 3,016, and 11 of them pass 8,192)."""
    count = tokenizer_counter(build_qwen3_tokenizer(tmp_path / "qwen3"))
    lengths = [count(row.messages, True) for row in normalized[:300]]
    assert statistics.median(lengths) >= 1_500
    assert max(lengths) > 8_192  # some conversations run far past the trainer's max_length


def test_command_writes_the_shape_and_keeps_the_default_byte_identical(tmp_path: Path, capsys):
    assert main(["prompts", "--n", "2000", "--out", str(tmp_path / "mixed.jsonl")]) == 0
    assert (tmp_path / "mixed.jsonl").read_bytes() == BUNDLED_PROMPTS.read_bytes()
    out = tmp_path / "long.jsonl"
    assert main(["prompts", "--n", "40", "--shape", "long-chat", "--seed", "2", "--out", str(out)]) == 0
    assert "wrote 40 prompts" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == list(long_chat_rows(40, seed=2))
    assert all(isinstance(item, PromptRow) for item in iter_prompts(out, keep_duplicates=True))


def test_the_single_turn_shape_asks_one_question_of_the_mixed_kinds(tmp_path: Path):
    out = tmp_path / "plain.jsonl"
    assert main(["prompts", "--n", "300", "--shape", "single-turn", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 300 and {row["category"] for row in rows} == set(SINGLE_TURN)
    for item in iter_prompts(out):
        assert isinstance(item, PromptRow) and not item.tools
        assert [m["role"] for m in item.messages if m["role"] != "system"] == ["user"]
    with pytest.raises(ValueError, match="kinds must be some of"):
        next(synthetic_rows(3, kinds=("poetry",)))
