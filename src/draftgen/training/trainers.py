"""Whose loss mask validate reproduces: the trainers it knows, each a frozen description of how it masks.

Two families:

* **span trainers** (SpecForge 0.2.0's ``ThinkingParser`` with one of its chat-template entries): the whole
  conversation is rendered through the tokenizer's chat template (no generation prompt, thinking on), every
  stretch of text from an assistant header to the next end-of-turn string (inclusive, or to the end of the text)
  is supervised, the ids are cut at ``max_length``, and ignore strings are unmasked again. Token positions are
  those of each boundary's *prefix* tokenized on its own (which is how that trainer finds them).
* **generated-turn conventions** (draftgen's own, before trainers were named): only the generated, final
  assistant turn is supervised, from the end of its generation prompt through its last ``<|im_end|>``; the
  prompt's tokens must be a prefix of the full conversation's. No truncation: ``max_length`` is only a flag.

The facts about SpecForge were read from its released package (``specforge==0.2.0``, ``specforge/data``);
the real-server tier runs that package's own parser as the oracle (tests_real/test_trainer_oracle_real.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise
from typing import Any


class Trainer(StrEnum):
    SPECFORGE_QWEN35 = "specforge-qwen3.5"
    SPECFORGE_QWEN3_THINKING = "specforge-qwen3-thinking"
    SPECFORGE_DFLASH_QWEN35 = "specforge-dflash-qwen3.5"
    SPECFORGE_LFM = "specforge-lfm"
    DRAFTGEN_THINK_IN_PROMPT = "draftgen-think-in-prompt"
    DRAFTGEN_THINK_IN_TARGET = "draftgen-think-in-target"


DEFAULT_TRAINER = Trainer.SPECFORGE_QWEN35
# validate's former parameter `mask_convention`: its values name the generated-turn conventions.
LEGACY_CONVENTIONS: dict[str, Trainer] = {
    "think_in_prompt": Trainer.DRAFTGEN_THINK_IN_PROMPT,
    "think_in_target": Trainer.DRAFTGEN_THINK_IN_TARGET,
}
# Message keys a SpecForge ThinkingParser passes on to the chat template; every other key is dropped.
SPECFORGE_MESSAGE_KEYS = ("role", "content", "tool_calls", "reasoning_content", "name", "tool_call_id")
# The keys SpecForge's GeneralParser (its non-thinking templates) keeps.
SPECFORGE_GENERAL_KEYS = ("role", "content", "tool_calls")


class UnknownTrainerError(ValueError):
    """A trainer name validate does not know: names it and lists the known ones."""


@dataclass(frozen=True)
class SpanTrainer:
    """A trainer that supervises every header ... end-of-turn span of the rendered conversation."""

    assistant_header: str
    end_of_turn: str
    system_prompt: str = ""  # added as the first message when the conversation has no system message
    ignore_strings: tuple[str, ...] = ()  # occurrences are unmasked after the spans are set
    render_thinking: bool = True  # enable_thinking passed to the chat template when rendering
    # What the trainer's data loader keeps of a pre-tokenized row (after its max_length cut): at least this many
    # supervised tokens, and (DFlash) two of them adjacent; anything else it drops without a word.
    min_loss_tokens: int = 1
    needs_consecutive: bool = False
    specforge_template: str = ""  # SpecForge's data.chat_template of this trainer (its parser's entry)
    message_keys: tuple[str, ...] = SPECFORGE_MESSAGE_KEYS  # what the trainer's parser passes to the template

    def accepts(self, loss_mask: Sequence[int]) -> bool:
        """Whether the trainer's loader keeps a row with this (already cut) loss mask."""
        if sum(loss_mask) < self.min_loss_tokens:
            return False
        return not self.needs_consecutive or any(a and b for a, b in pairwise(loss_mask))


@dataclass(frozen=True)
class GeneratedTurnTrainer:
    """draftgen's own convention: only the generated final turn, after its generation prompt."""

    think_in_prompt: bool  # True: the think opener "<think>\n" belongs to the prompt; False: it is supervised


TrainerSpec = SpanTrainer | GeneratedTurnTrainer

TRAINERS: dict[Trainer, TrainerSpec] = {
    # SpecForge 0.2.0 chat template "qwen3.5": ThinkingParser, thinking on, no system prompt of its own.
    Trainer.SPECFORGE_QWEN35: SpanTrainer(
        assistant_header="<|im_start|>assistant\n<think>\n",
        end_of_turn="<|im_end|>\n",
        specforge_template="qwen3.5",
    ),
    # SpecForge 0.2.0 chat template "qwen3-thinking": adds "You are a helpful assistant." when there is no system
    # message, and masks from the bare assistant header (so <think> is supervised).
    Trainer.SPECFORGE_QWEN3_THINKING: SpanTrainer(
        assistant_header="<|im_start|>assistant\n",
        end_of_turn="<|im_end|>\n",
        system_prompt="You are a helpful assistant.",
        specforge_template="qwen3-thinking",
    ),
    # SpecForge 0.2.0's DFlash recipe for Qwen3.6-27B: chat template qwen3.5, max_length 4096, reading pre-tokenized
    # rows (data.prompts_path); its loader drops rows with fewer than 2 supervised tokens or no two adjacent ones.
    Trainer.SPECFORGE_DFLASH_QWEN35: SpanTrainer(
        assistant_header="<|im_start|>assistant\n<think>\n",
        end_of_turn="<|im_end|>\n",
        min_loss_tokens=2,
        needs_consecutive=True,
        specforge_template="qwen3.5",
    ),
    # SpecForge 0.2.0 chat template "lfm": GeneralParser, ChatML, no system prompt of its own (a ChatML model's own
    # template then adds its default one, as it did for the server: SmolLM2's), no thinking. The entry a ChatML
    # model without reasoning trains with (the real-model tier's SmolLM2-135M-Instruct).
    Trainer.SPECFORGE_LFM: SpanTrainer(
        assistant_header="<|im_start|>assistant\n",
        end_of_turn="<|im_end|>\n",
        render_thinking=False,
        message_keys=SPECFORGE_GENERAL_KEYS,
        specforge_template="lfm",
    ),
    Trainer.DRAFTGEN_THINK_IN_PROMPT: GeneratedTurnTrainer(think_in_prompt=True),
    Trainer.DRAFTGEN_THINK_IN_TARGET: GeneratedTurnTrainer(think_in_prompt=False),
}


