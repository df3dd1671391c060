"""draftgen loop's own logic, without SpecForge or a model (the real-model tier runs it end to end: tests_model/):
which source answer pairs with which generated turn, the per-position counts and the acceptance formula, the
baseline, the run config SpecForge is given, its log read back, and the verdict."""

from __future__ import annotations

import json

import polars as pl
import pytest

from draftgen.loop import arms, evaluate, report, specforge_run
from draftgen.loop.config import LoopConfig
from draftgen.params import ParameterError, build_config

CHAT = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Bye now."},
]


def test_each_generated_turn_pairs_with_the_source_answer_after_the_same_question():
    assert arms.original_conversation(CHAT, 0) == CHAT[:2]
    assert arms.original_conversation(CHAT, 1) == CHAT
    assert arms.original_conversation(CHAT, 2) is None
    unanswered = [*CHAT, {"role": "user", "content": "One more?"}]
    assert arms.original_conversation(unanswered, 2) is None, "the source ends with the question: no answer"


def test_original_rows_are_the_same_ids_with_the_sources_answers(tmp_path, tokenizer):
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "c1", "messages": CHAT}, {"id": "c2", "messages": CHAT[:1]}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    export = [arms.Row(i, [1, 2], [0, 1]) for i in ("c1#0", "c1#1", "c2", "other")]
    got = arms.original_rows(prompts, export, tokenizer, "specforge-qwen3-thinking", 4096)
    assert [r.id for r in got.rows] == ["c1#0", "c1#1"]
    assert got.unanswered == ["c2"] and got.unknown == ["other"]
    second = tokenizer.decode(
        [t for t, m in zip(got.rows[1].input_ids, got.rows[1].loss_mask, strict=True) if m]
    )
    assert "Bye now." in second and "Hello." not in second, (
        "only that turn is supervised, as validate's row per turn"
    )


def test_per_position_counts_and_simulated_length():
    counts = evaluate.PositionCounts(3)
    counts.add([[True, True, False], [True, False, True]], [[True, True, True], [True, True, False]])
    assert counts.valid == [2, 2, 1] and counts.correct == [2, 1, 0]
    assert counts.accuracy == [1.0, 0.5, 0.0]
    assert counts.simulated_length == pytest.approx(1.0 + 0.5 + 0.0)
    assert counts.accepted == pytest.approx((2 + 1) / 2), "runs of right predictions from position 1: 2 and 1"
    assert counts.pooled == pytest.approx(3 / 5)


def test_anchors_follow_specforges_rule_and_the_baseline_predicts_one_token():
    ids, mask = [10, 11, 12, 13, 12, 14], [0, 0, 1, 1, 1, 0]
    labels = evaluate.anchor_labels(ids, mask, block_size=4)
    assert labels == [[13, 12, None], [12, None, None]], "anchors at 2 and 3: supervised, and so is the next"
    row = arms.Row("r", ids, mask)
    assert evaluate.most_frequent_token([row]) == 12
    base = evaluate.baseline_counts([row], 12, block_size=4)
    assert base.accuracy == [0.5, 1.0, 0.0]


def _config(tmp_path, **values):
    return build_config(
        LoopConfig,
        {
            "export_dir": str(tmp_path),
            "prompts": str(tmp_path / "p.jsonl"),
            "target": str(tmp_path),
            "out_dir": str(tmp_path / "o"),
        }
        | values,
    )


def test_the_run_config_trains_dflash_offline_and_evaluates_once_at_the_end(tmp_path):
    config = _config(tmp_path, epochs=3, block_size=8, seeds=[5])
    spec = specforge_run.run_config(
        config,
        train=tmp_path / "a",
        evaluate=tmp_path / "c",
        rows=10,
        seed=5,
        out=tmp_path / "run",
        run_id="x",
    )
    assert spec["training"]["strategy"] == "dflash" and spec["training"]["fsdp_sharding"] == "NO_SHARD"
    assert spec["training"]["eval_interval"] == 30 == specforge_run.steps_for(10, 3)
    assert spec["data"]["hidden_states_path"] == str(tmp_path / "a")
    assert spec["data"]["eval_hidden_states_path"] == str(tmp_path / "c")
    assert spec["model"]["draft_block_size"] == 8 and spec["training"]["seed"] == 5


