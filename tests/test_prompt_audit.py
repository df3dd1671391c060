"""The prompt audit: exactly the duplicates, shared first turns and openers planted (by the long-chat generator and
by hand), near-duplicates by MinHash and not on distinct rows, turn budgets by generate's own rule, the command."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from draftgen.cli import main
from draftgen.generate.config import GenerateConfig
from draftgen.generate.length_cap import BELOW_FLOOR, NO_ROOM, LengthCap
from draftgen.generate.source import prompt_source
from draftgen.params import build_config
from draftgen.prompts.audit import AuditSettings, PromptAudit, audit_prompts, is_opener, reason_kind
from draftgen.prompts.audit_report import AuditReport, findings, headline
from draftgen.prompts.long_chat import OPENERS, long_chat_conversations
from draftgen.prompts.near_duplicates import NearDuplicateIndex
from draftgen.prompts.rows import PromptRow, RejectedRow, folded, iter_prompts
from draftgen.prompts.turn_budgets import CAPPED, FULL, classify_turns

WORDS = (
    "river stone bright quiet market thunder pencil orbit garden lantern copper meadow signal harbor "
    "velvet canyon ember mirror saddle frost tunnel violet anchor pepper glacier ribbon falcon cedar"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(words))


def _write(path: Path, rows: list) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(row if isinstance(row, str) else json.dumps(row, ensure_ascii=False))
            handle.write("\n")
    return path


# ----- the rules --------------------------------------------------------------------------------------------
def test_openers_are_short_requests_to_go_on():
    assert all(is_opener(text) for text in OPENERS)  # what the generator plants, the audit finds
    for text in ("continue", "Go on.", "  please   CONTINUE!", "ok continue", "keep writing", "Proceed."):
        assert is_opener(text), text
    for text in (
        "Continue the story about the dragon who guarded the bridge over the frozen river for a century",
        "Can you continue?",  # asks, with context of its own: not matched
        "Write a poem about continuity",
        "Resume tips for a junior engineer",
        "More examples, please",  # asks for something: not a bare "go on"
        "",
    ):
        assert not is_opener(text), text


def test_reason_kinds_drop_the_particulars():
    assert reason_kind("duplicate id 'a-1' (first occurrence kept)") == "duplicate id"
    assert (
        reason_kind("messages[3] has unknown role 'bot' (expected one of ...)")
        == "messages[i] has unknown role"
    )
    assert reason_kind("invalid JSON: Expecting value at column 1") == "invalid JSON"


# ----- exact findings -----------------------------------------------------------------------------------------
def _planted_file(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Long chats from the generator (which says what it planted) and rows planted by hand, with odd fields."""
    chats = list(long_chat_conversations(300, seed=4))
    rows: list = [chat.row for chat in chats]
    rng = random.Random(1)
    # by hand: an exact duplicate in the other row format, its trailing answer dropped, with fields nobody reads
    original = {"id": "hand-1", "messages": [{"role": "user", "content": "Hand question " + _text(rng, 30)}]}
    copy = {
        "id": "hand-1-copy",
        "conversations": [
            {"from": "human", "value": original["messages"][0]["content"]},
            {"from": "gpt", "value": "an answer the reader drops"},
        ],
        "source": "forum",
        "timestamp": 1_700_000_000,
        "model": "x",
        "language": "en",
        "tags": ["a", "b"],
    }
    same_but_category = {
        **original,
        "id": "hand-1-cat",
        "category": "other",
    }  # a category is not seen: duplicate
    # by hand: three conversations sharing a first turn in case and spacing only, then different turns
    first = "Plan a Garden  for my Balcony"
    shared = [
        {"id": f"hand-shared-{i}", "messages": [{"role": "user", "content": text}, *tail]}
        for i, (text, tail) in enumerate(
            [
                (first, []),
                (
                    "plan a garden for my balcony",
                    [{"role": "assistant", "content": "ok"}, {"role": "user", "content": _text(rng, 40)}],
                ),
                (
                    " PLAN A GARDEN\tFOR MY BALCONY ",
                    [{"role": "assistant", "content": "sure"}, {"role": "user", "content": _text(rng, 40)}],
                ),
            ]
        )
    ]
    openers = [
        {"id": "hand-open-1", "prompt": "Go on."},
        {
            "id": "hand-open-2",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "please continue"},
            ],
        },
    ]
    malformed = [
        "{not json",
        json.dumps(
            {"id": "bad-1", "messages": [{"role": "user", "content": ""}, {"role": "user", "content": "x"}]}
        ),
        json.dumps({"id": "hand-1", "prompt": "another prompt under a used id"}),
    ]
    rows[40:40] = [original]
    rows[120:120] = [copy, same_but_category, *shared[:2]]
    rows[200:200] = [shared[2], *openers, *malformed]
    path = _write(tmp_path / "planted.jsonl", rows)

    planted = Counter(chat.planted for chat in chats)
    originals_shared = {chat.of for chat in chats if chat.planted == "shared"}
    expected = {
        "rows": len(rows),
        "duplicates": planted["duplicate"] + 2,
        "shared_first_turns": len(originals_shared) + planted["shared"] + 3,
        "shared_groups": len(originals_shared) + 1,
        "openers": planted["opener"] + 2,
        "near": planted["near"],
        "malformed": 3,
    }
    return path, expected


