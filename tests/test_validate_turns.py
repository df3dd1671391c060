"""Multi-turn rows in validate: the export holds only assistant text the target model wrote (turns: all), and
assistant turns it did not write (turns: last, or older single-turn shards) are flagged foreign_assistant_turn.
Planted rows for each case, then real runs of generate on the simulator with turns all and last."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest
from validate_helpers import SCHEMA, clean_rows, row, turns, write_generation

from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.params import build_config
from draftgen.prompts.rows import PromptRow, iter_prompts
from draftgen.prompts.synthetic import write_synthetic
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import ValidationGateError, require_fit_to_train, validate_generation
from draftgen.validate.reader import GenerationDataError

SOURCE = "Source model wrote this"  # marks every source assistant message in these rows


def _config(tokenizer_dir: Path, generation: Path, out: Path, **overrides: object) -> ValidateConfig:
    values = {
        "generation_dir": str(generation),
        "tokenizer": str(tokenizer_dir),
        "out_dir": str(out),
        "holdout_share": 0.0,  # exact counts; the held-out split has tests of its own
    }
    return build_config(ValidateConfig, {**values, **overrides})


def _three_turns(sample_id: str, mode: str, finish: tuple[str, ...] = ("stop", "stop", "stop")) -> dict:
    """system, then three user turns with the source's assistant answers between them."""
    messages = [
        {"role": "system", "content": "Answer briefly and show the working."},
        {"role": "user", "content": f"{sample_id}: what is 12 times 7, step by step?"},
        {"role": "assistant", "content": f"{SOURCE}: 84 because twelve sevens make eighty four."},
        {"role": "user", "content": "Now divide that by four and explain each step."},
        {"role": "assistant", "content": f"{SOURCE}: 21 since eighty four over four is twenty one."},
        {"role": "user", "content": "Finally add nine to the result and say what you get."},
    ]
    answers = [
        (1, "Twelve times seven is eighty four, found by adding seven twelve times.", "Multiply 12 by 7."),
        (3, "Eighty four divided by four is twenty one, as four times twenty one is 84.", "Divide 84 by 4."),
        (5, "Twenty one plus nine gives thirty, the final result of the steps.", "Add 9 to 21 carefully."),
    ]
    if mode == "last":
        answers = answers[-1:]
    sample = row(sample_id, reasoning=answers[-1][2], content=answers[-1][1], messages=messages)
    sample.update(turns(sample, answers, mode))
    sample["turn_finish_reason"] = list(finish[-len(answers) :])
    sample["finish_reason"] = sample["turn_finish_reason"][-1]
    return sample


def _export(out: Path, staged: bool = False) -> dict[str, list[dict]]:
    path = out / ("export.partial" if staged else "export") / "train.jsonl"
    return {e["id"]: e["conversations"] for e in map(json.loads, path.read_text().splitlines())}


def test_turns_all_exports_only_the_target_models_answers(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(12) + [_three_turns(f"conv-{i}", "all") for i in range(4)]
    write_generation(tmp_path / "gen", rows)
    result = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    assert result.counts["dropped"] == 0 and not result.records["foreign_assistant_turn"].any()
    exported = _export(tmp_path / "out", staged=True)
    source = rows[-2]
    # A training row per generated turn: turn j's history as the target saw it when it wrote turn j (its earlier
    # answers, content only, as generate sent them), then turn j's answer with its reasoning.
    for j in range(3):
        conversation = exported[f"conv-2#{j}"]
        assert [t["role"] for t in conversation] == ["system", *["user", "assistant"] * (j + 1)]
        earlier, last = conversation[2:-1:2], conversation[-1]
        assert earlier == [{"role": "assistant", "content": c} for c in source["turn_content"][:j]]
        assert (last["content"], last["reasoning_content"]) == (
            source["turn_content"][j],
            source["turn_reasoning"][j],
        )
    assert SOURCE not in json.dumps(exported), "no assistant text the target did not write"
    assert "conv-2" not in exported, "per conversation rows only when asked for"

    whole = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "whole", rows="per_conversation"),
        tokenizer=tokenizer,
        progress=False,
    )
    assert whole.counts["dropped"] == 0
    conversation = _export(tmp_path / "whole", staged=True)["conv-2"]
    assistants = [t for t in conversation if t["role"] == "assistant"]
    assert [t["content"] for t in assistants] == source["turn_content"]
    assert [t["reasoning_content"] for t in assistants] == source["turn_reasoning"]


