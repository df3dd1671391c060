"""Drafter profiles: what a draft model (the target's MTP heads, an EAGLE-3 head, a DFlash block drafter, a
smaller model of the family) costs a simulated GPU per decode step, and how often the target accepts its drafts.

A simulated server started with ``--speculative-draft-model-path PATH`` reads which drafter PATH holds (see
:func:`load_drafter`): ``sim:NAME`` names a built-in profile; a folder holds ``sim_drafter.json``; a ``.json`` file
is read itself. The JSON is ``{"profile": NAME}`` plus any field of :class:`DrafterProfile` to override, e.g.
``{"profile": "dflash", "accept_p": [0.95, 0.93]}``, so a user's dry run can rehearse the drafter they trained
with the acceptance they measured offline. The numbers and why are in docs/simulator.md ("Drafter profiles").

Per decode step with ``b`` running requests, ``n`` verified tokens per request (draft tokens), ``s`` draft steps
and top-k ``k``::

    chain drafting (MTP, EAGLE-3, STANDALONE):  draft = s · (draft_step + b · k · draft_per_token)
    block drafting (DFlash):                    draft = draft_step + b · n · draft_per_token   (one forward)
    verify (the target's forward of n tokens per request) = target_base + b · (target_per_req + verify · n)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

from draftgen.sglang_rules import speculation
from draftgen.sglang_rules.speculation import MTP_ALGORITHMS
from draftgen.sim.textgen import acceptance_probability

SIM_PREFIX = "sim:"
DRAFTER_FILE = "sim_drafter.json"


class DrafterError(ValueError):
    """A draft model path the simulator cannot read a drafter profile from (the server does not start)."""


@dataclass(frozen=True)
class DrafterProfile:
    """One draft model on the simulated GPU: its forward's cost and the target's acceptance of its drafts."""

    name: str
    description: str
    algorithms: tuple[str, ...]  # --speculative-algorithm values that load this kind of drafter
    drafting: Literal["chain", "block"]  # one forward per draft step, or one forward for the whole block
    draft_step_s: float  # one draft forward with one request (weights read once)
    draft_per_token_s: float  # per request and drafted token (chain: per top-k branch of a step)
    accept_p: tuple[
        float, ...
    ]  # conditional acceptance of draft positions 1, 2, ... (each if the one before was)
    accept_decay: float  # each position past the list keeps this share of the previous one's acceptance
    alternate_catch: float = 0.3  # tree (top-k > 1): share of a position's misses one extra candidate catches
    verify_per_token_s: float | None = None  # per verified token per request; None: the target's own

    def position_p(self, position: int) -> float:
        """Conditional acceptance of draft position ``position`` (1-based)."""
        listed = len(self.accept_p)
        if position <= listed:
            return self.accept_p[position - 1]
        return self.accept_p[-1] * self.accept_decay ** (position - listed)


# The target's own MTP head (NEXTN): today's b200-mtp numbers (docs/simulator.md, "Speculative settings"):
# p = 0.930 for positions 1-3 (the mean 3.6 measured at 3/1/4), then x 0.95 per position; 0.6 ms per draft forward
# alone, 0.05 ms per request and branch.
MTP = DrafterProfile(
    name="mtp",
    description="Qwen3.6-27B's own MTP layer: acceptance 3.6 at 3/1/4 (the seeds' measurement)",
    algorithms=MTP_ALGORITHMS,
    drafting="chain",
    draft_step_s=0.0006,
    draft_per_token_s=0.00005,
    accept_p=(acceptance_probability(3.6, 4),) * 3,
    accept_decay=0.95,
)
# An EAGLE-3 head trained on the target's regenerated answers: one decoder layer over fused low/mid/high hidden
# states (a little dearer than the MTP layer: 0.7 ms, 0.06 ms), acceptance a shade below MTP's at depth 1-3 but
# holding deeper (training-time test trains the later positions): 0.92 at positions 1-3, then x 0.99.
EAGLE3 = DrafterProfile(
    name="eagle3",
    description="an EAGLE-3 head trained on the target's answers: ~MTP at 3 steps, better at 5-7",
    algorithms=(speculation.EAGLE3,),
    drafting="chain",
    draft_step_s=0.0007,
    draft_per_token_s=0.00006,
    accept_p=(0.92, 0.92, 0.92),
    accept_decay=0.99,
)
# A DFlash block drafter: a few layers that draft a whole block in one forward (1.0 ms alone: ~1.5 B parameters
# and the LM head over the block read once; 0.02 ms per request and block token). High acceptance per step: 0.92
# at position 1, x 0.975 per position (5.3 at block 8, 6.2 at block 16). The verify is the target's of the whole
# block, so at a large batch b x block tokens of verify dominate the step: the drafter that wins alone can lose.
DFLASH = DrafterProfile(
    name="dflash",
    description="a DFlash block drafter: 5.3 tokens per step at block 8, verify of the whole block per request",
    algorithms=(speculation.DFLASH,),
    drafting="block",
    draft_step_s=0.0010,
    draft_per_token_s=0.00002,
    accept_p=(0.92,),
    accept_decay=0.975,
)
# A smaller model of the family as the draft (STANDALONE, e.g. Qwen3-0.6B): 28 layers per draft step (1.5 ms
# alone, 0.1 ms per request and branch), acceptance 0.80 per position, x 0.98 deeper.
STANDALONE = DrafterProfile(
    name="standalone",
    description="a 0.6B model of the family drafting token by token: cheap to train, dear per step",
    algorithms=(speculation.STANDALONE,),
    drafting="chain",
    draft_step_s=0.0015,
    draft_per_token_s=0.0001,
    accept_p=(0.80,),
    accept_decay=0.98,
)
DRAFTERS: dict[str, DrafterProfile] = {d.name: d for d in (MTP, EAGLE3, DFLASH, STANDALONE)}
_FLOATS = ("draft_step_s", "draft_per_token_s", "accept_decay", "alternate_catch", "verify_per_token_s")


def builtin(name: str) -> DrafterProfile:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise DrafterError(f"unknown drafter profile {name!r}; built in: {', '.join(DRAFTERS)}") from None


def from_json(data: object, where: str) -> DrafterProfile:
    """``{"profile": NAME, <field>: value, ...}``: the built-in profile NAME with the fields given replaced."""
    if not isinstance(data, dict) or "profile" not in data:
        raise DrafterError(f'{where}: write {{"profile": NAME, ...}} with NAME one of {", ".join(DRAFTERS)}')
    base = builtin(str(data["profile"]))
    known = {f.name for f in fields(DrafterProfile)} - {"name"}
    unknown = sorted(set(data) - known - {"profile"})
    if unknown:
        raise DrafterError(f"{where}: unknown drafter field(s) {unknown}; known: {sorted(known)}")
    changes: dict[str, object] = {}
    for key, value in data.items():
        if key == "profile":
            continue
        if key == "accept_p":
            probs = tuple(float(p) for p in (value if isinstance(value, list) else [value]))
            if not probs or any(not 0 <= p <= 1 for p in probs):
                raise DrafterError(
                    f"{where}: accept_p must be a non-empty list of probabilities, got {value!r}"
                )
            changes[key] = probs
        elif key == "algorithms":
            changes[key] = tuple(str(a).upper() for a in value)
        elif key in _FLOATS:
            if value is not None and (not isinstance(value, int | float) or value < 0):
                raise DrafterError(f"{where}: {key} must be a number >= 0, got {value!r}")
            changes[key] = None if value is None else float(value)
        else:
            changes[key] = value
    return replace(base, name=f"{base.name} ({where})" if len(data) > 1 else base.name, **changes)


def load_drafter(path: str) -> DrafterProfile:
    """The drafter profile a ``--speculative-draft-model-path`` names (``sim:NAME``, a folder, a JSON file)."""
    if path.startswith(SIM_PREFIX):
        return builtin(path[len(SIM_PREFIX) :])
    file = Path(path)
    if file.is_dir():
        file = file / DRAFTER_FILE
    if not file.is_file():
        raise DrafterError(
            f"draft model {path}: no {DRAFTER_FILE} there, so the simulator does not know which drafter it is. "
            f'Write {{"profile": "dflash"}} (or eagle3, standalone, mtp, with fields to override) to '
            f"{Path(path) / DRAFTER_FILE}, or pass sim:NAME as the path"
        )
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DrafterError(f"draft model {path}: {file} is not readable JSON ({exc})") from None
    return from_json(data, str(file))


def position_probabilities(
    drafter: DrafterProfile, steps: int, topk: int, draft_tokens: int
) -> tuple[float, ...]:
    """Conditional acceptance of each draft position of the longest path one verify can accept.

    Block drafting verifies a chain of ``draft_tokens - 1`` drafts after the bonus token. A chain or tree of
    ``steps`` steps verifies min(steps, draft_tokens - 1) positions; the tree's spare nodes are alternates."""
    if drafter.drafting == "block":
        return tuple(drafter.position_p(i) for i in range(1, draft_tokens))
    depth = min(steps, draft_tokens - 1)
    spare = max(0, draft_tokens - 1 - depth)
    alternates = min(topk - 1, spare / depth) if topk > 1 and depth else 0.0
    return tuple(
        1.0 - (1.0 - drafter.position_p(i)) * (1.0 - drafter.alternate_catch) ** alternates
        for i in range(1, depth + 1)
    )


def draft_seconds(drafter: DrafterProfile, steps: int, topk: int, draft_tokens: int) -> tuple[float, float]:
    """The draft part of a step as (fixed, per running request) seconds."""
    if drafter.drafting == "block":
        return drafter.draft_step_s, drafter.draft_per_token_s * draft_tokens
    return steps * drafter.draft_step_s, steps * topk * drafter.draft_per_token_s
