"""The speculative cost model's parts for one GPU + model: what a step costs and how drafts are accepted.

A profile carries one (``draftgen.sim.profiles``); ``draftgen.sim.speculative`` prices SGLang's flags with it and
``draftgen.sim.adaptive`` the step counts adaptive speculation moves between (docs/simulator.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecCosts:
    """Step-time parts (seconds) and the acceptance model of one GPU + model (see draftgen.sim.speculative)."""

    target_base_s: float  # the target model's forward with one request (weights read once)
    target_per_req_s: (
        float  # per running request, whatever the number of tokens verified (KV, state, sampling)
    )
    verify_per_token_s: float  # per verified token per request (the compute a batch of one never pays)
    draft_step_s: float  # one draft (MTP layer) forward with one request
    draft_per_req_s: float  # per request and top-k branch in one draft forward
    accept_p: float  # conditional acceptance of draft positions 1..anchor_steps
    anchor_steps: int  # the measured setting's steps (3 for 3/1/4)
    accept_decay: float  # each position past anchor_steps keeps this share of the previous one's acceptance
    alternate_catch: float  # share of a position's misses one extra top-k candidate catches
