"""Each training row's tokens: the server's ids where it sent them, else the trainer's re-tokenized rendering.

``server_rows`` takes a batch of training rows (one per generated turn, or per conversation) and the trainer's masks
of their re-rendered text (``retokenized``), and returns the rows to export: the server's ``prompt ids + output
ids`` masked by the trainer's rule on ids (``training.id_rows``) where the server sent usable ids, the re-tokenized
row otherwise — with, per row, where its tokens came from, where re-tokenizing would have differed, why a server's
ids could not be used, and the row's generated and supervised-generated token counts (the yield).

A turn cut by max_tokens is exactly ``prompt ids + output ids``; its re-rendered text goes on with the tokens the
chat template closes a turn with, which are compared with nothing (they are not the model's) but counted per row
(``closing``: what train.jsonl's path would add).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from draftgen.client.records import STOPPED
from draftgen.training.id_rows import (
    IdsLayout,
    compare,
    describe_difference,
    ids_problem,
    join_turn,
    span_mask,
)
from draftgen.training.masks import MaskBatch

SERVER = "server"
RETOKENIZED = "retokenized"


@dataclass(frozen=True)
class TokenRows:
    masks: MaskBatch  # what is exported: input_ids (cut at max_length) and loss masks, per row
    source: list[str]  # "server" or "retokenized"
    differs_at: list[int | None]  # first position where re-tokenizing the text gives another token
    difference: list[str | None]  # that position's two tokens, ids and text
    ids_problem: list[str | None]  # why the server's ids were not used (None: used, or none sent)
    ids_missing: np.ndarray  # bool: the server sent no ids for this turn
    generated: np.ndarray  # tokens the target generated for the row's supervised turn(s)
    supervised_generated: np.ndarray  # of those, how many the exported mask supervises (after the cut)
    cut_generated: np.ndarray  # generated tokens lost to the max_length cut
    # per row cut by max_tokens and built from the server's ids: the tokens the chat template adds after the model's
    # last one when the same turn is rendered from its text (train.jsonl's path: </think>, <|im_end|>, ...); None
    # for a finished turn, or where the rendering differs before the model's tokens end
    closing: list[int | None]


def _decoded(tokenizer: Any, outputs: list[list[int] | None]) -> list[str]:
    present = [i for i, ids in enumerate(outputs) if ids]
    texts = [""] * len(outputs)
    if present:
        decoded = tokenizer.backend_tokenizer.decode_batch(
            [outputs[i] for i in present], skip_special_tokens=False
        )
        for i, text in zip(present, decoded, strict=True):
            texts[i] = text
    return texts


def server_rows(
    tokenizer: Any,
    layout: IdsLayout,
    rows: pl.DataFrame,
    retokenized: MaskBatch,
    *,
    last_only: bool,
    max_length: int | None,
    stored_problems: list[str | None] | None = None,
) -> TokenRows:
    """The exported tokens of every row of ``rows`` (columns prompt_ids, output_ids, finish_reason, reasoning_content,
    content, completion_tokens); ``retokenized`` must hold input_ids (built with keep_ids=True)."""
    assert retokenized.input_ids is not None, "re-tokenized masks must keep their ids"
    size = rows.height
    prompts: list[list[int] | None] = rows["prompt_ids"].to_list()
    outputs: list[list[int] | None] = rows["output_ids"].to_list()
    finishes = rows["finish_reason"].to_list()
    reasonings = rows["reasoning_content"].to_list()
    contents = rows["content"].to_list()
    completion = rows["completion_tokens"].to_list()
    decoded = _decoded(tokenizer, outputs)
    tail = len(layout.tail)
    # Missing ids are news only in a batch that has some: a corpus from an engine that sends none is re-tokenized
    # as a whole, and the report and card say so once instead of flagging every row.
    expect_ids = any(o is not None for o in outputs)

    input_ids: list[list[int]] = []
    loss_masks: list[np.ndarray] = []
    n_tokens = np.zeros(size, dtype=np.int64)
    source: list[str] = []
    differs_at: list[int | None] = []
    difference: list[str | None] = []
    problems: list[str | None] = list(stored_problems) if stored_problems else [None] * size
    missing = np.zeros(size, dtype=bool)
    generated = np.zeros(size, dtype=np.int64)
    supervised = np.zeros(size, dtype=np.int64)
    cut = np.zeros(size, dtype=np.int64)
    closing: list[int | None] = [None] * size
    for i in range(size):
        retok_ids = retokenized.input_ids[i]
        retok_mask = retokenized.loss_mask(i)
        prompt, output = prompts[i], outputs[i]
        if problems[i] is None and (prompt is None or output is None):
            missing[i] = expect_ids
        if problems[i] is None and prompt is not None and output is not None:
            problems[i] = ids_problem(prompt, output, layout, decoded[i], reasonings[i], contents[i])
        if problems[i] is not None or prompt is None or output is None:
            input_ids.append(retok_ids)
            loss_masks.append(retok_mask)
            n_tokens[i] = retokenized.n_tokens[i]
            source.append(RETOKENIZED)
            differs_at.append(None)
            difference.append(None)
            made = int(completion[i] or 0)
            generated[i] = made
            # What the mask covers beyond the template's own text after the end-of-turn token.
            supervised[i] = max(0, min(made, int(retok_mask.sum()) - tail))
            cut[i] = max(0, min(made, int(retokenized.n_tokens[i]) - len(retok_ids)))
            continue
        assert prompt is not None and output is not None
        full = join_turn(prompt, output, finishes[i], layout)
        mask = span_mask(full, layout, last_only=last_only, max_length=max_length)
        ids = full[: len(mask)]
        if finishes[i] in STOPPED:
            at = compare(ids, retok_ids)
            if at is None:
                mask = retok_mask  # the same tokens: the trainer's own mask of them, exactly
        else:
            # A cut turn: the re-rendered text goes on with the tokens the template closes it with (not the
            # model's; counted in ``closing``). Only the model's tokens are compared.
            at = compare(ids, retok_ids[: len(ids)])
            if at is None:
                closing[i] = int(retokenized.n_tokens[i]) - len(full)
        input_ids.append(ids)
        loss_masks.append(mask)
        n_tokens[i] = len(full)
        source.append(SERVER)
        differs_at.append(at)
        difference.append(describe_difference(tokenizer, ids, retok_ids, at) if at is not None else None)
        start, end = len(prompt), len(prompt) + len(output)
        generated[i] = len(output)
        supervised[i] = int(mask[start:end].sum())
        cut[i] = max(0, end - max(start, len(mask)))
    masks = _as_batch(input_ids, loss_masks, n_tokens, retokenized)
    return TokenRows(
        masks, source, differs_at, difference, problems, missing, generated, supervised, cut, closing
    )


def _as_batch(
    input_ids: list[list[int]], loss_masks: list[np.ndarray], n_tokens: np.ndarray, retokenized: MaskBatch
) -> MaskBatch:
    size = len(input_ids)
    n_prompt = np.zeros(size, dtype=np.int64)
    mask_end = np.zeros(size, dtype=np.int64)
    mask_sum = np.zeros(size, dtype=np.int64)
    for i, mask in enumerate(loss_masks):
        supervised = np.flatnonzero(mask)
        if supervised.size:
            n_prompt[i], mask_end[i], mask_sum[i] = supervised[0], supervised[-1] + 1, supervised.size
    return MaskBatch(
        n_tokens=n_tokens,
        n_prompt=n_prompt,
        mask_sum=mask_sum,
        mask_end=mask_end,
        mismatch=list(retokenized.mismatch),
        input_ids=input_ids,
        loss_masks=loss_masks,
    )
