"""Loops ended live: the accumulator cuts a looping answer and says so, the simulator loops as told and records
where, generate stores each looped turn up to its first repetition, flagged, with its request really ended on the
simulator, and the garbage guard halts a run that mostly loops."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest
from sim_helpers import tokenizer_of
from validate_helpers import clean_rows, row, turns, write_generation

from draftgen.client.loops import REPETITION_LOOP, LoopRule
from draftgen.client.sse import SseDecoder
from draftgen.client.stream import ChatAccumulator
from draftgen.generate import GenerateConfig, generate, preflight, report
from draftgen.generate.guard import Guard, GuardSettings, GuardTripped, classify
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim.textgen import plan_completion
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import validate_generation
from draftgen.validate.report import flag_table

PREFIX = "Okay, the user wants the area of a circle of radius 3. Area is pi r squared\n"
CYCLE = "Wait, let me double-check: pi times 9 is about 28.27, so the area is 28.27.\n"


def _delta(field: str, text: str, ids: list[int] | None = None) -> dict:
    choice: dict = {"index": 0, "delta": {field: text}, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "r1", "choices": [choice]}


def _stream_into(answer: ChatAccumulator, chunks: list[dict]) -> int:
    """Feed a stream's chunks as a reader does, stopping once the answer has ended; how many were read."""
    decoder = SseDecoder()
    for read, chunk in enumerate(chunks, start=1):
        for event in decoder.feed(f"data: {json.dumps(chunk)}\n\n".encode()):
            answer.add_event(event)
        if answer.ended:
            return read
    return len(chunks)


