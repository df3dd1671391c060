"""Fault and quirk injection for the simulator: parsed from ``--fault KEY=VALUE`` into a frozen record."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# The SGLang release whose response shapes the server speaks
# (see docs/engines.md#the-sglang-surface-draftgen-relies-on):
#   0.5.4  — no acceptance data in OpenAI responses; meta_info has spec_verify_ct only
#   0.5.9  — meta_info adds spec_accept_length / spec_accept_rate / spec_accept_token_num / ...
#   0.5.23 — OpenAI responses carry sglext.spec_tokens_details on request; meta_info renames some fields
SGLANG_SHAPES = ("0.5.4", "0.5.9", "0.5.23")


def fault(default: object, values: str, effect: str) -> Any:
    """One fault key, declared once: its default, the values it takes and what it does (the table of
    docs/simulator.md "Faults" is rendered from these: draftgen.param_tables)."""
    return field(default=default, metadata={"values": values, "effect": effect})


@dataclass(frozen=True)
class Faults:
    error_rate: float = fault(
        0.0, "0–1", 'that share of chat/generate requests gets HTTP 500 (`{"object":"error",...}`) at arrival'
    )
    overload: int = fault(
        0, "N ≥ 0", "when N requests already wait in the queue, new ones get `overload_status` (0 = off)"
    )
    overload_status: int = fault(429, "429 or 503", "status for `overload`")
    hang_rate: float = fault(
        0.0, "0–1", "that share is accepted and never answered (no tokens); `/health` stays 200"
    )
    wedge_after: int = fault(
        0,
        "N ≥ 0",
        "from the Nth request on the scheduler stops (a stuck collective): every request hangs, `/health` stays 200, "
        "`/health_generate` answers 503 after 20 simulated seconds, as SGLang's does (0 = off)",
    )
    crash_after: str = fault(
        "",
        "`N` or `Ns`",
        "the N-th chat/generate request to arrive makes the process exit (code 70) at once, dropping every open "
        "connection; or the process exits N seconds after warm-up",
    )
    load_delay: float = fault(0.0, "seconds", "before the port opens (connections refused meanwhile)")
    startup_delay: float = fault(
        0.0,
        "seconds",
        "after the port opens, before warm-up: `/health` and `/health_generate` answer 503, requests queue",
    )
    empty_answer_rate: float = fault(
        0.0,
        "0–1",
        "that share answers with the short failure `\\n</think>\\n\\nOK.` + EOS (thinking on; 6 tokens in Qwen3's "
        "vocabulary)",
    )
    loop_rate: float = fault(
        0.0,
        "0–1",
        "that share of prompts (by each request's seed: the same on every server) falls into a repetition loop: one "
        "cycle of filler repeats until `max_tokens`; ground truth records `loop_start` and `loop_period`",
    )
    loop_max_period: int = fault(
        256, "N ≥ 1", "a loop's cycle is drawn log-uniformly between 1 and N tokens (`loop_rate`)"
    )
    abort_rate: float = fault(
        0.0, "0–1", "that share is aborted in the queue: empty text, `finish_reason` `abort`, 0 tokens"
    )
    slow: float = fault(
        1.0, "factor > 0", "multiplies the decode step time (not prefill): 3 is three times slower"
    )
    omit_usage: bool = fault(False, "true/false", "never send `usage` (null in replies, no usage chunk)")
    omit_done: bool = fault(False, "true/false", "end SSE streams without `data: [DONE]`")
    sglang_version: str = fault(
        SGLANG_SHAPES[-1],
        ", ".join(f"`{shape}`" for shape in SGLANG_SHAPES),
        "which release's response shapes to speak",
    )
    tool_call_rate: float = fault(
        1.0,
        "0–1",
        "with `tools` in a request that ends with a user message, that share of prompts is answered with tool calls "
        "(the simulator's rule)",
    )
    tool_divergence_rate: float = fault(
        0.0,
        "0–1",
        "that share of the answers that call changes the rule's first argument",
    )
    noncanonical_ids: float = fault(
        0.0,
        "0–1",
        "that share answers with ids that decode to the text but are not its canonical encoding",
    )

    def crash_after_requests(self) -> int | None:
        value = self.crash_after.strip()
        return int(value) if value and not value.endswith("s") else None

    def crash_after_seconds(self) -> float | None:
        value = self.crash_after.strip()
        return float(value[:-1]) if value.endswith("s") else None


FAULT_KEYS = tuple(f.name for f in fields(Faults))


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _check(key: str, value: object) -> None:
    if (key.endswith("_rate") or key == "noncanonical_ids") and not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
        raise ValueError("must be between 0 and 1")
    if key in ("overload", "wedge_after", "load_delay", "startup_delay") and float(value) < 0:  # type: ignore[arg-type]
        raise ValueError("must be >= 0")
    if key == "loop_max_period" and int(value) < 1:  # type: ignore[call-overload]
        raise ValueError("must be >= 1")
    if key == "slow" and float(value) <= 0:  # type: ignore[arg-type]
        raise ValueError("must be > 0")
    if key == "overload_status" and value not in (429, 503):
        raise ValueError("must be 429 or 503")
    if key == "sglang_version" and value not in SGLANG_SHAPES:
        raise ValueError(f"must be one of {', '.join(SGLANG_SHAPES)}")
    if key == "crash_after" and value:
        text = str(value)
        number = text[:-1] if text.endswith("s") else text
        if float(number) <= 0 or (not text.endswith("s") and not number.isdigit()):
            raise ValueError("must be a positive request count N or seconds Ns")


def parse_faults(specs: list[str] | tuple[str, ...]) -> Faults:
    """Parse ``KEY=VALUE`` strings; any mistake raises ValueError naming the spec and the valid keys."""
    values: dict[str, object] = {}
    types = {f.name: f.type for f in fields(Faults)}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"bad fault spec {spec!r}: expected KEY=VALUE")
        if key not in types:
            raise ValueError(f"unknown fault {key!r}; valid keys: {', '.join(FAULT_KEYS)}")
        kind = types[key]
        try:
            if kind == "bool":
                value: object = _parse_bool(raw)
            elif kind == "int":
                value = int(raw)
            elif kind == "float":
                value = float(raw)
            else:
                value = raw.strip()
            _check(key, value)
        except ValueError as exc:
            raise ValueError(f"bad value for fault {key}={raw!r}: {exc}") from None
        values[key] = value
    return Faults(**values)  # type: ignore[arg-type]


def faults_to_specs(faults: Faults) -> list[str]:
    """The inverse of parse_faults, for passing a Faults record to a server process."""
    default = Faults()
    specs = []
    for key in FAULT_KEYS:
        value = getattr(faults, key)
        if value != getattr(default, key):
            specs.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return specs
