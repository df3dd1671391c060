"""Acceptance that depends on what is asked: the simulator's prompt categories and their acceptance.

A drafter predicts some text better than other text (code and arithmetic repeat the prompt's tokens and follow
rigid forms; free prose does not), so a real server's acceptance differs by the kind of prompt. The simulator
models it with the categories of the bundled synthetic prompts (``draftgen.prompts.synthetic``): each request's
messages are classified by the wording that generator writes, and the category scales every draft position's
conditional acceptance by its factor (capped at 1). A request that matches no category keeps the profile's
acceptance. The expected acceptance length of each request is written to the ground truth (``category``,
``accept_expected``), so breakdowns by category can be tested against it (docs/simulator.md, "Acceptance by
prompt category").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

SYSTEM, MULTI_TURN, LONG, CODE, CHAT, MATH = "system", "multi_turn", "long", "code", "chat", "math"
AGENTIC = "agentic"
_CODE = re.compile(r"\bWrite an? \S+ function\b")
_CHAT = re.compile(r"\bExplain\b")
_MATH = re.compile(r"Solve for x|How many|What is the sum|A rectangle has perimeter")
_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)


def classify(messages: Sequence[Mapping[str, object]], tools: Sequence[object] | None = None) -> str | None:
    """The category of one request's messages (and its ``tools``), in the bundled generator's terms; None for
    anything else.

    The rules follow how ``synthetic.py`` writes each kind: tools offered (an agentic conversation), a system prompt,
    more than one user turn, the notes to summarise, a function to write, something to explain, an arithmetic
    question. (The first turn of a multi-turn row is a chat question on its own and is classified as one.)
    """
    if tools:
        return AGENTIC
    roles = [str(m.get("role")) for m in messages]
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    if not users:
        return None
    if "system" in roles:
        return SYSTEM
    if len(users) > 1:
        return MULTI_TURN
    text = users[0]
    if text.startswith("Summarise the notes below"):
        return LONG
    if _CODE.search(text):
        return CODE
    if _CHAT.search(text):
        return CHAT
    if _MATH.search(text):
        return MATH
    return None


def classify_rendered(text: str) -> str | None:
    """The category of a prompt already rendered by a Qwen3 chat template (``/generate``'s text)."""
    return classify([{"role": role, "content": content} for role, content in _TURN.findall(text)])


def scaled(probs: tuple[float, ...], factor: float) -> tuple[float, ...]:
    """Conditional acceptance per draft position for a category with ``factor`` (1.0: unchanged)."""
    if factor == 1.0:
        return probs
    return tuple(min(1.0, p * factor) for p in probs)


def factor_of(table: tuple[tuple[str, float], ...], category: str | None) -> float:
    return dict(table).get(category, 1.0) if category is not None else 1.0
