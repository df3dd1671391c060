"""Loss masks with the target model's own tokenizer and chat template: ``input_ids`` and ``loss_mask`` per sample.

A drafter learns only from the tokens its loss mask covers, so this is what has to be checked before training.
For each sample (prompt turns + the generated ``reasoning_content`` and ``content``):

1. Render through the tokenizer's chat template (``apply_chat_template``, ``enable_thinking``), in batches:
   the *prompt* (prompt turns + generation prompt) and the *full* conversation (prompt turns + the assistant turn).
2. Move the prompt/target boundary according to the convention (``MaskSpec.convention``):
   ``think_in_prompt`` — the think opener ``<think>\\n`` belongs to the prompt. Qwen3.5/3.6-style templates end
   the generation prompt with it (the server sent it; the model never produced it), so it is not a target.
   ``think_in_target`` — the prompt ends at the assistant header ``<|im_start|>assistant\\n``; ``<think>\\n`` is
   supervised (what a trainer that masks from the assistant header does; what Qwen3 itself generated).
   With ``enable_thinking`` off the template's own generation prompt (with its empty think block) is the prompt.
3. Tokenize prompts and full conversations with the fast tokenizer's parallel batch encoder.
4. The supervised span runs from the first token after the prompt through the last end-of-turn token
   (``<|im_end|>``); the template's newline after it is not supervised.

The prompt's tokens must be an exact prefix of the full conversation's tokens. When they are not, the sample is
marked ``template_mismatch`` with the reason, and nothing is guessed:
  * ``template error``: the template raised for this sample; no tokens.
  * ``text``: the full rendering does not start with the prompt rendering (the template renders the history
    differently once an answer follows); mask sum 0.
  * ``boundary``: same text, but the tokenizer merges characters across the boundary (an empty think block under
    ``think_in_prompt``: the prompt's ``\\n`` and the target's ``\\n`` become one ``\\n\\n`` token). The mask sum is
    then counted on the target tokenized on its own — the tokens the model emitted after that prompt.
  * ``no end-of-turn``: the answer span holds no end-of-turn token, so training would never learn to stop.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np


class MaskConvention(StrEnum):
    THINK_IN_PROMPT = "think_in_prompt"
    THINK_IN_TARGET = "think_in_target"


THINK_OPENER = "<think>\n"
END_OF_TURN = "<|im_end|>"


class TokenizerLoadError(ValueError):
    """The tokenizer folder is missing or unusable: names the folder and what to do."""


@dataclass(frozen=True)
class MaskSpec:
    convention: MaskConvention = MaskConvention.THINK_IN_PROMPT
    enable_thinking: bool = True
    end_of_turn: str = END_OF_TURN
    think_opener: str = THINK_OPENER

    def __post_init__(self) -> None:
        object.__setattr__(self, "convention", MaskConvention(self.convention))


def load_tokenizer(path: str | Path, *, end_of_turn: str = END_OF_TURN) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` from local files only, checked for what masks need."""
    folder = Path(path)
    hint = (
        "give the target model's folder (with tokenizer.json and tokenizer_config.json), or build a local "
        f"Qwen3-format one with `draftgen tokenizer --out {folder}`"
    )
    if not folder.exists():
        raise TokenizerLoadError(f"tokenizer folder {folder} does not exist: {hint}")
    if not folder.is_dir():
        raise TokenizerLoadError(f"tokenizer path {folder} is not a folder: {hint}")
    # Only tokenizers are needed here: no "PyTorch was not found" advice, no tqdm "IProgress not found" warning.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for unusable folders
        raise TokenizerLoadError(
            f"cannot load a tokenizer from {folder} ({type(exc).__name__}: {exc}): {hint}"
        ) from None
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise TokenizerLoadError(
            f"{folder} loads only a slow (pure-Python) tokenizer; masks need the fast one: add tokenizer.json"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerLoadError(f"{folder} has no chat template (tokenizer_config.json chat_template)")
    if tokenizer.convert_tokens_to_ids(end_of_turn) in (None, tokenizer.unk_token_id):
        raise TokenizerLoadError(f"{folder}: end-of-turn token {end_of_turn!r} is not in the vocabulary")
    return tokenizer


@dataclass(frozen=True)
class RenderedBatch:
    prompt_texts: list[str]  # prompt turns + generation prompt, boundary moved per the convention
    full_texts: list[str]  # prompt turns + the assistant turn
    errors: list[str | None]  # the template's exception for a sample, else None


def _clean_turns(messages: Sequence[dict]) -> list[dict]:
    return [{k: v for k, v in turn.items() if v is not None} for turn in messages]


def _render_each(
    tokenizer: Any, conversations: list[list[dict]], errors: list[str | None], **kwargs: Any
) -> list[str]:
    """One batched template call; when it raises, sample by sample to find (and mark) the culprits."""
    try:
        return list(tokenizer.apply_chat_template(conversations, tokenize=False, **kwargs))
    except Exception:
        texts = []
        for index, conversation in enumerate(conversations):
            try:
                texts.append(tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs))
            except Exception as exc:
                errors[index] = errors[index] or f"template error: {type(exc).__name__}: {exc}"
                texts.append("")
        return texts


