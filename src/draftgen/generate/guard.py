"""The garbage guard: a sliding window over recent results that halts the run when they look like garbage.

The user's last run wrote 87% empty answers for days. Here every result is classified as it arrives (empty
answer, empty reasoning when thinking is on, truncated, ended as a repetition loop, failed); when the share of one defect in the last
``window`` results passes its threshold, the run halts with a report naming example ids and texts.

A cut is judged by its cause. "truncated" is a turn cut by ``max_tokens``: the budget the user chose ran out, and
raising it would help. A turn cut where the trainer's ``max_length`` left it less room than ``max_tokens``
(``draftgen.generate.length_cap``) is cut by design — it trains as generated, and a long conversation's later turns
are mostly such cuts — so it is counted apart (``cut_at_max_length``) and never enters the window: it says nothing
about whether the answers are garbage, and halting on it would tell the user to fix the wrong thing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from draftgen.client.loops import REPETITION_LOOP
from draftgen.generate.events import StopRun
from draftgen.generate.length_cap import BY_MAX_LENGTH, BY_MAX_TOKENS

DEFECTS = ("empty_answer", "empty_reasoning", "truncated", "repetition_loop", "failed")
CUT_AT_MAX_LENGTH = "cut_at_max_length"  # expected: counted, never a defect (module docstring)


@dataclass(frozen=True)
class GuardSettings:
    window: int = 200
    min_results: int = 100
    max_rates: dict[str, float] = field(
        default_factory=lambda: {
            "empty_answer": 0.05,
            "empty_reasoning": 0.05,
            "truncated": 0.5,
            "repetition_loop": 0.1,
            "failed": 0.2,
        }
    )
    thinking: bool = True


@dataclass(frozen=True)
class Example:
    id: str
    server: str | None
    finish_reason: str | None
    reasoning: str
    answer: str
    error: str | None = None


def _snippet(text: str | None, limit: int = 160) -> str:
    text = (text or "").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify(
    *,
    thinking: bool,
    content: str | None,
    reasoning: str | None,
    finish_reason: str | None,
    failed: bool,
    budget_by: str = BY_MAX_TOKENS,
    calls: int = 0,
) -> tuple[str, ...]:
    """The defects of one result (an empty tuple for a good one); ``(CUT_AT_MAX_LENGTH,)`` for a turn cut where
    the trainer's max_length set its budget (``budget_by``), which is expected, not a defect; ``calls``: the tool
    calls it made (an answer that is only calls is not empty)."""
    if failed:
        return ("failed",)
    if finish_reason == "length" and budget_by == BY_MAX_LENGTH:
        return (CUT_AT_MAX_LENGTH,)
    if (
        finish_reason == REPETITION_LOOP
    ):  # cut at its first repetition: an empty answer or reasoning is the loop's
        return (REPETITION_LOOP,)
    defects = []
    truncated = finish_reason == "length"
    if truncated:
        defects.append("truncated")  # an empty answer is expected when thinking ran out of tokens
    elif not (content or "").strip() and not calls:
        defects.append("empty_answer")
    if thinking and not (reasoning or "").strip():
        defects.append("empty_reasoning")
    return tuple(defects)


class GuardTripped(StopRun):
    """The guard halted the run; ``report`` holds the numbers and examples."""

    def __init__(self, report: GuardReport):
        self.report = report
        super().__init__(report.text())


@dataclass
class GuardReport:
    defect: str
    rate: float
    threshold: float
    window: int
    seen: int
    rates: dict[str, float]
    examples: list[Example]

    def text(self) -> str:
        shown = "cut by max_tokens" if self.defect == "truncated" else self.defect.replace("_", " ")
        lines = [
            f"garbage guard: {self.rate:.0%} of the last {self.window} results are {shown} "
            f"(threshold {self.threshold:.0%}, after {self.seen} results); the run was halted, finished work saved.",
            "rates in the window: "
            + ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in self.rates.items()),
            "examples:",
        ]
        for example in self.examples:
            if example.error:
                lines.append(f"  {example.id} @ {example.server}: {example.error}")
            else:
                lines.append(
                    f"  {example.id} @ {example.server} finish={example.finish_reason} "
                    f"reasoning={_snippet(example.reasoning)!r} answer={_snippet(example.answer)!r}"
                )
        lines.append(_ADVICE.get(self.defect, ""))
        return "\n".join(line for line in lines if line)


_ADVICE = {
    "empty_answer": "Check the server's chat template and --reasoning-parser (qwen3), and that enable_thinking "
    "reaches it (chat_template_kwargs). Fix the server, then start a new run (new out_dir).",
    "empty_reasoning": "With enable_thinking=True every answer should carry reasoning_content: check that the "
    "server runs with --reasoning-parser qwen3 and the template honours enable_thinking.",
    "truncated": "These turns were cut by max_tokens with their whole budget (the trainer's max_length left them "
    "more room): the answers are longer than max_tokens allows. Raise max_tokens (up to train_max_length), check the "
    "sampling if the answers ramble, or raise max_truncated_rate if long answers are expected for this prompt set. "
    "(Turns cut where train_max_length left less room are expected and never counted here.)",
    "repetition_loop": "Many answers fall into repetition loops: check the sampling (Qwen3 thinking wants "
    "temperature 0.6, top_p 0.95, top_k 20; greedy or low-temperature decoding loops) and that the server applies "
    "it; raise max_loop_rate if this prompt set is known to loop.",
    "failed": "Most prompts fail after every attempt: see failed.parquet for the errors (context length? auth? "
    "a crashing server?).",
}


class Guard:
    """Feed every result to ``observe``; it raises GuardTripped when a defect rate passes its threshold."""

    def __init__(self, settings: GuardSettings, examples: int = 5):
        self.settings = settings
        self._window: deque[tuple[str, ...]] = deque(maxlen=settings.window)
        self._counts = dict.fromkeys(DEFECTS, 0)
        self._examples: dict[str, deque[Example]] = {d: deque(maxlen=examples) for d in DEFECTS}
        self.seen = 0
        self.totals = dict.fromkeys(DEFECTS, 0)
        self.cut_at_max_length = 0  # expected cuts, outside the window (module docstring)

    def rates(self) -> dict[str, float]:
        size = len(self._window)
        return {d: (self._counts[d] / size if size else 0.0) for d in DEFECTS}

    def observe(
        self,
        *,
        id: str,
        server: str | None,
        content: str | None = None,
        reasoning: str | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
        thinking: bool | None = None,
        budget_by: str = BY_MAX_TOKENS,
        calls: int = 0,
    ) -> tuple[str, ...]:
        """One result's defects, counted in the window; ``thinking``: whether that request was asked to think
        (a sampling plan's arms differ; None: the run's setting); ``budget_by``: which limit set its max_tokens."""
        defects = classify(
            thinking=self.settings.thinking if thinking is None else thinking,
            content=content,
            reasoning=reasoning,
            finish_reason=finish_reason,
            failed=error is not None,
            budget_by=budget_by,
            calls=calls,
        )
        self.seen += 1
        if defects == (CUT_AT_MAX_LENGTH,):
            self.cut_at_max_length += 1
            return defects
        if len(self._window) == self._window.maxlen:
            for old in self._window[0]:
                self._counts[old] -= 1
        self._window.append(defects)
        for defect in defects:
            self._counts[defect] += 1
            self.totals[defect] += 1
            self._examples[defect].append(
                Example(id, server, finish_reason, reasoning or "", content or "", error)
            )
        if defects:
            self._check()
        return defects

    def _check(self) -> None:
        size = len(self._window)
        if size < self.settings.min_results:
            return
        for defect in DEFECTS:
            threshold = self.settings.max_rates.get(defect, 1.0)
            rate = self._counts[defect] / size
            if rate > threshold:
                raise GuardTripped(
                    GuardReport(
                        defect=defect,
                        rate=rate,
                        threshold=threshold,
                        window=size,
                        seen=self.seen,
                        rates=self.rates(),
                        examples=list(self._examples[defect]),
                    )
                )
