"""Loss masks with the target model's own tokenizer and chat template: ``input_ids`` and ``loss_mask`` per sample.

Whose mask is reproduced is named by the trainer (``MaskSpec.trainer``, draftgen.training.trainers): a SpecForge trainer
(every assistant span of the rendered conversation; draftgen.training.spans), or draftgen's own generated-turn
convention, described below.

A drafter learns only from the tokens its loss mask covers, so this is what has to be checked before training.
Generated-turn convention, for each sample (prompt turns + the generated ``reasoning_content`` and ``content``):

1. Render through the tokenizer's chat template (``apply_chat_template``, ``enable_thinking``), in batches:
   the *prompt* (prompt turns + generation prompt) and the *full* conversation (prompt turns + the assistant turn).
2. Move the prompt/target boundary according to the convention (trainer ``draftgen-think-in-prompt`` or
   ``draftgen-think-in-target``):
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

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftgen.training.spans import span_masks
from draftgen.training.trainers import (
    DEFAULT_TRAINER,
    LEGACY_CONVENTIONS,
    GeneratedTurnTrainer,
    SpanTrainer,
    Trainer,
    TrainerSpec,
    generated_turn_conversation,
    span_trainer_messages,
    specforge_calls,
    trainer_spec,
    turn_dict,
)

THINK_OPENER = "<think>\n"
END_OF_TURN = "<|im_end|>"


class TokenizerLoadError(ValueError):
    """The tokenizer folder is missing or unusable: names the folder and what to do."""


@dataclass(frozen=True)
class MaskSpec:
    trainer: Trainer = DEFAULT_TRAINER  # whose loss mask to reproduce (legacy convention names accepted)
    enable_thinking: bool = True  # the generation's setting (generated-turn conventions render with it)
    max_length: int | None = None  # span trainers cut input_ids (and the mask) here; None: no cut
    last_turn_only: bool = False  # span trainers: supervise only the last assistant turn (a row per turn)
    end_of_turn: str = END_OF_TURN
    think_opener: str = THINK_OPENER

    def __post_init__(self) -> None:
        trainer_spec(self.trainer)  # raises UnknownTrainerError naming the known trainers
        object.__setattr__(self, "trainer", Trainer(LEGACY_CONVENTIONS.get(self.trainer, self.trainer)))

    @property
    def rules(self) -> TrainerSpec:
        return trainer_spec(self.trainer)


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
    """Turns without None values, their tool calls' arguments as objects (what the template renders)."""
    out = []
    for turn in messages:
        clean = {k: v for k, v in turn.items() if v is not None and v != ()}
        if clean.get("tool_calls"):
            clean["tool_calls"] = specforge_calls(list(clean["tool_calls"]))
        out.append(clean)
    return out


Tools = Sequence[Sequence[Mapping[str, Any]] | None] | None  # per conversation: its tool schemas, or None


def _render_each(
    tokenizer: Any,
    conversations: list[list[dict]],
    errors: list[str | None],
    tools: Tools = None,
    **kwargs: Any,
) -> list[str]:
    """One batched template call per set of tools (``tools``: each conversation's; none: no tools); when one raises,
    sample by sample to find (and mark) the culprits."""
    groups: dict[str, list[int]] = {}
    for index in range(len(conversations)):
        schemas = tools[index] if tools is not None else None
        groups.setdefault(json.dumps(schemas or None, sort_keys=True), []).append(index)
    texts = [""] * len(conversations)
    for indices in groups.values():
        schemas = tools[indices[0]] if tools is not None else None
        extra = {"tools": [dict(t) for t in schemas]} if schemas else {}
        batch = [conversations[i] for i in indices]
        try:
            rendered = list(tokenizer.apply_chat_template(batch, tokenize=False, **extra, **kwargs))
        except Exception:
            rendered = []
            for index, conversation in zip(indices, batch, strict=True):
                try:
                    rendered.append(
                        tokenizer.apply_chat_template(conversation, tokenize=False, **extra, **kwargs)
                    )
                except Exception as exc:
                    errors[index] = errors[index] or f"template error: {type(exc).__name__}: {exc}"
                    rendered.append("")
        for index, text in zip(indices, rendered, strict=True):
            texts[index] = text
    return texts


def render_batch(
    tokenizer: Any,
    messages: Sequence[Sequence[dict]],
    reasoning: Sequence[str | None],
    content: Sequence[str | None],
    spec: MaskSpec,
    tools: Tools = None,
    calls: Sequence[Sequence[Mapping[str, Any]]] | None = None,
) -> RenderedBatch:
    """Render prompts and full conversations for a batch through the tokenizer's own chat template (each with its
    conversation's ``tools``; ``calls``: each answer's tool calls)."""
    prompts = [_clean_turns(turns) for turns in messages]
    fulls = [
        [*turns, {"role": "assistant", "content": answer or "", "reasoning_content": thought}]
        for turns, thought, answer in zip(prompts, reasoning, content, strict=True)
    ]
    for full, answer_calls in zip(fulls, calls or [], strict=False):
        if answer_calls:
            full[-1]["tool_calls"] = specforge_calls(list(answer_calls))
    errors: list[str | None] = [None] * len(prompts)
    if not prompts:
        return RenderedBatch([], [], [])
    kwargs = {"enable_thinking": spec.enable_thinking}
    prompt_texts = _render_each(tokenizer, prompts, errors, tools, add_generation_prompt=True, **kwargs)
    full_texts = _render_each(tokenizer, fulls, errors, tools, add_generation_prompt=False, **kwargs)
    if spec.enable_thinking:
        opener = spec.think_opener
        rules = spec.rules
        if not isinstance(rules, GeneratedTurnTrainer):
            raise ValueError(f"render_batch renders a generated turn; trainer {spec.trainer} masks spans")
        if rules.think_in_prompt:
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
    input_ids: (
        list[list[int]] | None
    )  # full conversation ids (span trainers: cut at max_length), keep_ids=True
    loss_masks: list[np.ndarray] | None = None  # span trainers: the trainer's mask of each sample, as is

    def __len__(self) -> int:
        return len(self.mismatch)

    def loss_mask(self, index: int) -> np.ndarray:
        """1 on supervised tokens of sample ``index``, 0 elsewhere (int8, one per input id)."""
        if self.loss_masks is not None:
            return self.loss_masks[index]
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


