"""Turns cut by max_tokens train as generated: the row is the server's prompt + output ids with nothing appended,
its mask over exactly the generated tokens; the files of ids carry it and train.jsonl (rendered through the chat
template, which would close the turn) does not; ``train_truncated: false`` drops it again; re-tokenized cut rows
are still dropped. The garbage guard and validate's gate still judge the truncation rate. Every generated token
lands in one bucket. Planted rows with a faithful server's ids, then a generate run on the simulator checked
against the ids it stored and the simulator's own record of each request."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from validate_helpers import clean_rows, row, server_ids, with_server_ids, write_generation

from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.generate.guard import Guard, GuardSettings, GuardTripped
from draftgen.params import build_config
from draftgen.prompts.synthetic import LONG_CHAT, synthetic_rows, write_rows
from draftgen.training.conversation import generated_turns, request_messages
from draftgen.training.id_rows import ids_layout
from draftgen.training.local_tokenizer import build_qwen3_tokenizer
from draftgen.training.masks import MaskSpec, build_conversation_masks, load_tokenizer
from draftgen.training.token_ids import compact, expand
from draftgen.training.trainers import Trainer
from draftgen.validate.card import engine_line
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import ValidationGateError, require_fit_to_train, validate_generation
from draftgen.validate.token_rows import SERVER, server_rows
from draftgen.validate.turns import assemble_batch, turn_rows


def _config(tokenizer_dir: Path, generation: Path, out: Path, **overrides: object) -> ValidateConfig:
    values = {
        "generation_dir": str(generation),
        "tokenizer": str(tokenizer_dir),
        "out_dir": str(out),
        "holdout_share": 0.0,  # exact counts; the held-out split has tests of its own
        "duplicate_answer_min_prompts": 100,
    }
    return build_config(ValidateConfig, {**values, **overrides})


def _split(text: str) -> tuple[str, str | None]:
    """(reasoning_content, content) of a thinking model's raw output, as SGLang's qwen3 parser splits it."""
    if "</think>" not in text:
        return text, None
    reasoning, content = text.split("</think>", 1)
    return reasoning, content


def with_cut_turn(sample: dict, tokenizer, turn: int, keep: int) -> tuple[dict, list[int], list[int]]:  # type: ignore[no-untyped-def]
    """``sample`` with the token ids a faithful server returns, its generated turn ``turn`` cut after ``keep``
    tokens (finish_reason "length"; the text is what the cut ids decode to), and the later turns' requests carrying
    the cut turn's content as generate sends it. Returns the row and the cut turn's (prompt ids, output ids)."""
    mode, points, contents, reasonings = generated_turns(sample)
    prompts, outputs, earlier = [], [], []
    finishes = list(sample.get("turn_finish_reason") or ["stop"] * len(points))
    cut_turn: tuple[list[int], list[int]] = ([], [])
    for j, point in enumerate(points):
        history = list(request_messages(sample["messages"], point, earlier, mode))
        prompt, output = server_ids(tokenizer, history, reasonings[j], contents[j])
        if j == turn:
            output = output[:keep]
            text = tokenizer.backend_tokenizer.decode(output, skip_special_tokens=False)
            reasonings[j], contents[j] = _split(text)
            finishes[j] = "length"
            cut_turn = (prompt, output)
        prompts.append(prompt)
        outputs.append(output)
        earlier.append((point, contents[j]))
    shared, suffixes = compact(prompts, outputs)
    cut = {
        **sample,
        "reasoning_content": reasonings[-1],
        "content": contents[-1],
        "finish_reason": finishes[-1],
        "turn_prompt_shared": shared,
        "turn_prompt_ids": suffixes,
        "turn_output_ids": outputs,
    }
    if sample.get("turn_after") is not None:
        cut |= {"turn_content": contents, "turn_reasoning": reasonings, "turn_finish_reason": finishes}
    return cut, *cut_turn


def _prompts(out: Path) -> dict[str, dict]:
    lines = (out / "export.partial" / "prompts.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def _conversations(out: Path) -> dict[str, list[dict]]:
    lines = (out / "export.partial" / "train.jsonl").read_text().splitlines()
    return {r["id"]: r["conversations"] for r in map(json.loads, lines)}


def _planted(tokenizer) -> tuple[list[dict], dict[str, tuple[list[int], list[int]]]]:  # type: ignore[no-untyped-def]
    """Clean rows with server ids, and cut turns: inside the reasoning, inside the answer, and the first turn of a
    two-turn conversation (its second turn asked with the cut turn's content, as generate asks it)."""
    rows = [with_server_ids(r, tokenizer) for r in clean_rows(20)]
    sources = clean_rows(8, seed=9, prefix="cut")
    truth: dict[str, tuple[list[int], list[int]]] = {}
    for sample, turn, keep, key in (
        (sources[0], 0, 30, "cut-0000"),  # inside the reasoning
        (sources[3], 0, -4, "cut-0003"),  # inside the answer
        (sources[2], 0, 24, "cut-0002#0"),  # clean_rows' i % 4 == 2 rows are two-turn conversations
    ):
        if keep < 0:
            keep += len(
                server_ids(tokenizer, sample["messages"], sample["reasoning_content"], sample["content"])[1]
            )
        cut, prompt, output = with_cut_turn(sample, tokenizer, turn, keep)
        rows.append(cut)
        truth[key] = (prompt, output)
    return rows, truth


def test_a_cut_turn_is_the_servers_ids_with_nothing_appended_and_its_mask_the_generated_tokens(
    tmp_path, tokenizer_dir, tokenizer
):
    rows, truth = _planted(tokenizer)
    write_generation(tmp_path / "gen", rows)
    result = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    records = result.records
    cut = records.filter(pl.col("cut_trained"))
    assert sorted(cut["id"].to_list()) == sorted(truth)
    assert (cut["token_source"] == SERVER).all() and cut["truncated"].all() and not cut["dropped"].any()
    assert cut.filter(pl.col("id") == "cut-0000")["unclosed_think"].all(), "cut in its reasoning: no answer"
    prompts = _prompts(tmp_path / "out")
    for key, (prompt, output) in truth.items():
        exported = prompts[key]
        assert exported["input_ids"] == [*prompt, *output], (
            f"{key}: exactly the server's ids, nothing appended"
        )
        assert exported["loss_mask"] == [0] * len(prompt) + [1] * len(output), key
    conversations = _conversations(tmp_path / "out")
    assert not set(truth) & set(conversations), "train.jsonl holds no cut turn"
    # the conversation's next turn trains in both files, its history the cut turn's content as the target saw it
    later = conversations["cut-0002#1"]
    stored = next(r for r in rows if r["id"] == "cut-0002")
    assert later[1] == {"role": "assistant", "content": stored["turn_content"][0] or ""}
    assert "cut-0002#1" in prompts
    counts = result.counts
    assert counts["cut_turns"]["trained"] == 3 and counts["out"] == len(prompts)
    assert counts["conversation_rows"] == len(conversations) == counts["out"] - 3
    assert counts["cut_turns"]["trained_tokens"] == sum(len(o) for _, o in truth.values())
    assert counts["dropped_by_flag"]["truncated"] == 0 and counts["length_limited"] == 3
    # the tokens a chat template would close them with: "\n</think>\n\n<|im_end|>\n" after a cut in the
    # reasoning (5 tokens), "<|im_end|>\n" after one in the answer (2)
    closing = dict(cut.select("id", "closing_tokens").iter_rows())
    assert closing == {"cut-0000": 5, "cut-0003": 2, "cut-0002#0": closing["cut-0002#0"]}
    assert counts["cut_turns"]["closing_tokens"] == sum(closing.values())


def test_the_switch_drops_cut_turns_again_and_re_tokenized_cut_rows_stay_dropped(
    tmp_path, tokenizer_dir, tokenizer
):
    rows, truth = _planted(tokenizer)
    no_ids = row(
        "cut-text-only", reasoning="Let me think about it " * 6, content=None, finish_reason="length"
    )
    write_generation(tmp_path / "gen", [*rows, no_ids])
    dropped = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "off", train_truncated=False),
        tokenizer=tokenizer,
        progress=False,
    )
    assert not dropped.records["cut_trained"].any()
    assert dropped.counts["dropped_by_flag"]["truncated"] == 4 and dropped.counts["cut_turns"]["trained"] == 0
    assert not (set(truth) | {"cut-text-only"}) & set(_prompts(tmp_path / "off"))
    on = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "on"), tokenizer=tokenizer, progress=False
    )
    text_only = on.records.filter(pl.col("id") == "cut-text-only")
    # rendered from its text, a cut turn would end with the template's </think> and <|im_end|>: not as generated
    assert text_only["dropped"].all() and not text_only["cut_trained"].any()
    assert on.counts["dropped_by_flag"]["truncated"] == 1 and on.counts["cut_turns"]["trained"] == 3
    # both runs judge the same four rows as cut by a length limit
    assert dropped.counts["length_limited"] == on.counts["length_limited"] == 4
    # with no file of ids written there is nowhere to train a cut turn as generated: it is dropped
    jsonl_only = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "jsonl", export_prompts=False),
        tokenizer=tokenizer,
        progress=False,
    )
    assert (
        jsonl_only.counts["cut_turns"]["trained"] == 0
        and jsonl_only.counts["dropped_by_flag"]["truncated"] == 4
    )


