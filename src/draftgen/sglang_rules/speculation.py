"""SGLang's speculative-decoding rules: the algorithms, what each needs, and what SGLang changes by itself.

Facts from SGLang 0.5.23's ``speculative/spec_info.py`` (the algorithms), ``arg_groups/speculative_hook.py``
(``_handle_eagle_family``, ``_handle_dflash``, ``_handle_ngram``, ``_auto_choose_speculative_params``) and
``speculative/spec_utils.py`` (the draft tree). ``server_settings`` turns them into refusals before a server
starts; the simulator applies them to the flags a simulated server is given (docs/simulator.md, "Speculative
settings").
"""

from __future__ import annotations

from dataclasses import dataclass

# spec_info.py's SpeculativeAlgorithm, the ones draftgen launches; NEXTN is a reserved alias SGLang resolves to EAGLE.
NEXTN = "NEXTN"
EAGLE = "EAGLE"
EAGLE3 = "EAGLE3"
STANDALONE = "STANDALONE"
DFLASH = "DFLASH"
NGRAM = "NGRAM"
SPECULATIVE_ALGORITHMS = (NEXTN, EAGLE, EAGLE3, STANDALONE, DFLASH, NGRAM)
# The target's own MTP heads (NEXTN) or an EAGLE head: draftgen labels them "MTP s/k/d".
MTP_ALGORITHMS = (NEXTN, EAGLE)
# A separate draft model, loaded from --speculative-draft-model-path: the draft worker reads its model config from
# that path, so without one these cannot start.
DRAFT_MODEL_ALGORITHMS = (EAGLE3, STANDALONE, DFLASH)

# Every handler of speculative_hook.py: "Max running requests is reset to 48 for speculative decoding" when
# --max-running-requests is not given.
SPEC_DEFAULT_MAX_RUNNING = 48

# _handle_eagle_family: "trtllm_mha backend only supports topk = 1 for speculative decoding."
TOPK_ONE_ONLY_BACKENDS = ("trtllm_mha",)

# _handle_dflash: DFLASH runs on these devices only (a CUDA device may carry an index: cuda:0).
DFLASH_DEVICES = ("cuda", "npu", "xpu")
# _handle_dflash: the block size when neither the flags nor the draft model's config give one.
DFLASH_DEFAULT_BLOCK = 16


@dataclass(frozen=True)
class SpecNumbers:
    """``--speculative-num-steps / -eagle-topk / -num-draft-tokens``, written ``steps/topk/draft tokens``."""

    steps: int
    topk: int
    draft_tokens: int

    def __str__(self) -> str:
        return f"{self.steps}/{self.topk}/{self.draft_tokens}"

    def as_list(self) -> list[int]:
        """``[steps, topk, draft tokens]``, as tune's parameters write a candidate."""
        return [self.steps, self.topk, self.draft_tokens]


# _auto_choose_speculative_params: what SGLang picks when none of the three numbers is given, for STANDALONE and
# every architecture outside its lists (Qwen3.5/3.6 among them). draftgen's MTP default is this setting too: the
# seeds measured acceptance 3.6 there (server_settings.MTP_DEFAULT).
AUTO_NUMBERS = SpecNumbers(steps=3, topk=1, draft_tokens=4)


def resolved_algorithm(requested: str) -> str:
    """The algorithm SGLang reports in /server_info once it has resolved its arguments: NEXTN becomes EAGLE (the
    target's own MTP head as EAGLE's draft, spec_info.SpeculativeAlgorithm.from_string); the others as given."""
    return EAGLE if requested.upper() == NEXTN else requested


def default_max_running(speculative: bool) -> int | None:
    """The batch cap SGLang sets when ``--max-running-requests`` is not given: 48 with speculation on; without
    speculation it sizes the cap from memory (None: not a fixed number)."""
    return SPEC_DEFAULT_MAX_RUNNING if speculative else None


def effective_max_running(given: int | None, speculative: bool) -> int | None:
    """The batch cap a server started with ``--max-running-requests given`` (None: not given) runs with."""
    return given or default_max_running(speculative)


def chain_draft_tokens(steps: int, topk: int, draft_tokens: int) -> int:
    """The draft tokens SGLang runs: with top-k 1 (a chain: one draft per step plus the verified token) it sets
    them to steps + 1 whatever was given, with a warning (_handle_eagle_family)."""
    return steps + 1 if topk == 1 else draft_tokens


def tree_candidates(steps: int, topk: int) -> int:
    """Draft tokens the tree offers: top-k at the first step, top-k × top-k at each later one
    (spec_utils.select_top_k_tokens); SGLang verifies the best ``draft_tokens - 1`` of them."""
    return topk + (steps - 1) * topk * topk


def tree_holds(steps: int, topk: int, draft_tokens: int) -> bool:
    """Whether the tree has the ``draft_tokens - 1`` candidates to select (else the first decode step fails)."""
    return draft_tokens - 1 <= tree_candidates(steps, topk)


def draft_model_required(algorithm: str) -> str:
    """SGLang's refusal of a draft-model algorithm started without ``--speculative-draft-model-path``."""
    return f"{algorithm} speculative decoding requires setting --speculative-draft-model-path."


def dflash_runs_on(device: str) -> bool:
    """Whether _handle_dflash accepts ``device`` (else: "... is not supported by SRTPlatform on device ...")."""
    return any(device.startswith(ok) for ok in DFLASH_DEVICES)


def dflash_overrides(steps: int | None, topk: int | None) -> list[str]:
    """SGLang's warnings when DFLASH is given steps or top-k other than 1: it drafts a whole block in one forward,
    so it overrides both to 1 (_handle_dflash)."""
    return [
        f"DFLASH only supports {name} == 1; overriding {name}={value} to 1."
        for name, value in (("speculative_num_steps", steps), ("speculative_eagle_topk", topk))
        if value is not None and value != 1
    ]