def test_a_streamed_loop_ends_the_answer_at_the_end_of_its_first_repetition() -> None:
    text = PREFIX + CYCLE * 60
    chunks = [_delta("reasoning_content", text[i : i + 7], ids=[i]) for i in range(0, len(text), 7)]
    finish = {"id": "r1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    answer = ChatAccumulator("http://s", stream=True, loop_rule=LoopRule(), max_tokens=4096)
    read = _stream_into(answer, [*chunks, finish])
    assert answer.ended and read < len(chunks)  # the rest was never read
    result = answer.result()
    assert result.finish_reason == REPETITION_LOOP
    assert result.reasoning_content == PREFIX + CYCLE * 2 and result.content is None
    assert result.output_ids is None  # ids cannot be cut to the text without the tokenizer: dropped
    assert result.completion_tokens is None and not result.usage_reported
    loop = result.loop
    assert loop is not None and loop.live and loop.max_tokens == 4096
    assert loop.loop.start_char == len(PREFIX) and loop.loop.kept_chars == len(PREFIX + CYCLE * 2)
    assert loop.loop.received_chars <= 7 * read
    row = loop.as_row()
    assert row["live"] is True and row["kept_chars"] == len(PREFIX + CYCLE * 2)


def test_a_loop_in_the_answer_keeps_the_whole_reasoning() -> None:
    chunks = [_delta("reasoning_content", "Short thought, nothing repeats here at all.")]
    answer_text = "The answer:\n" + CYCLE * 50
    chunks += [_delta("content", answer_text[i : i + 11]) for i in range(0, len(answer_text), 11)]
    answer = ChatAccumulator("http://s", stream=True, loop_rule=LoopRule())
    _stream_into(answer, chunks)
    result = answer.result()
    assert result.finish_reason == REPETITION_LOOP
    assert result.reasoning_content == "Short thought, nothing repeats here at all."
    assert result.content == "The answer:\n" + CYCLE * 2


def test_without_the_rule_or_a_loop_nothing_changes() -> None:
    text = PREFIX + CYCLE * 60
    chunks = [_delta("reasoning_content", text[i : i + 9]) for i in range(0, len(text), 9)]
    finish = {"id": "r1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    plain = ChatAccumulator("http://s", stream=True)
    assert _stream_into(plain, [*chunks, finish]) == len(chunks) + 1
    assert plain.result().reasoning_content == text and plain.result().loop is None
    clean = ChatAccumulator("http://s", stream=True, loop_rule=LoopRule())
    _stream_into(clean, [_delta("reasoning_content", PREFIX * 3), finish])
    assert clean.result().finish_reason == "length" and clean.result().loop is None


def test_a_whole_answer_is_checked_after_the_fact() -> None:
    body = {
        "id": "r1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "reasoning_content": PREFIX + CYCLE * 80},
                "finish_reason": "length",
                "token_ids": list(range(2000)),
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2000},
    }
    answer = ChatAccumulator("http://s", stream=False, loop_rule=LoopRule(), max_tokens=2000)
    answer.add_response(body)
    result = answer.result()
    assert result.finish_reason == REPETITION_LOOP and result.loop is not None and not result.loop.live
    assert result.reasoning_content == PREFIX + CYCLE * 2 and result.output_ids is None
    assert result.completion_tokens == 2000  # what the server generated (and was paid for): nothing saved


def test_the_guard_counts_a_loop_as_a_loop_only_and_halts_when_many_loop() -> None:
    assert classify(
        thinking=True, content=None, reasoning="x", finish_reason=REPETITION_LOOP, failed=False
    ) == (REPETITION_LOOP,)
    guard = Guard(GuardSettings(window=20, min_results=10))
    for i in range(9):
        guard.observe(id=f"p{i}", server="s", content="fine", reasoning="r", finish_reason="stop")
    guard.observe(id="loop0", server="s", reasoning="r", finish_reason=REPETITION_LOOP)  # 1 of 10: under 10%
    with pytest.raises(GuardTripped) as tripped:
        guard.observe(id="loop1", server="s", reasoning="r", finish_reason=REPETITION_LOOP)
    assert tripped.value.report.defect == REPETITION_LOOP and "temperature" in str(tripped.value)


# ----- the simulator ------------------------------------------------------------------------------------------------
PLAN = {"reasoning_median": 900, "answer_median": 300, "sigma": 0.5}


def test_the_simulator_loops_a_share_of_prompts_verbatim_until_max_tokens(sim_tokenizer) -> None:  # type: ignore[no-untyped-def]
    looped = 0
    for seed in range(120):
        plan = plan_completion(
            seed,
            sim_tokenizer,
            max_tokens=3000,
            enable_thinking=True,
            loop_rate=0.25,
            loop_max_period=64,
            **PLAN,
        )
        again = plan_completion(
            seed,
            sim_tokenizer,
            max_tokens=3000,
            enable_thinking=True,
            loop_rate=0.25,
            loop_max_period=64,
            **PLAN,
        )
        assert again == plan  # the same prompt loops the same way on every server and attempt
        if plan.loop_start is None:
            assert plan.loop_period is None
            continue
        looped += 1
        start, period = plan.loop_start, plan.loop_period
        assert period is not None and 1 <= period <= 64 + 20  # the cycle ends at a word edge past the draw
        assert plan.finish_type == "length" and len(plan.ids) == 3000
        assert all(plan.ids[i] == plan.ids[i - period] for i in range(start + period, 3000))
        text = "".join(plan.tokens)
        assert sim_tokenizer.encode(text) == list(plan.ids)  # still the canonical encoding of the text
        unlooped = plan_completion(seed, sim_tokenizer, max_tokens=3000, enable_thinking=True, **PLAN)
        assert plan.ids[:start] == unlooped.ids[:start]  # the same answer up to where it fell into the loop
    assert 15 <= looped <= 45


# ----- a generate run on the simulator ------------------------------------------------------------------------------
def _config(fleet, prompts: Path, out_dir: Path, **changes: object) -> GenerateConfig:  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "concurrency_per_server": 8,
        "batch_save_size": 50,
        "max_truncated_rate": 1.0,
        "max_loop_rate": 1.0,
        "canary": False,
        **changes,
    }
    return build_config(GenerateConfig, values)


def _run(config: GenerateConfig):  # type: ignore[no-untyped-def]
    async def run():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        return await generate(config, plan, progress=False)

    return asyncio.run(run())


def _periodic_tail(text: str, period: int, length: int) -> bool:
    return len(text) >= length and all(
        text[i] == text[i - period] for i in range(len(text) - length + period, len(text))
    )