def test_every_generated_token_lands_in_one_bucket(tmp_path, tokenizer_dir, tokenizer):
    rows, _ = _planted(tokenizer)
    defect = with_server_ids(row("empty-0", reasoning="Let me think. " * 8, content=""), tokenizer)
    long = with_server_ids(row("long-0", reasoning="Think. " * 10, content="A long answer. " * 60), tokenizer)
    write_generation(tmp_path / "gen", [*rows, defect, long])
    config = _config(
        tokenizer_dir, tmp_path / "gen", tmp_path / "out", train_max_length=160, holdout_share=0.2
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    made = result.counts["yield"]
    buckets = made["buckets"]
    assert sum(buckets.values()) == made["generated_tokens"] == int(result.records["generated_tokens"].sum())
    assert made["trained_tokens"] == buckets["trained"] > 0 and made["share"] == pytest.approx(
        buckets["trained"] / made["generated_tokens"]
    )
    # each way out is reached by this corpus: held out, cut at max_length, dropped by a named flag
    assert {"held out (the drafter verdict's prompts)", "cut at max_length", "dropped: empty_answer"} <= set(
        buckets
    )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"]["yield"]["buckets"] == buckets
    info = json.loads((tmp_path / "out" / "export.partial" / "dataset_info.json").read_text())
    assert info["yield"]["buckets"] == buckets
    card = (tmp_path / "out" / "export.partial" / "README.md").read_text()
    assert f"**{made['trained_tokens']:,}** of {made['generated_tokens']:,} generated" in card
    assert all(f"| {bucket} | {n:,} |" in card for bucket, n in buckets.items())


def test_the_card_says_which_file_holds_which_rows(tmp_path, tokenizer_dir, tokenizer):
    rows, truth = _planted(tokenizer)
    write_generation(tmp_path / "gen", rows)
    config = _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out", export_tokens=True)
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    folder = tmp_path / "out" / "export.partial"
    info = json.loads((folder / "dataset_info.json").read_text())
    counts = result.counts
    trained, cut_tokens = counts["yield"]["trained_tokens"], counts["cut_turns"]["trained_tokens"]
    every = {"rows": counts["out"], "trained_tokens": trained, "cut_turns": 3}
    assert info["contents"] == {
        "prompts.jsonl": every,
        "tokens/*.parquet": every,
        "train.jsonl": {"rows": counts["out"] - 3, "trained_tokens": trained - cut_tokens, "cut_turns": 0},
    }
    assert (
        len(_prompts(tmp_path / "out")) == counts["out"]
        and len(_conversations(tmp_path / "out")) == counts["out"] - 3
    )
    tokens = pl.read_parquet(folder / "tokens" / "*.parquet")
    assert set(truth) <= set(tokens["id"].to_list())
    card = (folder / "README.md").read_text()
    assert f"| `train.jsonl` | {counts['out'] - 3:,} | {trained - cut_tokens:,} | 0 |" in card
    assert f"| `prompts.jsonl` | {counts['out']:,} | {trained:,} | 3 |" in card
    assert (
        "3 turns were cut by max_tokens and train **as generated**" in card
        and "`train.jsonl` leaves them out" in card
    )


def test_the_engine_line_names_each_kind_of_server_once_with_its_count():
    sglang = {"engine": "sglang", "version": "0.5.23", "token_ids": "sglext"}
    servers = [{**sglang, "url": f"http://127.0.0.1:{30000 + i}"} for i in range(7)]
    assert engine_line(servers) == "7 servers: sglang 0.5.23 (sglext)"
    vllm = {"engine": "vllm", "version": "0.9.0", "token_ids": None, "url": "http://10.0.0.9:8000"}
    assert (
        engine_line([*servers[:2], vllm])
        == "3 servers: 2 × sglang 0.5.23 (sglext), 1 × vllm 0.9.0 (no token ids)"
    )
    assert (
        engine_line(servers[:1]) == "1 server: sglang 0.5.23 (sglext)" and engine_line([]) == "not recorded"
    )


# ----- the gates still judge the truncation rate ---------------------------------------------------------------
def test_validates_gate_fails_a_run_where_most_answers_are_cut_though_they_train(
    tmp_path, tokenizer_dir, tokenizer
):
    sources = clean_rows(40, seed=3, prefix="c")
    single = [s for s in sources if s.get("turn_after") is None]  # 30 single-turn rows

    def corpus(name: str, cut: int, budget_by: str = "max_tokens") -> tuple:
        rows = [with_cut_turn(s, tokenizer, 0, 30)[0] | {"turn_budget_by": [budget_by]} for s in single[:cut]]
        rows += [with_server_ids(s, tokenizer) for s in single[cut:]]
        write_generation(tmp_path / name, rows)
        return validate_generation(
            _config(tokenizer_dir, tmp_path / name, tmp_path / f"{name}-out"),
            tokenizer=tokenizer,
            progress=False,
        )

    some = corpus("some", 6)  # 6 of 30 = 20%, under max_truncated_share 25%
    assert some.counts["cut_turns"]["trained"] == 6 and some.truncated_share == pytest.approx(0.2)
    assert require_fit_to_train(some).startswith(
        "PASS"
    ) and "6 of them trained as generated" in require_fit_to_train(some)
    most = corpus("most", 20)  # 20 of 30 cut: kept for training, and still a failed run
    assert most.counts["cut_turns"]["trained"] == 20 and most.counts["degenerate"] == 0
    assert most.truncated_share == pytest.approx(20 / 30) and not most.passed
    with pytest.raises(ValidationGateError) as failed:
        require_fit_to_train(most)
    message = str(failed.value)
    assert re.search(r"20 cut by max_tokens \(66\.7%; threshold max_truncated_share", message)
    assert "had their whole max_tokens budget" in message and "raise max_tokens" in message
    # The same cuts where the trainer's max_length set each turn's budget: expected, counted apart, never gated.
    by_design = corpus("by-design", 20, budget_by="max_length")
    assert by_design.counts["cut_at_max_length"] == {"rows": 20, "trained": 20}
    assert by_design.counts["length_limited"] == 0 and by_design.passed
    line = require_fit_to_train(by_design)
    assert line.startswith("PASS") and "0 cut by max_tokens" in line
    assert "20 more cut at the trainer's max_length (expected, 20 trained as generated; not gated)" in line


def _observe(guard: Guard, count: int, *, cut: float, seed: int = 0, budget_by: str = "max_tokens") -> None:
    """``count`` results, a share ``cut`` of them cut at their limit (``budget_by``: which limit set it)."""
    rng = random.Random(seed)
    for i in range(count):
        length = rng.random() < cut
        guard.observe(
            id=f"p{i}",
            server="http://127.0.0.1:30000",
            content=None if length else "An answer.",
            reasoning="Thinking it over." if length or rng.random() < 0.99 else "",
            finish_reason="length" if length else "stop",
            budget_by=budget_by,
        )


def test_the_garbage_guard_lets_expected_truncation_pass_and_halts_when_most_answers_are_cut():
    _observe(Guard(GuardSettings()), 600, cut=0.3)  # production defaults: max_truncated_rate 0.5
    with pytest.raises(GuardTripped) as caught:
        _observe(Guard(GuardSettings()), 600, cut=0.7)
    assert caught.value.report.defect == "truncated" and caught.value.report.rate > 0.5
    text = caught.value.report.text()
    assert "are cut by max_tokens" in text and "Raise max_tokens" in text


def test_the_guard_never_halts_on_turns_cut_where_the_trainers_max_length_set_the_budget():
    # A long multi-turn set: 90% of the turns end at the room max_length left them (their empty answers too).
    guard = Guard(GuardSettings())
    _observe(guard, 2000, cut=0.9, budget_by="max_length")
    assert guard.cut_at_max_length > 1700 and guard.totals["truncated"] == 0
    assert guard.totals["empty_answer"] == 0 and guard.seen == 2000
    # ... and the window still judges the turns that were not cut that way: garbage among them halts.
    with pytest.raises(GuardTripped) as caught:
        for i in range(200):
            guard.observe(id=f"e{i}", server="s", content="", reasoning="r", finish_reason="stop")
    assert caught.value.report.defect == "empty_answer"


# ----- the same against the simulator's own ids and records ----------------------------------------------------
def test_a_simulated_run_trains_its_cut_turns_exactly_as_the_servers_generated_them(
    instant_fleet, tmp_path, tokenizer_dir, tokenizer
):
    prompts = tmp_path / "prompts.jsonl"
    # short prompts: every cut turn fits the trainer's max_length (a long chat's later turn, uncapped here, would
    # not, and is rightly dropped; tests/test_cut_by_cause.py runs those under the cap)
    write_rows(prompts, (r for r in synthetic_rows(130, seed=11) if r["category"] != LONG_CHAT))
    fleet = instant_fleet(2)
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": "Qwen/Qwen3.6-27B",
            "prompts": str(prompts),
            "out_dir": str(tmp_path / "gen"),
            "max_tokens": 72,  # the instant profile answers in ~80 tokens: many turns are cut
            "concurrency_per_server": 8,
            "canary": False,
            "max_truncated_rate": 1.0,
        },
    )

    async def run() -> None:
        result = await generate(config, await preflight(config), progress=False)
        assert result.status == "complete", result

    asyncio.run(run())
    stored = pl.read_parquet(tmp_path / "gen" / "shards" / "*.parquet")
    result = validate_generation(
        _config(tokenizer_dir, tmp_path / "gen", tmp_path / "out", max_truncated_share=1.0),
        tokenizer=tokenizer,
        progress=False,
    )
    truth = {r["rid"]: r for r in fleet.truth() if r.get("kind") != "rejected"}
    prompts_out, conversations = _prompts(tmp_path / "out"), _conversations(tmp_path / "out")
    cut_turns = checked_single = histories = 0
    for sample in stored.iter_rows(named=True):
        outputs = sample["turn_output_ids"]
        turn_prompts = expand(sample["turn_prompt_shared"], sample["turn_prompt_ids"], outputs)
        for j, finish in enumerate(sample["turn_finish_reason"]):
            key = sample["id"] if len(outputs) == 1 else f"{sample['id']}#{j}"
            if finish != "length":
                continue
            cut_turns += 1
            exported = prompts_out[key]
            assert exported["input_ids"] == [*turn_prompts[j], *outputs[j]], key
            assert exported["loss_mask"] == [0] * len(turn_prompts[j]) + [1] * len(outputs[j]), key
            assert key not in conversations
            if len(outputs) == 1:  # the simulator's record of the request: what it billed, and why it ended
                record = truth[sample["response_id"]]
                assert record["finish_type"] == "length" and record["completion_tokens"] == len(outputs[j])
                assert record["prompt_tokens"] + record["completion_tokens"] == len(exported["input_ids"])
                checked_single += 1
            following = f"{sample['id']}#{j + 1}"
            if (
                following in conversations
            ):  # the next turn's history: the cut turn's content, as the target saw it
                later = [t for t in conversations[following] if t["role"] == "assistant"]
                assert later[j]["content"] == (sample["turn_content"][j] or "")
                histories += 1
    assert cut_turns >= 10 and checked_single >= 5 and histories >= 1, (cut_turns, checked_single, histories)
    counts = result.counts
    assert counts["cut_turns"]["trained"] == cut_turns and counts["dropped_by_flag"]["truncated"] == 0
    assert counts["length_limited"] >= cut_turns and result.truncated_share == pytest.approx(
        counts["length_limited"] / counts["in"]
    )
    buckets = counts["yield"]["buckets"]
    assert (
        sum(buckets.values())
        == counts["yield"]["generated_tokens"]
        == sum(sum(t) for t in stored["turn_completion_tokens"].to_list())
    )


