"""What speculative-decoding settings cost a simulated GPU: step time, acceptance per draft position, memory.

A profile with a ``SpecCosts`` and a ``MemoryModel`` (b200-mtp) accepts SGLang's flags; with a draft model
(``EAGLE3``, ``STANDALONE``, ``DFLASH`` and ``--speculative-draft-model-path``) the draft part of the step and the
acceptance come from the drafter profile that path names (``draftgen.sim.drafters``). :func:`apply_settings`
turns the flags into the profile the scheduler runs (still ``t0 + t1 · batch`` per step, so the engine is
unchanged), or raises :class:`StartupError` with the message SGLang would print before its port opens. The
formulas and their calibration are in docs/simulator.md ("Speculative settings").

Per decode step with ``b`` running requests, ``s`` steps, top-k ``k`` and ``n`` draft tokens (MTP off:
``s = 0, n = 1``)::

    step = target_base + b · (target_per_req + verify_per_token · n)      # the target model verifies n tokens
         + s · (draft_step + b · k · draft_per_req)                       # s draft forwards of b · k tokens
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace

from draftgen.sglang_rules import adaptive, hybrid_memory, speculation
from draftgen.sim import drafters
from draftgen.sim.profiles import MemoryModel, Profile
from draftgen.sim.spec_costs import SpecCosts

GIB = 1 << 30


class StartupError(Exception):
    """The settings stop the server before it serves: ``lines`` are what it prints; ``after_load`` says the
    check runs once the weights are in memory (load_delay passes first) rather than while parsing flags."""

    def __init__(self, lines: list[str], *, after_load: bool):
        super().__init__(lines[-1])
        self.lines = lines
        self.after_load = after_load


@dataclass(frozen=True)
class SimSettings:
    """The SGLang flags a simulated server takes; None means the flag was not given."""

    speculative_algorithm: str | None = None  # "NEXTN", "EAGLE", "none" (off); None: the profile's own
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    speculative_adaptive: bool = False  # --speculative-adaptive (SGLang 0.5.23): steps chosen at run time
    speculative_draft_model_path: str | None = None  # a drafter: sim:NAME, or a folder with sim_drafter.json

    @property
    def touches_speculation(self) -> bool:
        return self.speculative_adaptive or any(
            v is not None
            for v in (
                self.speculative_algorithm,
                self.speculative_draft_model_path,
                self.speculative_num_steps,
                self.speculative_eagle_topk,
                self.speculative_num_draft_tokens,
                self.mem_fraction_static,
            )
        )


def add_sglang_flags(parser: argparse.ArgumentParser) -> None:
    """SGLang's own flags for the settings the simulator models (docs/simulator.md, "Speculative settings")."""
    parser.add_argument(
        "--speculative-algorithm",
        default=None,
        help="NEXTN or EAGLE (MTP on); EAGLE3, STANDALONE or DFLASH (a draft model); none (off); "
        "default: the profile's",
    )
    parser.add_argument(
        "--speculative-draft-model-path",
        default=None,
        help="the drafter: sim:NAME (mtp, eagle3, dflash, standalone) or a folder holding sim_drafter.json "
        "(docs/simulator.md, 'Drafter profiles')",
    )
    parser.add_argument("--speculative-num-steps", type=int, default=None, help="draft steps per decode step")
    parser.add_argument("--speculative-eagle-topk", type=int, default=None, help="branches per draft step")
    parser.add_argument(
        "--speculative-num-draft-tokens", type=int, default=None, help="tokens verified per request and step"
    )
    parser.add_argument(
        "--max-running-requests", type=int, default=None, help="batch cap (default: SGLang's)"
    )
    parser.add_argument(
        "--mem-fraction-static", type=float, default=None, help="share of GPU memory for weights and caches"
    )
    parser.add_argument(
        "--speculative-adaptive",
        action="store_true",
        help="SGLang 0.5.23's adaptive speculation: draft steps chosen per batch size at run time (top-k 1)",
    )


def sim_settings(args: argparse.Namespace) -> SimSettings:
    return SimSettings(
        speculative_algorithm=args.speculative_algorithm,
        speculative_num_steps=args.speculative_num_steps,
        speculative_eagle_topk=args.speculative_eagle_topk,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        max_running_requests=args.max_running_requests,
        mem_fraction_static=args.mem_fraction_static,
        speculative_adaptive=bool(args.speculative_adaptive),
        speculative_draft_model_path=args.speculative_draft_model_path,
    )