@pytest.mark.parametrize("rows", ["per_turn", "per_conversation"])
def test_an_earlier_turn_cut_or_empty_is_flagged_where_it_is(tmp_path, tokenizer_dir, tokenizer, rows):
    cut = _three_turns("cut-first", "all", finish=("length", "stop", "stop"))
    empty = _three_turns("empty-second", "all")
    empty["turn_content"][1] = "  "
    write_generation(tmp_path / "gen", [*clean_rows(8), cut, empty])
    result = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out", rows=rows),
        tokenizer=tokenizer,
        progress=False,
    )
    flags = {r["id"]: set(r["flags"]) for r in result.records.select("id", "flags").iter_rows(named=True)}
    if (
        rows == "per_conversation"
    ):  # the trainer supervises every answer of the conversation: all of it is out
        assert flags["cut-first"] == {"truncated"}, (
            "the last turn stopped, but the first was cut by max_tokens"
        )
        assert flags["empty-second"] == {"empty_answer"}
    else:  # a row per turn: only the defective turn's row is out; the others trained on what the target saw
        assert flags["cut-first#0"] == {"truncated"} and not flags["cut-first#1"] and not flags["cut-first#2"]
        # (its mask may also be tiny: the empty answer's turn is a few tokens, as the tokenizer splits them)
        assert "empty_answer" in flags["empty-second#1"] <= {"empty_answer", "tiny_mask"}
        assert not flags["empty-second#0"]
    assert all(not f for i, f in flags.items() if i.startswith("clean"))


def test_turns_last_history_is_foreign_and_a_defect_unless_kept(tmp_path, tokenizer_dir, tokenizer):
    rows = clean_rows(16) + [_three_turns(f"last-{i}", "last") for i in range(4)]
    write_generation(tmp_path / "gen", rows)
    result = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    foreign = result.records.filter(pl.col("foreign_assistant_turn"))
    assert sorted(foreign["id"].to_list()) == [f"last-{i}" for i in range(4)]
    assert foreign["flags"].to_list() == [["foreign_assistant_turn"]] * 4
    assert (
        result.counts["degenerate"] == 4 and result.counts["dropped_by_flag"]["foreign_assistant_turn"] == 4
    )
    with pytest.raises(ValidationGateError, match="foreign_assistant_turn 4"):
        require_fit_to_train(result)
    assert SOURCE not in (tmp_path / "out" / "export.partial" / "train.jsonl").read_text()

    kept = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "kept", keep_flagged=["foreign_assistant_turn"]),
        tokenizer=tokenizer,
        progress=False,
    )
    assert require_fit_to_train(kept).startswith("PASS")
    # 16 clean prompts (four of them two-turn conversations: 20 rows) and the four foreign ones
    assert kept.counts["flagged_but_kept"] == {"foreign_assistant_turn": 4} and kept.counts["out"] == 24
    conversation = _export(kept.out_dir, staged=True)["last-0"]
    assert conversation[2] == {"role": "assistant", "content": rows[16]["messages"][2]["content"]}
    assert conversation[-1]["content"] == rows[16]["content"] and "reasoning_content" in conversation[-1]


