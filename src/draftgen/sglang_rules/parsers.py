"""Which of SGLang 0.5.23's output parsers read a model family's answers, and how its tool calls look.

A family's reasoning parser splits ``<think>...</think>`` off into ``reasoning_content``; its tool-call parser turns
the calls the model writes into ``message.tool_calls`` (streamed: ``delta.tool_calls``) with ``finish_reason``
``"tool_calls"``. SGLang starts with no tool-call parser unless ``--tool-call-parser`` names one, and then returns a
call as raw text in ``content`` (``serving_chat.py``: ``_process_tool_calls`` runs only when a parser is set).
The facts, read in the installed wheel: the names (``function_call/parser_names.py``, ``function_call_parser.py``:
``qwen`` and ``qwen25`` are one detector, ``Qwen25Detector``; ``qwen3_coder`` is ``Qwen3CoderDetector``), and the
text each reads (``qwen25_detector.py``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
``qwen3_coder_detector.py``: ``<tool_call>`` ``<function=NAME>`` ``<parameter=KEY>`` VALUE ``</parameter>`` ...
``</function>`` ``</tool_call>``, newlines around each part optional). SGLang's own template detection
(``parser/template_detection.py``) picks ``qwen3_coder`` for a chat template that writes ``<function=`` and
``<parameter=``, which Qwen3.5/3.6's does, and ``qwen`` for Qwen3's.
"""

from __future__ import annotations

QWEN3 = "qwen3"  # model_type of Qwen3 (dense) checkpoints
QWEN3_5 = "qwen3_5"  # model_type of Qwen3.5 / Qwen3.6 checkpoints (Qwen3.6-27B, the target)
FAMILIES = (QWEN3_5, QWEN3)
DEFAULT_FAMILY = QWEN3_5
REASONING_PARSER = {QWEN3: "qwen3", QWEN3_5: "qwen3"}
TOOL_CALL_PARSER = {QWEN3: "qwen", QWEN3_5: "qwen3_coder"}
# The call format each tool-call parser reads: "json" (a JSON object in <tool_call>) or "xml" (<function=...>).
CALL_FORMAT = {"qwen": "json", "qwen25": "json", "qwen3_coder": "xml"}
CALL_START = "<tool_call>"  # what every Qwen call format begins with: in content, a call nobody parsed


def tool_call_parser(family: str) -> str:
    """The ``--tool-call-parser`` for a model family; ValueError naming the known families."""
    try:
        return TOOL_CALL_PARSER[family]
    except KeyError:
        raise ValueError(f"model family {family!r}: choose one of {', '.join(FAMILIES)}") from None


def reasoning_parser(family: str) -> str:
    """The ``--reasoning-parser`` for a model family; ValueError naming the known families."""
    try:
        return REASONING_PARSER[family]
    except KeyError:
        raise ValueError(f"model family {family!r}: choose one of {', '.join(FAMILIES)}") from None
