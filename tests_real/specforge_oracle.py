"""SpecForge 0.2.0 as the oracle for validate's loss masks: its own parser and its own dataset builder, called as is.

* ``specforge_masks(tokenizer, conversations, template, max_length, tools=...)``: SpecForge's ``ThinkingParser`` (the
  parser its ``qwen3.5`` and ``qwen3-thinking`` chat-template entries select) on each conversation, with its row's
  tools as SpecForge's dataset builder passes them (a row's ``tools``, a JSON string, parsed); input_ids, loss_mask
  and the warnings it raised, per conversation.
* ``specforge_dataset(train_jsonl, tokenizer, template, max_length, cache)``: the trainer's prompt preparation
  (``prepare_prompt_tasks``: ``datasets.load_dataset("json")``, then ``build_eagle3_dataset``) on an export, with
  every warning and every WARNING log record it produced.
* ``compare(validate_tokens, oracle)``: per id, are input_ids and loss_mask identical; the ids that differ.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

TRAINER_TEMPLATES = {"specforge-qwen3.5": "qwen3.5", "specforge-qwen3-thinking": "qwen3-thinking"}


@dataclass(frozen=True)
class OracleSample:
    input_ids: list[int]
    loss_mask: list[int]
    warnings: tuple[str, ...]


def load_tokenizer(tokenizer_dir: str | Path):
    """The folder loaded the way SpecForge's trainer loads its target's tokenizer (AutoTokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def specforge_masks(
    tokenizer,
    conversations: Sequence[list[dict]],
    template: str,
    max_length: int,
    *,
    train_only_last_turn: bool = False,
    tools: Sequence[list[dict] | None] | None = None,
) -> list[OracleSample]:
    from specforge.data.parse import ThinkingParser
    from specforge.data.template import TEMPLATE_REGISTRY

    chat_template = TEMPLATE_REGISTRY.get(template)
    assert chat_template.parser_type == "thinking", f"{template} does not select ThinkingParser"
    parser = ThinkingParser(tokenizer, chat_template)
    out = []
    for index, conversation in enumerate(conversations):
        tool = (tools[index] if tools is not None else None) or []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            input_ids, loss_mask = parser.parse(
                conversation, max_length, train_only_last_turn=train_only_last_turn, tool=tool
            )
        out.append(
            OracleSample(input_ids.tolist(), loss_mask.tolist(), tuple(str(w.message) for w in caught))
        )
    return out


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


@dataclass
class DatasetRun:
    samples: list[tuple[list[int], list[int]]]
    warnings: list[str] = field(default_factory=list)
    log_warnings: list[str] = field(default_factory=list)


def specforge_dataset(
    train_jsonl: Path,
    tokenizer,
    template: str,
    max_length: int,
    cache: Path,
    *,
    train_only_last_turn: bool = False,
) -> DatasetRun:
    """The trainer's own preparation of a raw-conversation JSONL (online mode, as its train_data_path)."""
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    from specforge.data.prompt_builder import prepare_prompt_tasks

    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tasks = prepare_prompt_tasks(
                train_jsonl,
                tokenizer,
                chat_template=template,
                max_length=max_length,
                is_preformatted=False,
                train_only_last_turn=train_only_last_turn,
                cache_dir=None,
                cache_key=None,
                num_proc=None,  # in this process, so its warnings can be caught (num_proc>=1 maps in workers)
            )
            samples = [(t["payload"]["input_ids"], t["payload"]["loss_mask"]) for t in tasks]
    finally:
        root.removeHandler(handler)
    return DatasetRun(samples, [str(w.message) for w in caught], handler.messages)


def dflash_prompts(prompts_jsonl: Path, tokenizer, max_length: int) -> list[tuple[list[int], list[int]]]:
    """SpecForge's prompt builder on a pre-tokenized ``data.prompts_path`` file, with the DFlash algorithm's own
    minimum loss tokens and loss-mask filter (as its assembly passes them): the (input_ids, loss_mask) it keeps."""
    from specforge.algorithms.model_providers import dflash_min_loss_tokens
    from specforge.data.loss_mask import has_consecutive_supervised_tokens
    from specforge.data.prompt_builder import prepare_prompt_tasks

    class _Draft:  # dflash_min_loss_tokens checks the draft config's block size only
        block_size = 16

    tasks = prepare_prompt_tasks(
        prompts_jsonl,
        tokenizer,
        chat_template=None,
        max_length=max_length,
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=None,
        min_loss_tokens=dflash_min_loss_tokens(None, _Draft()),
        loss_mask_filter=has_consecutive_supervised_tokens,
    )
    return [(t["payload"]["input_ids"], t["payload"]["loss_mask"]) for t in tasks]


def read_tokens(export: Path) -> dict[str, tuple[list[int], list[int]]]:
    frame = pl.concat([pl.read_parquet(p) for p in sorted((export / "tokens").glob("*.parquet"))])
    return {
        row["id"]: (list(row["input_ids"]), list(row["loss_mask"])) for row in frame.iter_rows(named=True)
    }


def compare(
    ours: dict[str, tuple[list[int], list[int]]], oracle: dict[str, OracleSample]
) -> tuple[int, list[str]]:
    """(samples compared, ids whose input_ids or loss_mask differ)."""
    assert sorted(ours) == sorted(oracle), "validate exported other samples than the oracle parsed"
    bad = [
        key
        for key, (ids, mask) in ours.items()
        if ids != oracle[key].input_ids or mask != oracle[key].loss_mask
    ]
    return len(ours), bad
