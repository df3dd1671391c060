"""The sampling plan: which answers a run generates for each prompt, and how each is sampled.

A parameter of generate (which runs it), the benchmark (which measures each arm) and the estimate (which prices
it), declared once here (``SamplingPlan``), so one params file sets it for all three.

A plan is a list of arms. Each arm takes a share of the prompts (``share``, decided per prompt id by a keyed
hash, so every node of a sharded run, every resume and every rerun agrees) and gives each prompt it takes
``answers`` samples, sampled with the run's settings overridden by the arm's own. An empty plan is today's run:
one answer per prompt with the run's settings, stored under the prompt's id.

With a plan, every (prompt, arm, answer) is a sample of its own, stored exactly once as its own row, under the
id ``{prompt id}#s{k}`` (k counts the prompt's samples from 0, arms in plan order, answers within an arm) with
``prompt_id``, ``arm`` and ``sample`` columns; generate's work, retries, hedging and resume all key on that id,
so each sample keeps the guarantees a prompt has (docs/generate.md, "The sampling plan").
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field

from draftgen.params import Params, SamplingParams, param
from draftgen.prompts.rows import PromptRow

PLAN_KEY = b"draftgen-sampling-plan"  # keys the hash: independent of the shards and the held-out split
SAMPLE_SEP = "#s"
_NAME = r"^[A-Za-z0-9_.-]+$"
_SAMPLE_ID = re.compile(r"^(?P<prompt>.*)#s(?P<k>\d+)$")
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "enable_thinking")


class Arm(Params):
    """One arm of the plan: its name, which prompts it takes, how many answers each, and its sampling (unset
    fields: the run's own value)."""

    name: str = Field(min_length=1, max_length=40, pattern=_NAME)
    share: Annotated[float, Field(gt=0, le=1)] = 1.0  # of the prompts, by a keyed hash of the id
    answers: Annotated[int, Field(ge=1, le=64)] = 1  # samples per prompt the arm takes
    enable_thinking: bool | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None


def check_plan(arms: list[Arm]) -> list[Arm]:
    names = [arm.name for arm in arms]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"arm names must be distinct: {', '.join(repeated)} appear more than once")
    return arms


SamplingPlan = Annotated[
    list[Arm],
    param(
        default_factory=list,
        help="arms, each {name, share, answers, and any of enable_thinking temperature top_p top_k min_p "
        "max_tokens}: which prompts get how many answers sampled how ([]: one answer each, the settings above)",
    ),
    AfterValidator(check_plan),
]


@dataclass(frozen=True)
class Sample:
    """One planned answer of one prompt."""

    id: str  # the stored row's id: the prompt id (no plan) or ``{prompt id}#s{k}``
    prompt_id: str
    arm: str | None  # None: no plan
    index: int  # k: the sample's place among its prompt's samples


def takes(prompt_id: str, arm: Arm) -> bool:
    """Whether ``arm`` takes this prompt: a keyed hash of (arm name, id) below its share."""
    if arm.share >= 1.0:
        return True
    digest = hashlib.blake2b(f"{arm.name}\0{prompt_id}".encode(), digest_size=8, key=PLAN_KEY).digest()
    return int.from_bytes(digest, "little") / 2**64 < arm.share


def samples(prompt_id: str, arms: Sequence[Arm]) -> list[Sample]:
    """The prompt's samples under the plan, in order (one, under the prompt's own id, without a plan)."""
    if not arms:
        return [Sample(prompt_id, prompt_id, None, 0)]
    out: list[Sample] = []
    for arm in arms:
        if takes(prompt_id, arm):
            for _ in range(arm.answers):
                k = len(out)
                out.append(Sample(f"{prompt_id}{SAMPLE_SEP}{k}", prompt_id, arm.name, k))
    return out


def sample_rows(row: PromptRow, arms: Sequence[Arm]) -> list[PromptRow]:
    """The prompt row once per planned sample, each under its sample id with its arm (the row itself, no plan)."""
    if not arms:
        return [row]
    return [
        dataclasses.replace(row, id=s.id, prompt_id=row.id, arm=s.arm, sample=s.index)
        for s in samples(row.id, arms)
    ]


def prompt_of(sample_id: str) -> str:
    """The prompt id a stored id belongs to (itself when it is no sample id, or no string)."""
    if not isinstance(sample_id, str):
        return sample_id
    match = _SAMPLE_ID.match(sample_id)
    return match.group("prompt") if match else sample_id


def sample_seed(sample_id: str) -> int:
    """The ``seed`` a sample's requests carry, so two answers of one prompt in one arm are two draws (a server
    samples them apart anyway at temperature > 0; the simulator and a seeded engine need it said)."""
    digest = hashlib.blake2b(sample_id.encode(), digest_size=4, key=PLAN_KEY).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def arm_sampling(base: SamplingParams, arm: Arm | None) -> SamplingParams:
    """The run's sampling with the arm's own values over it."""
    if arm is None:
        return base
    changes = {name: getattr(arm, name) for name in SAMPLING_FIELDS if getattr(arm, name) is not None}
    return base.model_copy(update=changes) if changes else base


def arm_thinking(parameters: dict) -> dict[str, bool]:
    """Whether each arm of a run thinks, from its manifest's ``parameters`` (no plan: {})."""
    base = parameters.get("enable_thinking", True)
    plan = parameters.get("sampling_plan") or []
    return {a["name"]: base if a.get("enable_thinking") is None else a["enable_thinking"] for a in plan}


def expected_answers(arms: Sequence[Arm]) -> float:
    """Answers per prompt the plan makes on average (1 without a plan)."""
    return sum(arm.share * arm.answers for arm in arms) if arms else 1.0