def test_the_audit_finds_exactly_what_was_planted(tmp_path):
    path, expected = _planted_file(tmp_path)
    audit = audit_prompts(AuditSettings(path, progress=False))
    assert audit.rows == expected["rows"]
    assert audit.duplicates == expected["duplicates"]
    assert audit.shared_first_turns == expected["shared_first_turns"]
    assert audit.shared_groups == expected["shared_groups"]
    assert audit.openers == expected["openers"]
    assert audit.near_duplicates == expected["near"] and audit.near_indexed == audit.conversations
    assert audit.rejected == {"invalid JSON": 1, "messages[i] is an empty user turn": 1, "duplicate id": 1}
    assert audit.conversations == audit.rows - expected["malformed"] - expected["duplicates"] == audit.sent
    assert sum(audit.turns.values()) == audit.conversations
    assert max(audit.turns) == 15
    assert (
        "coding" in audit.categories and "forum" not in audit.categories
    )  # a duplicate's category is not counted
    assert len(audit.examples["duplicates"]) == 3 and all(
        "duplicate of" in e for e in audit.examples["duplicates"]
    )
    kept = audit_prompts(AuditSettings(path, keep_duplicates=True, progress=False))
    assert kept.duplicates == audit.duplicates and kept.sent == audit.sent + audit.duplicates
    assert any(f.check == "duplicates" and f.status == "warn" for f in findings(kept))


def test_limit_stops_at_the_nth_conversation_as_generate_does(tmp_path):
    path, _ = _planted_file(tmp_path)
    audit = audit_prompts(AuditSettings(path, limit=50, progress=False))
    assert audit.conversations == 50 and sum(audit.turns.values()) == 50


# ----- the reader: duplicates skipped as "duplicate of ID", the same decision in every shard ----------------------
def test_the_reader_skips_duplicate_conversations_naming_the_first(tmp_path):
    path, _ = _planted_file(tmp_path)
    items = list(iter_prompts(path))
    rejected = {r.id: r for r in items if isinstance(r, RejectedRow)}
    assert rejected["hand-1-copy"].reason.startswith("duplicate of hand-1 ")
    assert (
        rejected["hand-1-cat"].reason.startswith("duplicate of hand-1 ") and rejected["hand-1-cat"].duplicate
    )
    assert rejected["hand-1"].reason.startswith("duplicate id 'hand-1'") and not rejected["hand-1"].duplicate
    chats = {chat.row["id"]: chat for chat in long_chat_conversations(300, seed=4)}
    for prompt_id, chat in chats.items():
        if chat.planted == "duplicate":
            assert rejected[prompt_id].reason.startswith(f"duplicate of {chat.of} ")
    kept = [r.id for r in iter_prompts(path, keep_duplicates=True) if isinstance(r, PromptRow)]
    valid = [r.id for r in items if isinstance(r, PromptRow)]
    assert len(kept) == len(valid) + sum(r.duplicate for r in rejected.values())
    # every shard reaches the whole file's decision, and reports its own ids only
    for count in (2, 3):
        shards = [list(iter_prompts(path, shard=(i, count))) for i in range(count)]
        assert sorted(r.id for s in shards for r in s if isinstance(r, PromptRow)) == sorted(valid)
        duplicates = [r.id for s in shards for r in s if isinstance(r, RejectedRow) and r.duplicate]
        assert sorted(duplicates) == sorted(i for i, r in rejected.items() if r.duplicate)