def trainer_spec(name: str | Trainer) -> TrainerSpec:
    """The mask rules of a trainer by name; legacy ``mask_convention`` values are accepted too."""
    if isinstance(name, str) and name in LEGACY_CONVENTIONS:
        return TRAINERS[LEGACY_CONVENTIONS[name]]
    try:
        return TRAINERS[Trainer(name)]
    except ValueError:
        known = ", ".join(t.value for t in Trainer)
        raise UnknownTrainerError(f"unknown trainer {name!r}: choose one of {known}") from None


def _role(message: Mapping[str, Any]) -> str:
    role = message.get("role") or message.get("from") or ""
    return {"human": "user", "gpt": "assistant"}.get(role, role)


def span_trainer_messages(
    conversation: Sequence[Mapping[str, Any]], spec: SpanTrainer
) -> tuple[list[dict], str | None]:
    """The messages a SpecForge parser (its ThinkingParser or GeneralParser) hands to the chat template, and what it left out (None: nothing).

    Roles ``human``/``gpt`` read as user/assistant, a missing or empty content as ""; a leading system message
    is kept (else the trainer's own system prompt, when it has one, is put first); messages before the first
    user turn are dropped; the conversation is cut where a tool turn follows anything but an assistant or tool
    turn, or an assistant turn follows anything but a user or tool turn; only the trainer's message_keys are kept,
    and keys whose value is None are left out (Arrow fills absent keys with null; templates test for both).
    ``tool_calls`` are cleaned as SpecForge's ``Parser._sanitize_message`` cleans them (``specforge_calls``).
    """

    def clean(message: Mapping[str, Any], role: str) -> dict:
        kept = {k: message.get(k) for k in spec.message_keys[2:] if message.get(k) is not None}
        if "tool_calls" in kept:
            calls = specforge_calls(kept.pop("tool_calls"))
            if calls is not None:
                kept["tool_calls"] = calls
        return {"role": role, "content": message.get("content") or message.get("value") or "", **kept}

    turns = [(message, _role(message)) for message in conversation]
    out: list[dict] = []
    note = None
    if turns and turns[0][1] == "system":
        out.append(
            {"role": "system", "content": turns[0][0].get("content") or turns[0][0].get("value") or ""}
        )
        turns = turns[1:]
    elif spec.system_prompt:
        out.append({"role": "system", "content": spec.system_prompt})
    leading = 0
    while leading < len(turns) and turns[leading][1] != "user":
        leading += 1
    if leading:
        note = f"the trainer drops {leading} message(s) before the first user turn"
    allowed_before = {"tool": ("assistant", "tool"), "assistant": ("user", "tool")}
    previous = None
    for position, (message, role) in enumerate(turns[leading:], start=leading):
        if previous is not None and role in allowed_before and previous not in allowed_before[role]:
            dropped = len(turns) - position
            note = f"the trainer cuts the conversation at a {role} turn after a {previous} turn ({dropped} dropped)"
            break
        out.append(clean(message, role))
        previous = role
    return out, note


def specforge_calls(value: Any) -> list[dict] | None:
    """Tool calls as SpecForge 0.2.0's ``Parser._sanitize_message`` hands them to the chat template: a JSON string is
    parsed (not JSON: the calls are dropped); each call keeps ``id`` ("" when absent), ``type`` ("function" when
    absent) and ``function`` {``name`` ("" when absent), ``arguments``: a JSON string parsed to its value, {} when it is
    not JSON}; non-object calls are skipped."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, list):
        return value
    out = []
    for call in value:
        if not isinstance(call, Mapping):
            continue
        clean: dict[str, Any] = {"id": call.get("id", ""), "type": call.get("type", "function")}
        function = call.get("function", {})
        if isinstance(function, Mapping):
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    arguments = {}
            clean["function"] = {"name": function.get("name", ""), "arguments": arguments}
        out.append(clean)
    return out


def turn_dict(turn: Any) -> dict:
    """A turn as a message dict: a mapping as is, or an assembled turn object (role, content, reasoning_content)."""
    if isinstance(turn, Mapping):
        return dict(turn)
    fields = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")
    return {name: getattr(turn, name) for name in fields if getattr(turn, name, None) not in (None, ())}


def generated_turn_conversation(
    messages: Sequence[Mapping[str, Any]], reasoning: str | None, content: str | None
) -> list[dict]:
    """Prompt turns (None-valued keys left out) plus the generated assistant turn: what validate exports."""
    turns = [{k: v for k, v in turn.items() if v is not None} for turn in messages]
    turns.append({"role": "assistant", "content": content or "", "reasoning_content": reasoning or ""})
    return turns
