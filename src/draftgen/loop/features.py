"""The target's hidden states for each row, as SpecForge 0.2.0's offline DFlash feature files.

Which layers and which keys are SpecForge's own answer for the run config (``resolve_offline_capture``: its DFlash
provider's capture layers and layout — ``input_ids``, ``loss_mask`` and ``hidden_states``, the captured layers'
outputs side by side), and a row its DFlash loader would refuse (no two adjacent supervised tokens: its
``loss_mask_filter``) is left out and counted. The target runs with Hugging Face transformers (one row at a time,
``output_hidden_states``): hidden state ``i + 1`` is decoder layer ``i``'s output, as SpecForge's capture numbers
them. One ``.ckpt`` per row, named by its position, so SpecForge's sorted listing keeps the rows' order.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgen.loop.arms import Row
from draftgen.rundir import write_bytes


@dataclass(frozen=True)
class Capture:
    layers: tuple[int, ...]  # the target layers whose outputs the drafter reads
    keys: tuple[
        str, str, str
    ]  # (input ids, loss mask, hidden states) as SpecForge's offline reader names them
    accepts: Any  # SpecForge's loss-mask filter for this strategy (None: every row)


@dataclass(frozen=True)
class FeatureSet:
    name: str
    folder: Path
    ids: list[str]  # the rows written, in order
    trained_tokens: int
    refused: list[str]  # rows SpecForge's loader would refuse: not written

    @property
    def rows(self) -> int:
        return len(self.ids)


def resolve_capture(spec_config: Any) -> Capture:
    """SpecForge's own capture plan for a run config (its typed Config)."""
    from specforge.application.composition import resolve_offline_capture

    plan = resolve_offline_capture(spec_config)
    layout = plan.layout
    names = dict(layout.passthrough)
    return Capture(
        layers=tuple(plan.capture_layers),
        keys=(names["input_ids"], names["loss_mask"], layout.aux_feature),
        accepts=plan.loss_mask_filter,
    )


def load_target(path: str | Path, device: str, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), local_files_only=True
    )
    return model.to(device).eval()


def write_features(
    model: Any, rows: Sequence[Row], folder: Path, capture: Capture, name: str, *, limit: int = 0
) -> FeatureSet:
    """Each row's features into ``folder`` (created); the first ``limit`` rows SpecForge accepts (0: all)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    ids_key, mask_key, hidden_key = capture.keys
    written: list[str] = []
    refused: list[str] = []
    trained = 0
    for row in rows:
        if limit and len(written) >= limit:
            break
        input_ids = torch.tensor(row.input_ids, dtype=torch.long)
        loss_mask = torch.tensor(row.loss_mask, dtype=torch.long)
        if capture.accepts is not None and not capture.accepts(loss_mask):
            refused.append(row.id)
            continue
        with torch.no_grad():
            out = model(input_ids.unsqueeze(0).to(device), output_hidden_states=True)
        hidden = torch.cat([out.hidden_states[layer + 1][0] for layer in capture.layers], dim=-1)
        buffer = io.BytesIO()
        torch.save({ids_key: input_ids, mask_key: loss_mask, hidden_key: hidden.cpu().contiguous()}, buffer)
        write_bytes(folder / f"{len(written):08d}.ckpt", buffer.getvalue())
        written.append(row.id)
        trained += row.trained
    return FeatureSet(name, folder, written, trained, refused)