def test_a_streamed_run_ends_each_looping_request_early_and_stores_it_to_its_first_repetition(
    sim_fleet, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Every request the simulator sent into a loop is stored flagged, cut where its cycle's first repetition
    ends, and the simulator's ground truth shows it stopped generating there — far short of max_tokens (a margin of
    thousands of tokens, so the client's reading speed cannot decide it); every other request is untouched."""
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 40, seed=5)
    fleet = sim_fleet(
        servers=2, profile="b200-mtp", speed=10.0, faults=["loop_rate=0.35", "loop_max_period=48"]
    )
    config = _config(fleet, prompts, tmp_path / "run", stream=True, max_tokens=16384, turns="last")
    result = _run(config)
    assert result.status == "complete" and result.failed == 0
    frame = pl.read_parquet(sorted((tmp_path / "run" / "shards").glob("*.parquet")))
    truth = {r["rid"]: r for r in fleet.truth() if r.get("kind") == "chat"}
    tokenizer = tokenizer_of(fleet)
    looped = checked = 0
    for stored in frame.iter_rows(named=True):
        record = truth[stored["response_id"]]
        (loop,) = stored["turn_loop"]
        if record["loop_start"] is None:
            assert stored["finish_reason"] in ("stop", "tool_calls", "length") and loop is None
            assert record["outcome"] == "ok"
            continue
        looped += 1
        assert stored["finish_reason"] == REPETITION_LOOP == stored["turn_finish_reason"][0]
        assert loop["live"] and loop["max_tokens"] == 16384
        # the simulator stopped: the client went away after the loop was found, long before max_tokens
        assert record["outcome"] == "client_disconnected"
        assert record["loop_start"] < record["completion_tokens"] < record["planned_tokens"] == 16384
        # the stored text: the planned completion up to the end of the cycle's first repetition
        plan = plan_completion(
            record["seed"],
            tokenizer,
            max_tokens=16384,
            enable_thinking=True,
            reasoning_median=1_100,
            answer_median=350,
            sigma=fleet_sigma(fleet),
            loop_rate=0.35,
            loop_max_period=48,
        )
        assert plan.loop_start == record["loop_start"]
        text = (stored["reasoning_content"] or "") + (stored["content"] or "")
        planned = "".join(plan.tokens[: plan.think_end_index or len(plan.tokens)])
        if plan.think_end_index is not None and plan.think_end_index < record["loop_start"]:
            continue  # looped in the answer: the reasoning is whole (checked by the unit tests)
        assert planned.startswith(text)
        cycle_chars = len("".join(plan.tokens[plan.loop_start : plan.loop_start + plan.loop_period]))
        loop_chars = len("".join(plan.tokens[: plan.loop_start]))
        # up to the first repetition's end (the stretch may begin up to one cycle early where the words before the
        # loop happen to end like the cycle does)
        assert loop_chars + cycle_chars < len(text) <= loop_chars + 2 * cycle_chars
        assert _periodic_tail(text, cycle_chars, 2 * cycle_chars)
        assert loop["kept_chars"] == len(text) and loop["start_char"] <= loop_chars
        checked += 1
    assert looped >= 5 and checked >= 3
    figures = report.summary(config.out_dir).to_dicts()[0]
    loops = [loop for (loop,) in frame["turn_loop"].to_list() if loop is not None]
    assert figures["repetition_loops"] == looped == len(loops)
    assert figures["loop_tokens_saved"] == sum(16384 - loop["received"] for loop in loops) > 0


def fleet_sigma(fleet) -> float:  # type: ignore[no-untyped-def]
    from draftgen.sim.profiles import get_profile

    return get_profile(fleet.profile).length_sigma