def test_seeds_are_distinct_and_export_files_named_when_missing(tmp_path):
    with pytest.raises(ParameterError, match="each seed once"):
        _config(tmp_path, seeds=[1, 1])
    with pytest.raises(arms.LoopInputError, match="export_prompts"):
        arms.export_files(tmp_path)


def test_specforges_log_is_read_back():
    log = "noise\nstep 4: {'acc': 0.1, 'loss': 3.0}\nstep 8: {'eval/avg_loss': 2.5, 'eval/avg_acc': 0.25}\n"
    assert specforge_run.logged_steps(log) == [
        (4, {"acc": 0.1, "loss": 3.0}),
        (8, {"eval/avg_loss": 2.5, "eval/avg_acc": 0.25}),
    ]


def _run(arm, seed, length):
    return report.ArmRun(arm, seed, [length, 0.0], length, 0.0, 0.0, None, 1, 1)


def test_the_verdict_names_the_better_arm_and_whether_the_seeds_agree():
    apart = report.summary(
        [_run("export", 0, 0.5), _run("export", 1, 0.6), _run("original", 0, 0.3), _run("original", 1, 0.4)]
    )
    assert apart.filter(pl.col("arm") == "export")["sim_accept_len"].item() == pytest.approx(0.55)
    assert report.verdict(apart, "export", "original").startswith(
        "export trains the better drafter (every seed)"
    )
    overlap = report.summary(
        [_run("export", 0, 0.5), _run("export", 1, 0.2), _run("original", 0, 0.4), _run("original", 1, 0.4)]
    )
    assert "original trains the better drafter (on the mean only" in report.verdict(
        overlap, "export", "original"
    )


def test_the_pilot_passes_only_when_the_export_beats_the_source_and_the_baseline_on_every_seed():
    ahead = [
        _run("export", 0, 0.5),
        _run("export", 1, 0.6),
        _run("original", 0, 0.3),
        _run("original", 1, 0.4),
    ]
    assert report.shown_better(report.summary(ahead), "export", ("original",))
    # the same arms, but the commonest token does as well as the export's worst seed: not shown
    baseline = [_run(report.BASELINE, None, 0.5)]
    assert not report.shown_better(report.summary([*ahead, *baseline]), "export", ("original",))
    # ahead on the mean only: the seeds' ranges overlap
    overlap = [
        _run("export", 0, 0.5),
        _run("export", 1, 0.35),
        _run("original", 0, 0.3),
        _run("original", 1, 0.4),
    ]
    assert not report.shown_better(report.summary(overlap), "export", ("original",))


def test_the_volume_matched_arm_keeps_each_rows_first_trained_tokens_up_to_its_source_answers_count():
    export = [
        arms.Row("a", [1, 2, 3, 4, 5, 6, 7], [0, 1, 1, 0, 1, 1, 1]),  # two turns: 2 + 3 trained
        arms.Row("b", [1, 2, 3], [0, 1, 1]),
    ]
    source = [arms.Row("a", [1, 9, 9], [0, 1, 1]), arms.Row("b", [1, 9, 9, 9, 9], [0, 1, 1, 1, 1])]
    matched = arms.volume_matched(export, source)
    assert [r.loss_mask for r in matched] == [
        [0, 1, 1, 0, 0, 0, 0],
        [0, 1, 1],
    ]  # b: the export's 2 are all it has
    assert [r.input_ids for r in matched] == [
        r.input_ids for r in export
    ]  # the context is the target's, whole
    assert sum(r.trained for r in matched) == 4
    with pytest.raises(ValueError, match="out of step"):
        arms.volume_matched(export, source[::-1])


def test_the_matched_arm_is_off_unless_asked(tmp_path):
    assert _config(tmp_path).matched_arm is False
    assert _config(tmp_path, matched_arm=True).matched_arm is True