# ----- the rows, unit by unit -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(build_qwen3_tokenizer(tmp_path_factory.mktemp("qwen3") / "tok"))


def test_server_rows_of_a_cut_turn_compare_only_the_models_tokens_and_count_the_templates(qwen3):
    """Qwen3's real vocabulary: a cut in the reasoning re-renders with ``\\n`` ``</think>`` ``\\n\\n``
    ``<|im_end|>`` ``\\n`` after the model's last token; the server's row has none of them and is not reported as a
    re-tokenizing difference for that."""
    sample = clean_rows(4, seed=5)[0]
    cut, prompt, output = with_cut_turn(sample, qwen3, 0, 15)
    frame = turn_rows(
        pl.DataFrame([cut]).with_columns(
            pl.lit("f").alias("folder"), pl.lit("s").alias("shard"), pl.lit(0).alias("row")
        )
    ).frame
    spec = MaskSpec(trainer=Trainer.SPECFORGE_QWEN35, max_length=4096, last_turn_only=True)
    conversations = assemble_batch(frame).conversations
    retokenized = build_conversation_masks(qwen3, conversations, spec, keep_ids=True)
    tokens = server_rows(
        qwen3, ids_layout(qwen3, spec.rules), frame, retokenized, last_only=True, max_length=4096
    )
    assert tokens.masks.input_ids[0] == [*prompt, *output] and tokens.differs_at == [None]
    assert np.array_equal(tokens.masks.loss_mask(0), np.r_[np.zeros(len(prompt)), np.ones(len(output))])
    added = retokenized.input_ids[0][len(prompt) + len(output) :]
    decoded = [qwen3.backend_tokenizer.decode([t], skip_special_tokens=False) for t in added]
    assert decoded == ["\n", "</think>", "\n\n", "<|im_end|>", "\n"] and tokens.closing == [5]
    assert tokens.generated.tolist() == tokens.supervised_generated.tolist() == [len(output)]