def test_a_sampling_plan_never_expands_a_duplicate(tmp_path):
    rows = [{"id": "a", "prompt": "one"}, {"id": "b", "prompt": "two"}, {"id": "c", "prompt": "one"}]
    path = _write(tmp_path / "p.jsonl", rows)
    base = {
        "servers": ["http://127.0.0.1:9"],
        "model": "m",
        "prompts": str(path),
        "out_dir": str(tmp_path / "o"),
    }
    plan = [{"name": "think", "answers": 2}]
    items = list(prompt_source(build_config(GenerateConfig, {**base, "sampling_plan": plan})))
    assert [r.id for r in items if isinstance(r, PromptRow)] == ["a#s0", "a#s1", "b#s0", "b#s1"]
    assert [(r.id, r.reason.split(" (")[0]) for r in items if isinstance(r, RejectedRow)] == [
        ("c", "duplicate of a")
    ]
    kept = list(
        prompt_source(build_config(GenerateConfig, {**base, "sampling_plan": plan, "keep_duplicates": True}))
    )
    assert [r.id for r in kept] == ["a#s0", "a#s1", "b#s0", "b#s1", "c#s0", "c#s1"]


# ----- near-duplicates --------------------------------------------------------------------------------------
def test_near_duplicates_found_on_near_copies_and_not_on_distinct_rows():
    rng = random.Random(7)
    originals = [_text(rng, 80) for _ in range(60)]
    index = NearDuplicateIndex()
    for text in originals:  # distinct texts: none is near another
        assert index.add([folded(text)]) is None
    for number, text in enumerate(originals[:20]):
        words = text.split()
        words[rng.randrange(len(words))] = "changed"  # one word of 80
        match = index.add([folded(" ".join(words))])
        assert match is not None and match[0] == number and match[1] >= 0.8
    for text in originals[20:30]:  # half the words replaced: no longer near
        words = text.split()
        for position in range(0, len(words), 2):
            words[position] = _text(rng, 1)
        assert index.add([folded(" ".join(words))]) is None


# ----- turn budgets: generate's rule --------------------------------------------------------------------------
def _chars(messages, enable_thinking, tools=None):  # a counter: one token per character of content
    return sum(len(m["content"]) for m in messages)


def test_each_answer_point_is_classified_by_generates_rule():
    cap = LengthCap(max_length=1000, count=_chars, tokenizer="chars", min_budget=100)
    messages = [
        {"role": "user", "content": "u" * 100},  # prompt 100: room 900 < max_tokens 950 → capped
        {"role": "assistant", "content": "a" * 300},
        {"role": "user", "content": "u" * 450},  # prompt 850: room 150 → capped
        {"role": "assistant", "content": "a" * 10},
        {"role": "user", "content": "u" * 80},  # prompt 940: room 60 < floor 100 → below the floor
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "u"},  # after one set aside: set aside with it, not counted
    ]
    assert classify_turns(messages, cap, 950, True, "all") == [
        (CAPPED, 100),
        (CAPPED, 850),
        (BELOW_FLOOR, 940),
        (BELOW_FLOOR, None),
    ]
    assert classify_turns(messages[:1], cap, 500, True, "all") == [(FULL, 100)]
    assert classify_turns([{"role": "user", "content": "u" * 1000}], cap, 500, True, "all") == [
        (NO_ROOM, 1000)
    ]
    # "last": one request, the source's answers kept in it: 942 characters, room 58
    assert classify_turns(messages, cap, 950, True, "last") == [(BELOW_FLOOR, 942)]