def test_a_run_that_mostly_loops_is_halted_by_the_guard_and_unstreamed_loops_are_flagged_after_the_fact(
    sim_fleet, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 60, seed=9)
    fleet = sim_fleet(servers=1, profile="instant", faults=["loop_rate=0.9", "loop_max_period=16"])
    config = _config(
        fleet,
        prompts,
        tmp_path / "run",
        max_tokens=1024,
        guard_window=20,
        guard_min_results=10,
        max_loop_rate=0.3,
        turns="last",
        stream=False,  # the after-the-fact path
    )
    with pytest.raises(GuardTripped) as tripped:
        _run(config)
    assert tripped.value.report.defect == REPETITION_LOOP
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["sessions"][-1]["status"] == "halted"
    stored = pl.read_parquet(sorted((tmp_path / "run" / "shards").glob("*.parquet")))
    looped = stored.filter(pl.col("finish_reason") == REPETITION_LOOP)
    assert stored.height < 60 and looped.height > 0
    # not streamed: found in the whole answer, which the server had generated to max_tokens (nothing saved)
    assert all(not loop["live"] for (loop,) in looped["turn_loop"].to_list())
    assert (looped["completion_tokens"] == 1024).all()


# ----- validate -----------------------------------------------------------------------------------------------------
def _loop_rows() -> list[dict]:
    """A loop in the reasoning, one in the answer, and one ending the first turn of a two-turn conversation."""
    reasoning = row("loop-think", reasoning=PREFIX + CYCLE * 2, content=None, finish_reason=REPETITION_LOOP)
    answer = row(
        "loop-answer", reasoning="Simple enough.", content="So:\n" + CYCLE * 2, finish_reason=REPETITION_LOOP
    )
    messages = [
        {"role": "user", "content": "First: the area of a circle of radius 3?"},
        {"role": "assistant", "content": "About 28."},
        {"role": "user", "content": "And of radius 4?"},
    ]
    first = row("loop-first", reasoning="Area is pi r squared.", content="About 50.27.", messages=messages)
    first.update(
        turns(first, [(0, None, PREFIX + CYCLE * 2), (2, "About 50.27.", "Area is pi r squared.")], "all")
    )
    first["turn_finish_reason"] = [REPETITION_LOOP, "stop"]
    return [reasoning, answer, first]


def _validate_config(tokenizer_dir: Path, generation: Path, out: Path, **overrides: object) -> ValidateConfig:
    values = {
        "generation_dir": str(generation),
        "tokenizer": str(tokenizer_dir),
        "out_dir": str(out),
        "holdout_share": 0.0,
        "duplicate_answer_min_prompts": 100,
        "max_degenerate_share": 1.0,
    }
    return build_config(ValidateConfig, {**values, **overrides})


def _exported_ids(out: Path) -> set[str]:
    lines = (out / "export.partial" / "prompts.jsonl").read_text().splitlines()
    return {json.loads(line)["id"] for line in lines}


def test_validate_reports_loops_and_drops_them_unless_asked_to_train_on_the_prefix(
    tmp_path: Path, tokenizer_dir: Path, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    write_generation(tmp_path / "gen", [*clean_rows(20), *_loop_rows()])
    looped = {"loop-think", "loop-answer", "loop-first#0"}
    dropped = validate_generation(
        _validate_config(tokenizer_dir, tmp_path / "gen", tmp_path / "drop"),
        tokenizer=tokenizer,
        progress=False,
    )
    records = dropped.records
    flagged = set(records.filter(pl.col("repetition_loop"))["id"].to_list())
    assert flagged == looped
    assert records.filter(pl.col("repetition_loop"))["dropped"].all()
    assert not records.filter(pl.col("repetition_loop"))["truncated"].any()  # a loop is not a length cut
    assert "loop-first#1" in _exported_ids(tmp_path / "drop")  # the conversation's next turn still trains
    assert not looped & _exported_ids(tmp_path / "drop")
    assert dropped.counts["dropped_by_flag"]["repetition_loop"] == 3
    table = dict(flag_table(dropped).select("flag", "samples").iter_rows())
    assert table["repetition_loop"] == 3
    kept = validate_generation(
        _validate_config(tokenizer_dir, tmp_path / "gen", tmp_path / "train", train_loops=True),
        tokenizer=tokenizer,
        progress=False,
    )
    records = kept.records.filter(pl.col("repetition_loop"))
    assert set(records["id"].to_list()) == looped and not records["dropped"].any()
    assert looped <= _exported_ids(tmp_path / "train")
    assert kept.counts["flagged_but_kept"]["repetition_loop"] == 3
