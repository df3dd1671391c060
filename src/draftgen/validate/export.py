"""The training export: clean samples as JSONL (the shape SpecForge's trainers read), optionally token parquet.

Written while validating, into ``out_dir/export.partial/``; ``finalize`` publishes it as ``out_dir/export/`` once
the gate has passed (``rundir.publish_folder``: every file and folder fsynced, then swapped in so that ``export/``
is always a whole export, the older one or this one), so a corpus that failed the gate never leaves an export that
looks finished. A full disk while writing or publishing raises ``DiskFull``; an older export stays whole.

  export/train.jsonl           {"id", "conversations": [...turns...], "tools"?}: system / user / tool turns as
                                 given (a tool result's tool_call_id the target's call it answers), every assistant
                                 turn the target model's own answer {"role": "assistant", "content",
                                 "reasoning_content", "tool_calls"?} (validate.turns; a source assistant turn appears
                                 only in a turns: last row kept despite foreign_assistant_turn, as {"role",
                                 "content"}); tool calls and tools in SpecForge's shape: calls {"id", "type",
                                 "function": {"name", "arguments": a JSON string}}, tools the schemas as a JSON string
                                 (SpecForge parses both: a column of objects would be unified by Arrow's JSON reader);
                                 not the turns cut by max_tokens that train as generated: a trainer renders these
                                 rows through its chat template, which would close a cut turn
  export/prompts.jsonl         {"id", "input_ids", "loss_mask"}: SpecForge's pre-tokenized data.prompts_path rows
                                 (DFlash reads them), the target's own ids where the server sent them, cut at
                                 max_length as the trainer cuts; every exported row, cut turns as generated
                                                                                                       (export_prompts)
  export/tokens/part-NNNNN.parquet   id, input_ids (list[int32]), loss_mask (list[int8])   (export_tokens)
  export/holdout/prompts.jsonl the held-out prompts as prompt rows {"id", "messages", "category"?} (holdout_share of the ids, whole
                                 conversations): never in the training files; the drafter verdict benchmarks on them
  export/holdout/eval.jsonl    the held-out clean samples as export/prompts.jsonl's rows: the target's own answers
                                 that no training file holds, a drafter's eval set (draftgen loop)  (export_prompts)
  export/counts.json           samples in, out, dropped, and dropped per flag
  export/README.md, export/dataset_info.json   the dataset card (validate.card)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from draftgen.rundir import publish_folder, write_json, write_parquet
from draftgen.rundir.layout import EXPORT as FINAL
from draftgen.rundir.layout import EXPORT_CONVERSATIONS, EXPORT_COUNTS, EXPORT_TOKENS, export_tokens_part_name
from draftgen.rundir.layout import EXPORT_HOLDOUT as HOLDOUT
from draftgen.rundir.layout import EXPORT_HOLDOUT_EVAL as HOLDOUT_EVAL
from draftgen.rundir.layout import EXPORT_PROMPTS as PROMPTS
from draftgen.rundir.layout import EXPORT_STAGING as STAGING
from draftgen.rundir.publish import StreamedFile
from draftgen.sampling_plan import prompt_of
from draftgen.training.conversation import stored_messages
from draftgen.training.masks import MaskBatch


class ExportWriter:
    """Appends the kept rows of each batch to the staging folder."""

    def __init__(self, out_dir: Path, *, jsonl: bool, tokens: bool, prompts: bool = False):
        self.out_dir = Path(out_dir)
        self.staging = self.out_dir / STAGING
        self.jsonl = jsonl
        self.tokens = tokens
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True)
        self._parts = 0
        self._handle = StreamedFile(self.staging / EXPORT_CONVERSATIONS) if jsonl else None
        self._prompts = StreamedFile(self.staging / PROMPTS) if prompts else None
        self._holdout: Any = None
        self._holdout_eval: Any = None
        self._held: set[str] = set()  # prompt ids written (an id stored twice is held out once)

    def write(
        self,
        frame: pl.DataFrame,
        conversations: list[list[dict[str, Any]]],
        masks: MaskBatch,
        keep: np.ndarray,
        *,
        conversations_keep: np.ndarray | None = None,
    ) -> int:
        """Write rows where ``keep`` is true (``conversations``: each row's assembled turns) to the files of ids,
        and those where ``conversations_keep`` is (default ``keep``) to train.jsonl; returns how many of ``keep``."""
        rows = np.flatnonzero(keep)
        if self._handle is not None:
            chosen = rows if conversations_keep is None else np.flatnonzero(conversations_keep)
            ids = frame["id"].to_list()
            arms = frame["arm"].to_list() if "arm" in frame.columns else [None] * frame.height
            tools = frame["tools"].to_list() if "tools" in frame.columns else [None] * frame.height
            lines = [
                json.dumps(
                    {
                        "id": ids[i],
                        **({"arm": arms[i]} if arms[i] else {}),
                        "conversations": conversations[i],
                        **({"tools": tools[i]} if tools[i] else {}),
                    },
                    ensure_ascii=False,
                )
                for i in chosen
            ]
            if lines:
                self._handle.write("\n".join(lines) + "\n")
        if rows.size == 0:
            return 0
        if self._prompts is not None:
            self._prompts.write(_id_lines(frame, masks, rows))
        if self.tokens:
            if masks.input_ids is None:
                raise ValueError("token export needs masks built with keep_ids=True")
            part = pl.DataFrame(
                {
                    "id": frame["id"].gather(rows),
                    "input_ids": pl.Series([masks.input_ids[i] for i in rows], dtype=pl.List(pl.Int32)),
                    "loss_mask": pl.Series([masks.loss_mask(int(i)) for i in rows], dtype=pl.List(pl.Int8)),
                }
            )
            (self.staging / EXPORT_TOKENS).mkdir(exist_ok=True)
            write_parquet(self.staging / EXPORT_TOKENS / export_tokens_part_name(self._parts), part)
            self._parts += 1
        return int(rows.size)

    def write_held_out(self, frame: pl.DataFrame, masks: MaskBatch, held: np.ndarray) -> None:
        """The held-out clean samples (``held``) as prompts.jsonl's rows, into holdout/eval.jsonl (with the prompts
        export): what the drafter would be asked to predict, never trained on."""
        rows = np.flatnonzero(held)
        if self._prompts is None or rows.size == 0:
            return
        if self._holdout_eval is None:
            (self.staging / HOLDOUT).mkdir(exist_ok=True)
            self._holdout_eval = StreamedFile(self.staging / HOLDOUT / HOLDOUT_EVAL)
        self._holdout_eval.write(_id_lines(frame, masks, rows))

    def write_holdout(self, stored: pl.DataFrame) -> None:
        """The held-out conversations' source prompts, as generate and benchmark read prompt rows: once per
        prompt (a sampling plan's samples of one prompt share it, under the prompt's id), whole (the messages'
        tool calls, ids and names, and the tools)."""
        optional = [c for c in ("category", "message_extras", "tools") if c in stored.columns]
        rows = []
        for r in stored.select("id", "messages", *optional).iter_rows(named=True):
            r["id"] = prompt_of(r["id"])
            if r["id"] not in self._held:
                self._held.add(r["id"])
                r["messages"] = stored_messages(r)
                rows.append(r)
        if not rows:
            return
        if self._holdout is None:
            (self.staging / HOLDOUT).mkdir(exist_ok=True)
            self._holdout = StreamedFile(self.staging / HOLDOUT / PROMPTS)
        lines = [
            json.dumps(
                {
                    "id": r["id"],
                    "messages": r["messages"],
                    **({"tools": json.loads(r["tools"])} if r.get("tools") else {}),
                    **({"category": r["category"]} if r.get("category") else {}),
                },
                ensure_ascii=False,
            )
            for r in rows
        ]
        self._holdout.write("\n".join(lines) + "\n")

    def close(self, counts: dict[str, Any]) -> None:
        for handle in (self._handle, self._prompts, self._holdout, self._holdout_eval):
            if handle is not None:
                handle.close()
        self._handle = self._prompts = self._holdout = self._holdout_eval = None
        write_json(self.staging / EXPORT_COUNTS, counts, indent=2, end="\n")


def _id_lines(frame: pl.DataFrame, masks: MaskBatch, rows: np.ndarray) -> str:
    """SpecForge's pre-tokenized rows {"id", "input_ids", "loss_mask"} of ``rows``, as JSONL text."""
    if masks.input_ids is None:
        raise ValueError("the prompts export needs masks built with keep_ids=True")
    ids = frame["id"].to_list()
    lines = [
        json.dumps(
            {
                "id": ids[i],
                "input_ids": [int(t) for t in masks.input_ids[i]],
                "loss_mask": masks.loss_mask(int(i)).tolist(),
            }
        )
        for i in rows
    ]
    return "\n".join(lines) + "\n"


def finalize(out_dir: Path) -> Path:
    """Publish ``export.partial`` as ``export`` (replacing an older export in the same folder, which stays whole
    until the new one is in place)."""
    out_dir = Path(out_dir)
    staging = out_dir / STAGING
    if not staging.is_dir():
        raise FileNotFoundError(f"no staged export at {staging}: run validation first")
    return publish_folder(staging, out_dir / FINAL)