def test_turn_budgets_in_the_audit_count_a_uniform_sample(tmp_path):
    rows = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": "q" * (50 + 10 * i)}]} for i in range(100)
    ]
    path = _write(tmp_path / "p.jsonl", rows)
    cap = LengthCap(max_length=1000, count=_chars, tokenizer="chars", min_budget=100)
    audit = audit_prompts(AuditSettings(path, cap=cap, max_tokens=2000, token_sample=40, progress=False))
    budgets = audit.budgets
    assert budgets.conversations == 40 and budgets.of_conversations == 100
    prompts_counted = budgets.prompt_tokens
    assert 50 <= prompts_counted["p50"] <= 1040
    every = audit_prompts(
        AuditSettings(path, cap=cap, max_tokens=2000, token_sample=0, progress=False)
    ).budgets
    # all 100: prompts of 50..1040 characters; ≥ 1000 no room (1000..1040: 5), 910..990 below the floor (9)
    assert every.by_class == {NO_ROOM: 5, BELOW_FLOOR: 9, CAPPED: 86}
    assert every.sent_turns == {0: 14, 1: 86}
    assert every.sent_per_conversation == pytest.approx(0.86)


# ----- the report and the command -----------------------------------------------------------------------------
def test_the_report_says_what_to_fix_first(tmp_path):
    path, expected = _planted_file(tmp_path)
    audit = audit_prompts(AuditSettings(path, progress=False))
    text = headline(audit, max_rejected_rate=0.001)
    assert text.startswith(
        f"{path}: {expected['rows']:,} rows read; {audit.sent:,} conversations will be sent"
    )
    assert "generate refuses the file" in text  # 3 malformed of ~310 rows is above 0.1%
    assert "generate refuses" not in headline(audit, max_rejected_rate=0.05)
    report = str(AuditReport(audit))
    for title in (
        "The prompt file",
        "Malformed rows",
        "Answer points per conversation",
        "Category or source mix",
    ):
        assert title in report
    assert "<table>" in AuditReport(audit)._repr_html_()


def test_the_command_prints_tables_or_json_and_exits_by_what_it_found(tmp_path, capsys):
    clean = _write(
        tmp_path / "clean.jsonl",
        [{"id": f"c{i}", "prompt": f"Question {i}: " + _text(random.Random(i), 12)} for i in range(30)],
    )
    assert main(["prompts", "audit", str(clean)]) == 0
    out = capsys.readouterr().out
    assert "30 conversations will be sent" in out and "Nothing to fix before spending" in out

    path, expected = _planted_file(tmp_path)
    assert main(["prompts", "audit", str(path), "--json"]) == 1  # shared first turns above 5%: a warning
    data = json.loads(capsys.readouterr().out)
    assert data["duplicates"] == expected["duplicates"] and data["openers"] == expected["openers"]
    assert data["budgets"] is None

    assert main(["prompts", "audit", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["prompts", "--n", "3", "--out", str(tmp_path / "w.jsonl")]) == 0  # writing still works


def test_the_command_counts_turns_with_a_tokenizer(tmp_path, capsys, tokenizer_dir):
    path = tmp_path / "long.jsonl"
    assert main(["prompts", "--n", "60", "--shape", "long-chat", "--out", str(path)]) == 0
    capsys.readouterr()
    code = main(
        ["prompts", "audit", str(path), "--tokenizer", str(tokenizer_dir), "--max-length", "4096", "--json"]
    )
    data = json.loads(capsys.readouterr().out)
    budgets = data["budgets"]
    assert budgets["max_length"] == 4096 and budgets["min_turn_budget"] == 512
    assert budgets["conversations"] == data["conversations"]
    assert budgets["turns"] == sum(int(k) * v for k, v in data["turns"].items())
    assert budgets["by_class"].get("max_length", 0) + budgets["by_class"].get("min_turn_budget", 0) > 0
    assert code == 1  # long chats: many turns set aside


def test_audit_is_a_frozen_record():
    audit = PromptAudit(
        path="p",
        rows=1,
        conversations=1,
        rejected={},
        duplicates=0,
        keep_duplicates=False,
        shared_first_turns=0,
        shared_groups=0,
        openers=0,
        near_duplicates=0,
        near_indexed=1,
        turns_mode="all",
        turns={1: 1},
        categories={"(none)": 1},
    )
    with pytest.raises(AttributeError):
        audit.rows = 2  # type: ignore[misc]
    assert json.loads(json.dumps(audit.as_dict()))["sent"] == 1