def test_older_shards_without_turn_columns_are_single_turn_rows(tmp_path, tokenizer_dir, tokenizer):
    base = [name for name in SCHEMA if not name.startswith("turn")]
    old = clean_rows(6, prefix="old")
    old[1]["messages"] = [
        {"role": "user", "content": "Name a prime number above ten."},
        {"role": "assistant", "content": f"{SOURCE}: eleven."},
        {"role": "user", "content": "And the next one after it?"},
    ]
    folder = tmp_path / "gen"
    write_generation(folder, [*clean_rows(6, seed=3, prefix="new"), _three_turns("conv", "all")])
    pl.DataFrame(old, schema={n: SCHEMA[n] for n in base}).write_parquet(
        folder / "shards" / "part-00099.parquet"
    )
    result = validate_generation(
        _config(tokenizer_dir, folder, tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    # 6 new single-or-two-turn rows (7 training rows), the three-turn conversation (3), 6 old single-turn rows
    assert result.records.height == 7 + 3 + 6
    flagged = result.records.filter(pl.col("foreign_assistant_turn"))["id"].to_list()
    # old-0001's history and old-0002's (a multi-turn helper row, its turn columns gone with the old schema)
    assert flagged == ["old-0001", "old-0002"], "an old shard's history assistant turn is not the target's"
    exported = _export(tmp_path / "out", staged=True)
    assert exported[old[0]["id"]][-1]["content"] == old[0]["content"]


def test_turn_columns_that_do_not_fit_the_messages_name_the_row(tmp_path, tokenizer_dir, tokenizer):
    broken = _three_turns("broken", "all")
    broken["turn_after"] = [1, 2, 5]  # message 2 is a source assistant message
    write_generation(tmp_path / "gen", [*clean_rows(4), broken])
    with pytest.raises(GenerationDataError, match=r"row 'broken' \(.*part-00000.parquet, row 4\)") as error:
        validate_generation(
            _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out"), tokenizer=tokenizer, progress=False
        )
    assert "source assistant message" in str(error.value)


def _sim_run(tmp_path: Path, prompts: Path, turns_mode: str, fleet) -> Path:
    """generate over the simulated fleet with ``turns`` (all: every assistant turn by the target)."""
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": "Qwen/Qwen3.6-27B",
            "prompts": str(prompts),
            "out_dir": str(tmp_path / f"gen-{turns_mode}"),
            "max_tokens": 2048,
            "concurrency_per_server": 8,
            "canary": False,
            "turns": turns_mode,
        },
    )

    async def run() -> None:
        result = await generate(config, await preflight(config), progress=False)
        assert result.status == "complete", result

    asyncio.run(run())
    return Path(config.out_dir)


def test_a_simulated_multi_turn_run_exports_only_what_the_target_wrote(
    instant_fleet, tmp_path, tokenizer_dir, tokenizer
):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 300, seed=5)
    sources = {r.id: r.messages for r in iter_prompts(prompts) if isinstance(r, PromptRow)}
    with_history = {i for i, m in sources.items() if any(t["role"] == "assistant" for t in m)}
    source_answers = {t["content"] for m in sources.values() for t in m if t["role"] == "assistant"}
    assert len(with_history) >= 10, "the synthetic set should hold multi-turn conversations"
    fleet = instant_fleet(2)
    folder = _sim_run(tmp_path, prompts, "all", fleet)

    result = validate_generation(
        _config(tokenizer_dir, folder, tmp_path / "out-all"), tokenizer=tokenizer, progress=False
    )
    stored = pl.read_parquet(folder / "shards" / "*.parquet")
    turn_content = dict(zip(stored["id"], stored["turn_content"].to_list(), strict=True))
    assert result.counts["in"] == sum(len(t) for t in turn_content.values()) > len(sources)
    assert not result.records["foreign_assistant_turn"].any()
    exported = _export(tmp_path / "out-all", staged=True)
    assert set(exported) == set(result.records.filter(~pl.col("dropped"))["id"].to_list())
    for row_id, conversation in exported.items():
        prompt_id, _, turn = row_id.partition("#")
        j = int(turn or 0)
        answers = [t for t in conversation if t["role"] == "assistant"]
        assert [t["content"] for t in answers] == turn_content[prompt_id][: j + 1]
        assert "reasoning_content" in answers[-1] and all("reasoning_content" not in t for t in answers[:-1])
        assert not {t["content"] for t in answers} & source_answers
    multi = [i for i in with_history if f"{i}#1" in exported]
    assert multi and all(len(turn_content[i]) >= 2 for i in multi)

    last = _sim_run(tmp_path, prompts, "last", fleet)
    flagged = validate_generation(
        _config(tokenizer_dir, last, tmp_path / "out-last", max_degenerate_share=1.0),
        tokenizer=tokenizer,
        progress=False,
    )
    foreign = set(flagged.records.filter(pl.col("foreign_assistant_turn"))["id"].to_list())
    assert foreign == with_history
