"""Does a tokenizer's chat template render conversations the way the trainer expects? Checked where it is first used.

A trainer finds what to supervise by its own markers in the rendered conversation (SpecForge's ``qwen3.5`` entry:
from ``<|im_start|>assistant\\n<think>\\n`` through ``<|im_end|>\\n``). The served model's template decides what the
server sends as the generation prompt and therefore what its token ids hold. When the two disagree — Qwen3's own
template opens the answer with a bare ``<|im_start|>assistant\\n`` and leaves ``<think>`` to the model, where Qwen3.5's
puts ``<think>\\n`` in the prompt — every row fails validate, days after the GPUs were paid for. Rendering one small
conversation both ways finds that before a request is sent (generate's preflight) and before a shard is read
(validate).
"""

from __future__ import annotations

from typing import Any

from draftgen.training.trainers import SpanTrainer, TrainerSpec

PROBE_QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
PROBE_ANSWER = {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}


def _shown(text: str, width: int = 60) -> str:
    tail = text[-width:]
    return repr(("…" if len(text) > width else "") + tail)


def template_problem(
    tokenizer: Any, trainer: TrainerSpec, trainer_name: str, enable_thinking: bool
) -> str | None:
    """Why ``tokenizer``'s chat template does not fit ``trainer`` (None: it fits).

    Two renderings of a probe conversation: the generation prompt the server sends with thinking as the run asks
    for it, and the whole conversation as the trainer renders it. A span trainer's assistant header must appear in
    both: in the conversation, or nothing is supervised; in the generation prompt, or the server's ids (the rows
    validate builds) hold another prompt than the one the trainer's spans begin after."""
    if not isinstance(trainer, SpanTrainer):
        return None  # draftgen's own conventions mask from the generation prompt itself, whatever it is
    try:
        prompt = tokenizer.apply_chat_template(
            PROBE_QUESTION, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )
        full = tokenizer.apply_chat_template(
            [*PROBE_QUESTION, PROBE_ANSWER], tokenize=False, enable_thinking=trainer.render_thinking
        )
    except Exception as exc:  # the template's own error: it cannot render a plain two-turn chat
        return f"its chat template cannot render a plain question and answer ({type(exc).__name__}: {exc})"
    header = trainer.assistant_header
    if header not in full:
        return (
            f"the trainer ({trainer_name}) supervises from {header!r}, which this tokenizer's chat template never "
            f"renders (an answer renders as {_shown(full)}): nothing would be supervised"
        )
    if header not in prompt:
        return (
            f"a different generation prompt: the trainer ({trainer_name}) expects the answer to start after "
            f"{header!r}, this tokenizer's chat template asks for it after {_shown(prompt)} — the server's token ids "
            "would not hold the trainer's header. Give the served model's own tokenizer folder, or the trainer whose "
            "chat template this model uses"
        )
    return None