def settings_argv(flags: SimSettings) -> list[str]:
    """The flags back as command-line words (for a fleet or serve starting server processes)."""
    argv: list[str] = []
    for item in fields(flags):
        value = getattr(flags, item.name)
        if isinstance(value, bool):
            argv += ["--" + item.name.replace("_", "-")] if value else []
        elif value is not None:
            argv += [
                "--" + item.name.replace("_", "-"),
                f"{value:g}" if isinstance(value, float) else str(value),
            ]
    return argv


def position_probabilities(costs: SpecCosts, steps: int, topk: int, draft_tokens: int) -> tuple[float, ...]:
    """Conditional acceptance of each draft position of the longest path the tree can verify."""
    depth = min(steps, draft_tokens - 1)
    spare = max(0, draft_tokens - 1 - depth)  # tree nodes beyond one chain: alternates at each depth
    alternates = min(topk - 1, spare / depth) if topk > 1 and depth else 0.0
    probs = []
    for position in range(1, depth + 1):
        p = costs.accept_p * costs.accept_decay ** max(0, position - costs.anchor_steps)
        probs.append(1.0 - (1.0 - p) * (1.0 - costs.alternate_catch) ** alternates)
    return tuple(probs)


def mean_accept_length(probs: tuple[float, ...]) -> float:
    """1 (the bonus token) + Σ over positions of the chance every draft up to it is accepted."""
    total, chain = 1.0, 1.0
    for p in probs:
        chain *= p
        total += chain
    return total


def _fail(message: str, *, after_load: bool) -> StartupError:
    return StartupError([message], after_load=after_load)


def _resolve(profile: Profile, flags: SimSettings) -> tuple[bool, int, int, int]:
    """(speculative, steps, topk, draft tokens) after SGLang's own argument handling (errors raise)."""
    algorithm = flags.speculative_algorithm
    numbers = (flags.speculative_num_steps, flags.speculative_eagle_topk, flags.speculative_num_draft_tokens)
    if algorithm is not None and algorithm.lower() == "none":
        return False, 0, 1, 1
    if algorithm is None:
        if any(v is not None for v in numbers):
            raise _fail(
                "ValueError: --speculative-num-steps/-eagle-topk/-num-draft-tokens need --speculative-algorithm",
                after_load=False,
            )
        if not profile.speculative:
            return False, 0, 1, 1
        return True, profile.spec_steps, profile.spec_topk, profile.draft_tokens
    if algorithm.upper() not in (*speculation.MTP_ALGORITHMS, *speculation.DRAFT_MODEL_ALGORITHMS):
        raise _fail(
            "ValueError: the simulator models --speculative-algorithm NEXTN, EAGLE, EAGLE3, STANDALONE, DFLASH or "
            f"none, not {algorithm!r}",
            after_load=False,
        )
    steps, topk, drafts = numbers
    if algorithm.upper() in speculation.DRAFT_MODEL_ALGORITHMS:
        if flags.speculative_adaptive:
            raise _fail(
                f"ValueError: the simulator models --speculative-adaptive with MTP (NEXTN, EAGLE) only, not "
                f"{algorithm.upper()}",
                after_load=False,
            )
        if not flags.speculative_draft_model_path:
            raise _fail(
                f"ValueError: {speculation.draft_model_required(algorithm.upper())}", after_load=False
            )
        if algorithm.upper() == speculation.DFLASH:  # SGLang overrides steps and top-k to 1
            return True, 1, 1, drafts or speculation.DFLASH_DEFAULT_BLOCK
    if flags.speculative_adaptive and (topk is None or topk == 1):
        return (True, *_resolve_adaptive(steps))
    if steps is None:
        if topk is not None or drafts is not None:
            # SGLang asserts all three are unset before choosing them itself.
            raise _fail(
                "AssertionError: give --speculative-num-steps with --speculative-eagle-topk and "
                "--speculative-num-draft-tokens (or none of the three)",
                after_load=False,
            )
        # what SGLang picks itself, unless the profile was launched with others
        auto = speculation.AUTO_NUMBERS
        steps, topk, drafts = (
            profile.spec_steps or auto.steps,
            profile.spec_topk or auto.topk,
            profile.draft_tokens or auto.draft_tokens,
        )
    if topk is None or drafts is None:
        raise _fail(
            "TypeError: --speculative-eagle-topk and --speculative-num-draft-tokens must be given with "
            "--speculative-num-steps",
            after_load=False,
        )
    if steps < 1 or topk < 1 or drafts < 2:
        raise _fail(
            f"ValueError: speculative settings {steps}/{topk}/{drafts} must be >= 1/1/2", after_load=False
        )
    # SGLang adjusts the draft tokens of a chain (with a warning) rather than refusing them
    drafts = speculation.chain_draft_tokens(steps, topk, drafts)
    if not speculation.tree_holds(steps, topk, drafts):
        raise _fail(
            f"RuntimeError: selected index k out of range (num_draft_tokens {drafts} - 1 > "
            f"{speculation.tree_candidates(steps, topk)} tree candidates)",
            after_load=True,
        )
    return True, steps, topk, drafts


