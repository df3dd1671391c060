"""Accuracy per draft position on the held-out rows, from a trained DFlash checkpoint, and for the baseline.

SpecForge 0.2.0's own evaluator gives DFlash one pooled accuracy (``eval/avg_acc``; its ``simulated_acc_len`` is that
same number), so the loop counts per position itself, with SpecForge's model: the run's DFlash model built by
SpecForge's assembly from the run's config, the checkpoint's draft weights loaded, and its block forward run with
every anchor (an anchor: a supervised token whose successor is supervised, SpecForge's rule). Draft position k of an
anchor at t predicts the token at t + k (k = 1 .. block_size − 1); it counts where that token is supervised. The
simulated acceptance length is SpecForge's formula over the per-position accuracies (``a1 + a1·a2 + ...``: the
draft tokens accepted per block when each position is right independently); ``accepted`` is measured directly, the
mean run of right predictions from position 1 per anchor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALL_ANCHORS = 1 << 20  # training.num_anchors at evaluation: more than any row has, so every anchor is used


@dataclass
class PositionCounts:
    """Right predictions and scored labels per draft position 1 .. block_size − 1, and each anchor's run."""

    positions: int
    correct: list[int] = field(default_factory=list)
    valid: list[int] = field(default_factory=list)
    runs: int = 0  # summed over anchors: right predictions in a row from position 1
    anchors: int = 0

    def __post_init__(self) -> None:
        self.correct = self.correct or [0] * self.positions
        self.valid = self.valid or [0] * self.positions

    def add(self, right: Sequence[Sequence[bool]], scored: Sequence[Sequence[bool]]) -> None:
        """One row's anchors: ``right[a][k]``, ``scored[a][k]`` for draft position k + 1."""
        for row_right, row_scored in zip(right, scored, strict=True):
            self.anchors += 1
            running = True
            for k, (ok, counted) in enumerate(zip(row_right, row_scored, strict=True)):
                if counted:
                    self.valid[k] += 1
                    self.correct[k] += bool(ok)
                running = running and counted and bool(ok)
                self.runs += running

    @property
    def accuracy(self) -> list[float]:
        return [c / v if v else 0.0 for c, v in zip(self.correct, self.valid, strict=True)]

    @property
    def pooled(self) -> float:
        """All positions together: what SpecForge's DFlash evaluator reports as eval/avg_acc."""
        return sum(self.correct) / max(1, sum(self.valid))

    @property
    def simulated_length(self) -> float:
        total, cumulative = 0.0, 1.0
        for accuracy in self.accuracy:
            cumulative *= accuracy
            total += cumulative
        return total

    @property
    def accepted(self) -> float:
        return self.runs / max(1, self.anchors)


def anchor_labels(
    input_ids: Sequence[int], loss_mask: Sequence[int], block_size: int
) -> list[list[int | None]]:
    """Per anchor (SpecForge's rule), the token each draft position must predict (None: not supervised there)."""
    n = len(input_ids)
    out = []
    for t in range(n - 1):
        if loss_mask[t] and loss_mask[t + 1]:
            out.append(
                [input_ids[t + k] if t + k < n and loss_mask[t + k] else None for k in range(1, block_size)]
            )
    return out


def most_frequent_token(rows: Iterable[Any]) -> int:
    """The commonest supervised token of rows (objects with input_ids and loss_mask)."""
    from collections import Counter

    counts: Counter[int] = Counter()
    for row in rows:
        counts.update(t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m)
    return counts.most_common(1)[0][0]


def baseline_counts(rows: Iterable[Any], token: int, block_size: int) -> PositionCounts:
    """Predict ``token`` at every draft position."""
    counts = PositionCounts(block_size - 1)
    for row in rows:
        labels = anchor_labels(row.input_ids, row.loss_mask, block_size)
        counts.add(
            [[label == token for label in a] for a in labels],
            [[label is not None for label in a] for a in labels],
        )
    return counts


def _feature_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.ckpt"))


def checkpoint_counts(run_config: Path, checkpoint: Path, features: Path, device: str) -> PositionCounts:
    """The trained drafter of ``checkpoint`` (a SpecForge checkpoint folder) on every row of ``features``."""
    import torch
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.training.assembly import build_model_bundle

    cfg = load_config(str(run_config), [f"training.num_anchors={ALL_ANCHORS}"])
    resolved = resolve_run(cfg)
    bundle = build_model_bundle(resolved.config, algorithm=resolved.algorithm)
    state = torch.load(Path(checkpoint) / "training_state.pt", map_location="cpu", weights_only=False)
    bundle.draft_model.load_state_dict(state["draft_state_dict"], strict=True)
    model = bundle.model.to(device).eval()
    block = int(model.block_size)
    counts = PositionCounts(block - 1)
    with torch.no_grad():
        for path in _feature_files(features):
            raw = torch.load(path, map_location="cpu", weights_only=False)
            ids = raw["input_ids"].to(device).unsqueeze(0)
            mask = raw["loss_mask"].to(device).unsqueeze(0)
            hidden = raw["hidden_states"].to(device).unsqueeze(0)
            anchors, keep, out = model._forward_draft_blocks(
                input_ids=ids, hidden_states=hidden, loss_mask=mask
            )
            kept = anchors[0][keep[0]].tolist()
            blocks = out[0].reshape(anchors.shape[1], block, -1)[keep[0]]
            predicted = torch.cat([model.lm_head(chunk).argmax(-1) for chunk in blocks.split(64)]).tolist()
            labels = anchor_labels(raw["input_ids"].tolist(), raw["loss_mask"].tolist(), block)
            if len(labels) != len(kept):
                raise RuntimeError(
                    f"{path}: SpecForge used {len(kept)} anchors, the rule gives {len(labels)}"
                )
            counts.add(
                [
                    [p == lab for p, lab in zip(pred[1:], row, strict=True)]
                    for pred, row in zip(predicted, labels, strict=True)
                ],
                [[lab is not None for lab in row] for row in labels],
            )
    return counts
