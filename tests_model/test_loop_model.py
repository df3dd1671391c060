"""The closed loop end to end on the real model's rows, small (a few dozen rows, one seed, one epoch): SpecForge
0.2.0's own ``specforge train`` trains a DFlash drafter on each arm from offline features of SmolLM2, and the metric
comes from those real rows. Which arm is better is the benchmark's to say (benchmarks/closed_loop.py), not this test's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TRAIN_MAX_LENGTH, TRAINER

from draftgen.loop import arms, evaluate
from draftgen.loop.config import LoopConfig
from draftgen.loop.step import run
from draftgen.params import build_config

BLOCK = 8
ANCHORS = (
    1024  # above any row's anchor count here: SpecForge's own evaluator then sees every anchor, as ours does
)


@pytest.fixture(scope="module")
def loop_run(pipeline, smollm2, tmp_path_factory):
    config = build_config(
        LoopConfig,
        {
            "export_dir": str(pipeline.validate_dir),
            "prompts": pipeline.params["prompts"],
            "target": str(smollm2),
            "trainer": TRAINER,
            "train_max_length": TRAIN_MAX_LENGTH,
            "seeds": [0],
            "epochs": 1,
            "limit": 16,
            "block_size": BLOCK,
            "num_anchors": ANCHORS,
            "specforge": str(Path(sys.executable).with_name("specforge")),
            "threads": 1,  # beside other tiers on two cores, torch's two threads contend (docs/loop.md)
            "out_dir": str(tmp_path_factory.mktemp("loop") / "run"),
        },
    )
    return config, run(config)


def test_specforge_trains_both_arms_and_each_is_evaluated_on_the_held_out_answers(loop_run):
    _, result = loop_run
    assert [r.arm for r in result.runs] == ["baseline", "export", "original"]
    summary = json.loads((result.out_dir / "loop.json").read_text())
    assert summary["inputs"]["held_out_rows"] == result.held_rows > 0
    for run_ in result.runs:
        assert len(run_.accuracy) == BLOCK - 1 and all(0.0 <= a <= 1.0 for a in run_.accuracy)
        assert run_.train_rows == 16
    for arm in ("export", "original"):
        log = (result.out_dir / "runs" / f"{arm}-seed0" / "train.log").read_text()
        assert "eval/avg_acc" in log, "SpecForge's own evaluator ran on the held-out features"
    assert (result.out_dir / ".complete").is_file()


def test_the_metric_is_computed_from_the_real_rows(loop_run):
    """The held-out features are the export's held-out rows, token for token; our pooled accuracy is SpecForge's own
    evaluator's (every anchor in both); the simulated length is SpecForge's formula over our per-position accuracy;
    the baseline predicts the export's commonest trained token."""
    config, result = loop_run
    held = arms.read_rows(arms.export_files(config.export_dir)[1])
    import torch

    files = sorted((result.out_dir / "features" / "holdout").glob("*.ckpt"))
    stored = [torch.load(f, weights_only=False) for f in files]
    by_ids = {tuple(r.input_ids): r for r in held}
    for features in stored:
        row = by_ids[tuple(features["input_ids"].tolist())]
        assert features["loss_mask"].tolist() == row.loss_mask
        assert features["hidden_states"].shape[0] == len(row.input_ids)
    assert max(len(evaluate.anchor_labels(r.input_ids, r.loss_mask, BLOCK)) for r in held) <= ANCHORS
    for run_ in (r for r in result.runs if r.seed is not None):
        assert run_.pooled == pytest.approx(run_.specforge_eval_acc, abs=1e-6), run_.arm
        total, cumulative = 0.0, 1.0
        for accuracy in run_.accuracy:
            cumulative *= accuracy
            total += cumulative
        assert run_.simulated_length == pytest.approx(total)
    from collections import Counter

    trained = [
        torch.load(f, weights_only=False)
        for f in sorted((result.out_dir / "features" / "export").glob("*.ckpt"))
    ]
    counts = Counter(
        t for f in trained for t, m in zip(f["input_ids"].tolist(), f["loss_mask"].tolist(), strict=True) if m
    )
    token = counts.most_common(1)[0][0]
    assert result.inputs["baseline_token"] == token
    # position 1 of an anchor at t predicts t + 1, supervised by the anchor rule: the share of those that are `token`
    nexts = [
        r.input_ids[t + 1]
        for r in held
        for t in range(len(r.input_ids) - 1)
        if r.loss_mask[t] and r.loss_mask[t + 1]
    ]
    baseline = result.runs[0]
    assert baseline.accuracy[0] == pytest.approx(sum(n == token for n in nexts) / len(nexts))
    print(f"\n{result.table()}\n{result.verdict}")