def _adaptive_algorithm(flags: SimSettings) -> bool:
    """Whether SGLang runs adaptive speculation with this algorithm (EAGLE and its alias NEXTN; the simulator
    refuses EAGLE3 with adaptive before asking)."""
    algorithm = flags.speculative_algorithm
    return adaptive.algorithm_reason(algorithm.upper() if algorithm else None) is None


def _resolve_adaptive(steps: int | None) -> tuple[int, int, int]:
    """Adaptive (top-k 1): the steps start at the middle candidate unless given, which must be a candidate;
    SGLang sets the draft tokens to steps + 1 whatever was given."""
    steps = adaptive.start_steps(steps)
    refusal = adaptive.steps_problem(steps)
    if refusal is not None:
        raise _fail(f"ValueError: {refusal}", after_load=False)
    return steps, 1, steps + 1


def startup_warnings(profile: Profile, flags: SimSettings) -> list[str]:
    """What SGLang logs about these flags while accepting them (its adjustments)."""
    lines = []
    speculative, _, topk, drafts = _resolve(profile, flags)
    if (flags.speculative_algorithm or "").upper() == speculation.DFLASH:
        lines += [
            f"WARNING {warning}"
            for warning in speculation.dflash_overrides(
                flags.speculative_num_steps, flags.speculative_eagle_topk
            )
        ]
        if flags.speculative_num_draft_tokens is None:
            lines.append(
                f"WARNING speculative_num_draft_tokens is not set; defaulting to {drafts} for DFLASH."
            )
        if flags.max_running_requests is None:
            lines.append(
                f"WARNING max_running_requests set to {speculation.SPEC_DEFAULT_MAX_RUNNING} for speculative decoding "
                "(--max-running-requests overrides it)"
            )
        return lines
    if flags.speculative_adaptive and not _adaptive_algorithm(flags):
        reason = adaptive.algorithm_reason(flags.speculative_algorithm) or ""
        lines.append(f"WARNING {adaptive.disabled_warning(reason)}")
    elif flags.speculative_adaptive and (reason := adaptive.topk_reason(topk)) is not None:
        lines.append(f"WARNING {adaptive.disabled_warning(reason)}")
    if speculative and topk == 1 and flags.speculative_num_draft_tokens not in (None, drafts):
        lines.append(
            f"WARNING speculative_num_draft_tokens {flags.speculative_num_draft_tokens} adjusted to "
            f"speculative_num_steps + 1 = {drafts} because speculative_eagle_topk == 1"
        )
    if speculative and flags.speculative_algorithm is not None and flags.max_running_requests is None:
        lines.append(
            f"WARNING max_running_requests set to {speculation.SPEC_DEFAULT_MAX_RUNNING} for speculative decoding "
            "(--max-running-requests overrides it)"
        )
    return lines


