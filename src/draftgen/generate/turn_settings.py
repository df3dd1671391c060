"""What each turn is sent with: its arm's sampling and seed, and its max_tokens under the trainer's max_length.

A turn's max_tokens is decided once (``draftgen.generate.length_cap``), so its retries and hedged copies send the
same; a turn that could train nothing, or less than the run's floor, is set aside instead. The dispatcher asks here
before it sends, and after an answer notes (once per session) a server that counted a prompt otherwise than the
tokenizer did.
"""

from __future__ import annotations

from draftgen.client.records import ChatResult
from draftgen.generate.config import GenerateConfig
from draftgen.generate.length_cap import BY_MAX_TOKENS, LengthCap, TurnLimit
from draftgen.generate.work import Work
from draftgen.params import SamplingParams
from draftgen.sampling_plan import arm_sampling, sample_seed


class TurnSettings:
    """Each arm's sampling (no plan: the run's) and, with a ``length_cap``, each turn's max_tokens."""

    def __init__(self, config: GenerateConfig, length_cap: LengthCap | None = None):
        self.length_cap = length_cap  # None: every turn is sent with its arm's max_tokens
        self._sampling = {None: config.sampling} | {
            arm.name: arm_sampling(config.sampling, arm) for arm in config.sampling_plan
        }
        self._count_differs_noted = False

    @property
    def longest_max_tokens(self) -> int:
        """The largest max_tokens an arm sends (the hang deadline allows for it)."""
        return max(s.max_tokens for s in self._sampling.values())

    def sampling(self, work: Work) -> SamplingParams:
        return self._sampling[work.conversation.prompt.arm]

    @staticmethod
    def seed(work: Work) -> int | None:
        """A sample of a sampling plan's arm carries its own seed (draftgen.sampling_plan); None without a plan."""
        prompt = work.conversation.prompt
        return sample_seed(prompt.id) if prompt.arm is not None else None

    def limit(self, work: Work) -> TurnLimit | None:
        """The turn's limit, min(max_tokens, max_length − prompt tokens), decided on its first send and kept on
        ``work``; a limit with ``set_aside_by`` says the turn is not sent at all (None: no length cap)."""
        if self.length_cap is None or work.limit is not None:
            return work.limit
        conversation, sampling = work.conversation, self.sampling(work)
        limit = self.length_cap.limit(
            conversation.request(), sampling.max_tokens, sampling.enable_thinking, conversation.tools
        )
        if limit.set_aside_by is None:
            work.limit = limit
        return limit

    def set_aside_reason(self, limit: TurnLimit) -> str:
        assert self.length_cap is not None
        return limit.reason(self.length_cap.max_length)

    def sent(self, work: Work) -> tuple[int, str]:
        """The max_tokens the turn was sent with, and which limit set it (its limit's, or its arm's max_tokens)."""
        if work.limit is not None:
            return work.limit.max_tokens, work.limit.budget_by
        return self.sampling(work).max_tokens, BY_MAX_TOKENS

    def count_differs(self, work: Work, result: ChatResult) -> str | None:
        """The note for the first turn whose prompt the server counted otherwise than the tokenizer did (once)."""
        limit = work.limit
        if limit is None or limit.prompt_tokens is None or result.prompt_tokens is None:
            return None
        if self._count_differs_noted or result.prompt_tokens == limit.prompt_tokens:
            return None
        self._count_differs_noted = True
        return (
            f"{work.conversation.label()}: the server counted {result.prompt_tokens:,} prompt tokens, the "
            f"tokenizer {limit.prompt_tokens:,}: is tokenizer the served model's? (max_tokens is capped on "
            "the tokenizer's count)"
        )