def render_conversations(
    tokenizer: Any, conversations: Sequence[Sequence[dict]], rules: SpanTrainer, tools: Tools = None
) -> tuple[list[str], list[str | None]]:
    """Whole conversations rendered as a span trainer renders them (its message clean-up, no generation prompt,
    each conversation's ``tools`` passed to the template as SpecForge passes a row's ``tools``).

    A conversation the trainer cuts short is rendered as cut, and its error says so (``cut: ...``).
    """
    prepared = [span_trainer_messages(conversation, rules) for conversation in conversations]
    messages = [turns for turns, _ in prepared]
    errors: list[str | None] = [f"cut: {note}" if note else None for _, note in prepared]
    if not messages:
        return [], errors
    texts = _render_each(
        tokenizer, messages, errors, tools, add_generation_prompt=False, enable_thinking=rules.render_thinking
    )
    return texts, errors


def _span_batch(
    tokenizer: Any,
    conversations: Sequence[Sequence[dict]],
    spec: MaskSpec,
    rules: SpanTrainer,
    keep_ids: bool,
    tools: Tools = None,
) -> MaskBatch:
    texts, errors = render_conversations(tokenizer, conversations, rules, tools)
    max_length = spec.max_length if spec.max_length is not None else 1 << 62
    result = span_masks(
        tokenizer,
        texts,
        errors,
        rules,
        max_length,
        flag_boundaries=spec.enable_thinking,
        last_only=spec.last_turn_only,
    )
    size = len(texts)
    n_prompt = np.zeros(size, dtype=np.int64)
    mask_end = np.zeros(size, dtype=np.int64)
    mask_sum = np.zeros(size, dtype=np.int64)
    for i, mask in enumerate(result.loss_masks):
        supervised = np.flatnonzero(mask)
        if supervised.size:
            n_prompt[i], mask_end[i], mask_sum[i] = supervised[0], supervised[-1] + 1, supervised.size
    return MaskBatch(
        n_tokens=result.n_tokens,
        n_prompt=n_prompt,
        mask_sum=mask_sum,
        mask_end=mask_end,
        mismatch=result.problems,
        input_ids=result.input_ids if keep_ids else None,
        loss_masks=result.loss_masks,
    )


def build_conversation_masks(
    tokenizer: Any,
    conversations: Sequence[Sequence[Any]],
    spec: MaskSpec | None = None,
    *,
    keep_ids: bool = False,
    tools: Tools = None,
) -> MaskBatch:
    """Masks for whole conversations ending with the generated answer (``tools``: each conversation's schemas).

    A turn is a mapping {role, content, reasoning_content, ...} or an object with those attributes (an assembled
    turn of draftgen.training.conversation). Span trainers supervise every assistant turn their rules match; the generated-turn conventions only the last
    turn (the earlier ones are its prompt).
    """
    spec = spec or MaskSpec()
    rules = spec.rules
    conversations = [[turn_dict(turn) for turn in conversation] for conversation in conversations]
    if isinstance(rules, SpanTrainer):
        return _span_batch(tokenizer, conversations, spec, rules, keep_ids, tools)
    for number, conversation in enumerate(conversations):
        if not conversation or conversation[-1].get("role") != "assistant":
            raise ValueError(f"conversation {number} does not end with the generated assistant turn")
    rendered = render_batch(
        tokenizer,
        [list(conversation[:-1]) for conversation in conversations],
        [conversation[-1].get("reasoning_content") for conversation in conversations],
        [conversation[-1].get("content") for conversation in conversations],
        spec,
        tools,
        [conversation[-1].get("tool_calls") or () for conversation in conversations],
    )
    return compute_masks(tokenizer, rendered, spec, keep_ids=keep_ids)


def build_masks(
    tokenizer: Any,
    messages: Sequence[Sequence[dict]],
    reasoning: Sequence[str | None],
    content: Sequence[str | None],
    spec: MaskSpec | None = None,
    *,
    keep_ids: bool = False,
) -> MaskBatch:
    """Render and tokenize one batch of single-answer samples: prompt turns + the generated answer."""
    spec = spec or MaskSpec()
    if isinstance(spec.rules, SpanTrainer):
        conversations = [
            generated_turn_conversation(turns, thought, answer)
            for turns, thought, answer in zip(messages, reasoning, content, strict=True)
        ]
        return _span_batch(tokenizer, conversations, spec, spec.rules, keep_ids)
    rendered = render_batch(tokenizer, messages, reasoning, content, spec)
    return compute_masks(tokenizer, rendered, spec, keep_ids=keep_ids)