def apply_settings(profile: Profile, flags: SimSettings) -> Profile:
    """The profile a server started with these flags runs; StartupError when SGLang would not start.

    No flags: the profile unchanged. Only ``--max-running-requests``: the profile with that cap, after the
    memory check (a cap too large for memory fails as SGLang does); everything else as before.
    """
    costs, memory = profile.spec_costs, profile.memory
    if not flags.touches_speculation:
        if not flags.max_running_requests:
            return profile
        if memory is not None:
            fraction = memory.default_mem_fraction(profile.speculative)
            _check_memory(
                memory, profile.speculative, profile.draft_tokens, flags.max_running_requests, fraction
            )
        return profile.with_overrides(max_running_requests=flags.max_running_requests)
    if costs is None or memory is None:
        raise _fail(
            f"ValueError: profile {profile.name} has no speculative cost model; speculative flags and "
            "--mem-fraction-static apply to b200-mtp",
            after_load=False,
        )
    speculative, steps, topk, drafts = _resolve(profile, flags)
    fraction = flags.mem_fraction_static or memory.default_mem_fraction(speculative)
    algorithm = (flags.speculative_algorithm or "").upper()
    drafter = (
        _drafter(algorithm, flags.speculative_draft_model_path)
        if algorithm in speculation.DRAFT_MODEL_ALGORITHMS
        else None
    )
    running = speculation.effective_max_running(flags.max_running_requests, speculative) or 0
    if speculative and drafter is not None:
        probs = drafters.position_probabilities(drafter, steps, topk, drafts)
        draft_base, draft_per_req = drafters.draft_seconds(drafter, steps, topk, drafts)
        verify = (
            costs.verify_per_token_s if drafter.verify_per_token_s is None else drafter.verify_per_token_s
        )
        step_base = costs.target_base_s + draft_base
        per_req = costs.target_per_req_s + verify * drafts + draft_per_req
    elif speculative:
        probs = position_probabilities(costs, steps, topk, drafts)
        step_base = costs.target_base_s + steps * costs.draft_step_s
        per_req = (
            costs.target_per_req_s + costs.verify_per_token_s * drafts + steps * topk * costs.draft_per_req_s
        )
    else:
        probs = ()
        step_base = costs.target_base_s
        per_req = costs.target_per_req_s + costs.verify_per_token_s
    kv_tokens = _check_memory(memory, speculative, drafts, running, fraction)
    if not speculative:
        asked = flags.max_running_requests or hybrid_memory.REQUEST_POOL_FLOOR
        running = min(asked, _state_pool_cap(memory, fraction))  # SGLang caps the batch by the state pool
    adaptive_on = speculative and flags.speculative_adaptive and topk == 1 and _adaptive_algorithm(flags)
    adaptive_steps = steps if adaptive_on else None
    return replace(
        profile,
        adaptive_steps=adaptive_steps,
        step_base_s=step_base,
        step_per_req_s=per_req,
        speculative=speculative,
        accept_mean=mean_accept_length(probs) if speculative else 1.0,
        accept_probs=probs,
        draft_tokens=drafts if speculative else 1,
        spec_steps=steps if speculative else 0,
        spec_topk=topk if speculative else 1,
        max_running_requests=running,
        kv_capacity_tokens=kv_tokens,
        mem_fraction_static=fraction,
        kv_admission=True,
        spec_algorithm=(algorithm if algorithm in speculation.DRAFT_MODEL_ALGORITHMS else speculation.NEXTN)
        if speculative
        else None,
        draft_model_path=flags.speculative_draft_model_path if drafter is not None else None,
        drafter=drafter.name if drafter is not None else ("mtp" if speculative else None),
    )


def _drafter(algorithm: str, path: str | None) -> drafters.DrafterProfile:
    """The drafter profile ``path`` names, for ``algorithm``; SGLang-like start-up errors otherwise."""
    assert path  # _resolve refused a drafter algorithm without one
    try:
        drafter = drafters.load_drafter(path)
    except drafters.DrafterError as exc:
        raise _fail(f"OSError: {exc}", after_load=False) from None
    if algorithm not in drafter.algorithms:
        raise _fail(
            f"ValueError: draft model {path} is a {drafter.name} drafter (for --speculative-algorithm "
            f"{'/'.join(drafter.algorithms)}), not one {algorithm} loads",
            after_load=False,
        )
    return drafter


def kv_budget_gib(
    memory: MemoryModel, speculative: bool, drafts: int, running: int, fraction: float
) -> float:
    """GiB left for the KV cache once weights, recurrent states and speculative intermediates are placed."""
    rest = memory.gpu_memory_gib * fraction - memory.weights_gib
    if speculative:
        # Verify keeps an intermediate recurrent state per draft token of every request, and (radix cache off
        # for this model family under MTP) the state pool holds one slot per running request.
        return rest - memory.state_per_req_gib * running * (drafts + 1)
    # the rest is split between recurrent states and KV, 0.9 : 1
    return rest / (1 + hybrid_memory.STATE_TO_KV_MEMORY_RATIO)


def _state_pool_cap(memory: MemoryModel, fraction: float) -> int:
    """Without MTP: requests the recurrent-state pool can run (SGLang keeps 3 slots per running request)."""
    rest = memory.gpu_memory_gib * fraction - memory.weights_gib
    ratio = hybrid_memory.STATE_TO_KV_MEMORY_RATIO
    states = rest * ratio / (1 + ratio)
    return max(1, int(states / memory.state_per_req_gib) // hybrid_memory.STATE_SLOTS_PER_REQUEST)


def _check_memory(memory: MemoryModel, speculative: bool, drafts: int, running: int, fraction: float) -> int:
    """KV cache tokens, or SGLang's start-up failure when nothing is left for them."""
    kv_tokens = (
        int(kv_budget_gib(memory, speculative, drafts, running, fraction) * GIB) // memory.kv_bytes_per_token
    )
    if kv_tokens <= 0:
        raise _fail(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: self.server_args.mem_fraction_static={fraction}",
            after_load=True,
        )
    return kv_tokens