def render_batch(
    tokenizer: Any,
    messages: Sequence[Sequence[dict]],
    reasoning: Sequence[str | None],
    content: Sequence[str | None],
    spec: MaskSpec,
) -> RenderedBatch:
    """Render prompts and full conversations for a batch through the tokenizer's own chat template."""
    prompts = [_clean_turns(turns) for turns in messages]
    fulls = [
        [*turns, {"role": "assistant", "content": answer or "", "reasoning_content": thought}]
        for turns, thought, answer in zip(prompts, reasoning, content, strict=True)
    ]
    errors: list[str | None] = [None] * len(prompts)
    if not prompts:
        return RenderedBatch([], [], [])
    kwargs = {"enable_thinking": spec.enable_thinking}
    prompt_texts = _render_each(tokenizer, prompts, errors, add_generation_prompt=True, **kwargs)
    full_texts = _render_each(tokenizer, fulls, errors, add_generation_prompt=False, **kwargs)
    if spec.enable_thinking:
        opener = spec.think_opener
        if spec.convention is MaskConvention.THINK_IN_PROMPT:
            prompt_texts = [t if t.endswith(opener) else t + opener for t in prompt_texts]
        else:
            prompt_texts = [t.removesuffix(opener) for t in prompt_texts]
    return RenderedBatch(prompt_texts, full_texts, errors)


@dataclass(frozen=True)
class MaskBatch:
    """Per sample: token counts, the supervised span [n_prompt, mask_end) of the full ids, and mismatches."""

    n_tokens: np.ndarray  # length of the full conversation's input_ids
    n_prompt: np.ndarray  # prompt tokens (the prefix that is never supervised)
    mask_sum: np.ndarray  # supervised tokens (for a mismatch: the diagnostic count; its loss_mask is all 0)
    mask_end: np.ndarray  # exclusive end of the supervised span in input_ids (n_prompt when none)
    mismatch: list[str | None]  # why the prompt is not a token prefix (see module doc), else None
    input_ids: list[list[int]] | None  # full conversation ids, when asked for (keep_ids=True)

    def __len__(self) -> int:
        return len(self.mismatch)

    def loss_mask(self, index: int) -> np.ndarray:
        """1 on supervised tokens of sample ``index``, 0 elsewhere (int8, length n_tokens)."""
        mask = np.zeros(int(self.n_tokens[index]), dtype=np.int8)
        if self.mismatch[index] is None:
            mask[int(self.n_prompt[index]) : int(self.mask_end[index])] = 1
        return mask


def _encode(backend: Any, texts: list[str]) -> list[list[int]]:
    encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch  # parallel, in Rust
    return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]


def _span_end(ids: list[int], start: int, end_of_turn: int) -> int:
    """One past the last end-of-turn token at or after ``start``; -1 when there is none."""
    index = len(ids) - 1
    while index >= start and ids[index] != end_of_turn:
        index -= 1
    return index + 1 if index >= start else -1


def compute_masks(
    tokenizer: Any, rendered: RenderedBatch, spec: MaskSpec, *, keep_ids: bool = False
) -> MaskBatch:
    """Tokenize a rendered batch (two parallel batch encodes) and place each sample's supervised span."""
    backend = tokenizer.backend_tokenizer
    end_of_turn = tokenizer.convert_tokens_to_ids(spec.end_of_turn)
    full_ids = _encode(backend, rendered.full_texts)
    prompt_ids = _encode(backend, rendered.prompt_texts)
    size = len(full_ids)
    n_tokens = np.fromiter((len(ids) for ids in full_ids), dtype=np.int64, count=size)
    n_prompt = np.fromiter((len(ids) for ids in prompt_ids), dtype=np.int64, count=size)
    mask_end = n_prompt.copy()
    mask_sum = np.zeros(size, dtype=np.int64)
    mismatch: list[str | None] = list(rendered.errors)
    boundary: list[int] = []
    for i in range(size):
        if mismatch[i] is not None:
            n_prompt[i] = mask_end[i] = 0
            continue
        n = int(n_prompt[i])
        if not rendered.full_texts[i].startswith(rendered.prompt_texts[i]):
            mismatch[i] = "text: the full conversation does not start with the rendered prompt"
            continue
        if full_ids[i][:n] != prompt_ids[i]:
            mismatch[i] = "boundary: prompt and answer tokens merge at the boundary"
            boundary.append(i)
            continue
        end = _span_end(full_ids[i], n, end_of_turn)
        if end < 0:
            mismatch[i] = f"no end-of-turn: no {spec.end_of_turn} after the prompt"
            mask_sum[i] = len(full_ids[i]) - n
            continue
        mask_end[i] = end
        mask_sum[i] = end - n
    if boundary:  # rare (empty think blocks): count what the model emitted after its prompt
        targets = _encode(
            backend, [rendered.full_texts[i][len(rendered.prompt_texts[i]) :] for i in boundary]
        )
        for i, ids in zip(boundary, targets, strict=True):
            end = _span_end(ids, 0, end_of_turn)
            mask_sum[i] = end if end >= 0 else len(ids)
    return MaskBatch(
        n_tokens=n_tokens,
        n_prompt=n_prompt,
        mask_sum=mask_sum,
        mask_end=mask_end,
        mismatch=mismatch,
        input_ids=full_ids if keep_ids else None,
    )


def build_masks(
    tokenizer: Any,
    messages: Sequence[Sequence[dict]],
    reasoning: Sequence[str | None],
    content: Sequence[str | None],
    spec: MaskSpec | None = None,
    *,
    keep_ids: bool = False,
) -> MaskBatch:
    """Render and tokenize one batch of samples: the whole job of this module in one call."""
    spec = spec or MaskSpec()
    rendered = render_batch(tokenizer, messages, reasoning, content, spec)
    return compute_masks(tokenizer, rendered, spec, keep_ids=keep_ids)
