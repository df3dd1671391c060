"""The tune notebook's validated, frozen configuration, and the candidates it expands to.

The search space is the product of the speculative settings (MTP off, each ``[steps, topk, draft tokens]`` of
``speculative_algorithm``, SGLang 0.5.23's adaptive speculation from each of ``adaptive_steps``, and each NGRAM
draft-token count, and each trained drafter's settings in ``drafters``: EAGLE3, STANDALONE or DFLASH with its draft
model) with the ``max_running_requests`` values; each candidate is measured at ``concurrency`` requests in flight,
or at its own batch cap when ``concurrency`` is 0. A candidate SGLang would refuse, or would silently run as another
one, is refused here with the reason, before any server starts.

The verdict (``verdict_levels``; docs/tune.md "The verdict") measures MTP (``verdict_baseline``) and every drafter
setting at each of those concurrencies on the prompts given (the held-out split), and prices the full prompt set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from draftgen.params import (
    ApiKeyEnv,
    Bootstrap,
    GpuHourUsd,
    Interval,
    NotebookCell,
    Params,
    PositiveFloat,
    PositiveInt,
    ProjectPath,
    RequestTimeout,
    SamplingParams,
    WarmupRequests,
    _unset_if_empty,
    param,
)
from draftgen.prompts.rows import SYNTHETIC, check_prompt_source, prompt_source_path
from draftgen.rundir.layout import SETTINGS
from draftgen.serve.config import ServerParams
from draftgen.server_settings import (
    MTP_DEFAULT,
    SPECULATION_OFF,
    ServerSettings,
    batch_cap,
    sglang_problems,
)
from draftgen.sglang_rules.speculation import (
    AUTO_NUMBERS,
    DFLASH,
    DRAFT_MODEL_ALGORITHMS,
    MTP_ALGORITHMS,
    NEXTN,
    NGRAM,
    SPEC_DEFAULT_MAX_RUNNING,
    STANDALONE,
)

MIN_JOB_REQUESTS = 8


class DrafterSpace(Params):
    """One trained (or separate) draft model and the settings to try it with."""

    speculative_algorithm: Literal[DRAFT_MODEL_ALGORITHMS]
    speculative_draft_model_path: str = Field(
        min_length=1
    )  # the drafter's folder (sim: sim:NAME or sim_drafter.json)
    spec_candidates: list[list[int]] = Field(
        default_factory=list
    )  # EAGLE3 / STANDALONE: [steps, topk, draft tokens] each
    # DFLASH: block sizes (its --speculative-num-draft-tokens)
    block_sizes: list[Annotated[int, Field(ge=2)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _numbers(self) -> DrafterSpace:
        name = f"drafter {self.speculative_algorithm} {self.speculative_draft_model_path}"
        if self.speculative_algorithm == DFLASH:
            if self.spec_candidates:
                raise ValueError(
                    f"{name}: DFLASH takes block_sizes, not spec_candidates (SGLang: DFLASH only supports "
                    "speculative_num_steps == 1 and speculative_eagle_topk == 1)"
                )
            if not self.block_sizes:
                raise ValueError(f"{name}: give block_sizes, e.g. [8, 16]")
        else:
            if self.block_sizes:
                raise ValueError(
                    f"{name}: block_sizes are DFLASH's; give spec_candidates [steps, topk, draft tokens]"
                )
            if not self.spec_candidates:
                raise ValueError(f"{name}: give spec_candidates, e.g. [[3, 1, 4], [5, 1, 6]]")
            for i, triple in enumerate(self.spec_candidates):
                if len(triple) != 3 or any(v < 1 for v in triple):
                    raise ValueError(
                        f"{name}: spec_candidates[{i}] {triple}: write [steps, topk, draft tokens]"
                    )
        return self

    def settings(self) -> list[ServerSettings]:
        algorithm, path = self.speculative_algorithm, self.speculative_draft_model_path
        if algorithm == DFLASH:
            return [
                ServerSettings(
                    speculative_algorithm=algorithm,
                    speculative_draft_model_path=path,
                    speculative_num_draft_tokens=b,
                )
                for b in self.block_sizes
            ]
        return [chain_settings(algorithm, triple, path) for triple in self.spec_candidates]


def chain_settings(
    algorithm: str, triple: list[int], draft_model_path: str = "", *, adaptive: bool = False
) -> ServerSettings:
    """[steps, topk, draft tokens] of ``algorithm`` as SGLang's flags ("" path: none, as NEXTN needs)."""
    steps, topk, drafts = triple
    return ServerSettings(
        speculative_algorithm=algorithm,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=drafts,
        speculative_draft_model_path=draft_model_path or None,
        speculative_adaptive=adaptive,
    )


@dataclass(frozen=True)
class Candidate:
    index: int
    settings: ServerSettings
    concurrency: int  # requests kept in flight while measuring it

    @property
    def label(self) -> str:
        return self.settings.label

    @property
    def slug(self) -> str:
        s = self.settings
        numbers = f"{s.speculative_num_steps}-{s.speculative_eagle_topk}-{s.speculative_num_draft_tokens}"
        if not s.speculative:
            spec = "nomtp"
        elif s.speculative_algorithm == NGRAM:
            spec = f"ngram{s.speculative_num_draft_tokens}"
        elif s.speculative_algorithm == DFLASH:
            spec = f"dflash{s.speculative_num_draft_tokens}"
        elif s.speculative_adaptive:
            spec = f"adapt{numbers}"
        elif s.speculative_algorithm in MTP_ALGORITHMS:
            spec = f"mtp{numbers}"
        else:
            spec = f"{str(s.speculative_algorithm).lower()}{numbers}"
        return f"c{self.index:02d}-{spec}-mrr{s.max_running_requests or 'default'}"


class TuneConfig(ServerParams, SamplingParams):
    parameters_cell = NotebookCell(
        (
            "where candidates run",
            "engine model model_family gpus tp base_port host python extra_args sim_profile sim_speed startup_timeout_s",
        ),
        ("what SGLang allows", "attention_backend spec_v2"),
        (
            "the search space",
            "mtp_off speculative_algorithm spec_candidates speculative_draft_model_path adaptive_steps "
            "ngram_draft_tokens drafters max_running_requests mem_fraction_static concurrency race",
        ),
        (
            "the verdict: MTP against each drafter, on the held-out prompts",
            "verdict_levels verdict_baseline verdict_concurrency dataset_size fleet_gpus gpu_hour_usd",
        ),
        (
            "prompts and sampling (production settings)",
            "prompts sample_size max_tokens temperature top_p top_k min_p enable_thinking api_key_env "
            "request_timeout_s",
        ),
        (
            "successive halving",
            "rounds_per_job equal_time eta max_rounds warmup_requests baseline interval bootstrap seed out_dir "
            "settings_file",
        ),
        help={
            "warmup_requests": "short requests per server before each job's measurement (not measured)",
            "gpus": "GPU indices; one candidate per group of tp GPUs at a time",
        },
    )

    attention_backend: str = param(
        "", 'as you launch SGLang ("": its default); trtllm_mha allows top-k 1 only'
    )
    spec_v2: bool = param(False, "SGLANG_ENABLE_SPEC_V2 set: top-k 1 only")
    mtp_off: bool = param(True, "include speculative decoding off")
    speculative_algorithm: Literal[(*MTP_ALGORITHMS, STANDALONE)] = param(
        NEXTN, "of spec_candidates: NEXTN (MTP), EAGLE, or STANDALONE (a smaller model as the draft)"
    )
    spec_candidates: list[list[int]] = param(
        default_factory=lambda: [[1, 1, 2], [2, 1, 3], [3, 1, 4], [4, 1, 5], [5, 1, 6]],
        help="[steps, topk, draft tokens] each",
    )
    speculative_draft_model_path: str = param(
        "",
        'the draft model for STANDALONE (or an EAGLE head) ("": none, as NEXTN needs)',
        doc="STANDALONE's draft model (a smaller model of the same family; an EAGLE head for EAGLE); NEXTN needs none",
    )
    adaptive_steps: list[Annotated[int, Field(ge=1)]] = param(
        default_factory=list,
        help="--speculative-adaptive candidates (SGLang 0.5.23; top-k 1): the steps each starts from",
        doc="SGLang 0.5.23's adaptive speculation (--speculative-adaptive, top-k 1, draft tokens steps + 1): one "
        "candidate per start value of --speculative-num-steps (params/tune.yaml: [3])",
    )
    ngram_draft_tokens: list[Annotated[int, Field(ge=2)]] = param(
        default_factory=list,
        help="NGRAM candidates (drafts from the text so far, no draft model): draft tokens each",
        doc="NGRAM candidates, one per --speculative-num-draft-tokens (drafts come from the text so far: no draft "
        "model, no steps or top-k of its own)",
    )
    drafters: list[DrafterSpace] = param(
        default_factory=list,
        help="trained drafters: {speculative_algorithm: DFLASH|EAGLE3|STANDALONE, speculative_draft_model_path, "
        "block_sizes (DFLASH) or spec_candidates}",
    )
    max_running_requests: list[PositiveInt] = param(
        default_factory=lambda: [48, 96, 128],
        help="batch caps, each combined with every setting above",
        min_length=1,
    )
    mem_fraction_static: float | None = param(
        None, "--mem-fraction-static for every candidate (0: SGLang's default)"
    )
    concurrency: Annotated[int, Field(ge=0)] = param(
        0, "requests in flight while measuring (0: each candidate's own max_running_requests)"
    )
    race: bool = param(True, "run the successive-halving race (off: the verdict only)")
    verdict_levels: list[PositiveInt] = param(
        default_factory=list,
        help="the verdict's concurrencies, e.g. [1, 8, 32, 64] ([]: no verdict); use the held-out prompts",
    )
    verdict_baseline: list[int] = param(
        default_factory=AUTO_NUMBERS.as_list,
        help="MTP's [steps, topk, draft tokens] the drafters are judged against ([]: speculation off, for a "
        "target without MTP heads)",
    )
    verdict_concurrency: Annotated[int, Field(ge=0)] = param(
        0,
        "the production concurrency, one of verdict_levels, where the verdict names its winner (0: the largest)",
    )
    dataset_size: PositiveInt = param(1_000_000, "prompts in the full set the verdict prices")
    fleet_gpus: Annotated[int, Field(ge=0)] = param(
        0, "GPUs of the fleet the verdict prices (0: those of gpus)"
    )
    gpu_hour_usd: GpuHourUsd
    prompts: str = param(SYNTHETIC, 'a .jsonl/.parquet sample of YOUR prompts, or "synthetic"')
    sample_size: PositiveInt = param(512, "prompts sampled once; each job sends a slice")
    rounds_per_job: PositiveFloat = param(3.0, "a job sends ceil(this x concurrency) requests (at least 8)")
    equal_time: bool = param(
        True,
        "a round's jobs measure as long as its first to send all its requests, not longer",
        doc="on: a round's jobs stop sending once they have measured as long as the round's first job to send all "
        "its requests (each keeps at least concurrency finished requests); off: every job sends all its requests",
    )
    eta: Annotated[int, Field(ge=2)] = param(2, "each round keeps the best 1/eta")
    max_rounds: PositiveInt = param(3, "rounds of halving at most")
    warmup_requests: WarmupRequests
    baseline: bool = param(
        True,
        f"also measure the seeds' {MTP_DEFAULT.speculative_algorithm} {AUTO_NUMBERS} (cap {SPEC_DEFAULT_MAX_RUNNING}) "
        "at the chosen candidate's concurrency",
        doc=f"also run the seeds' {MTP_DEFAULT.speculative_algorithm} {AUTO_NUMBERS} (cap {SPEC_DEFAULT_MAX_RUNNING}) "
        "beside the last round, at each finalist's concurrency, for the gain over the seeds",
    )
    interval: Interval
    bootstrap: Bootstrap
    seed: int = param(0, "which prompts are sampled")
    api_key_env: ApiKeyEnv
    request_timeout_s: RequestTimeout
    out_dir: ProjectPath = param(
        "outputs/tune/interactive", "results go here (draftgen run sets its run folder)"
    )
    settings_file: ProjectPath = param("", 'where the chosen settings go ("": out_dir/settings.yaml)')

    _unset = field_validator("mem_fraction_static", mode="before")(_unset_if_empty)

    @field_validator("prompts")
    @classmethod
    def _prompt_file(cls, path: str) -> str:
        return check_prompt_source(path, allow_empty=True)

    @field_validator("spec_candidates")
    @classmethod
    def _triples(cls, triples: list[list[int]]) -> list[list[int]]:
        for i, triple in enumerate(triples):
            if len(triple) != 3 or any(v < 1 for v in triple):
                raise ValueError(
                    f"spec_candidates[{i}] {triple}: write [steps, topk, draft tokens], each >= 1"
                )
        return triples

    @model_validator(mode="after")
    def _check_space(self) -> TuneConfig:
        if self.race and (
            not self.spec_candidates
            and not self.mtp_off
            and not self.adaptive_steps
            and not self.ngram_draft_tokens
            and not self.drafters
        ):
            raise ValueError(
                "the search space is empty: give spec_candidates, adaptive_steps, ngram_draft_tokens or drafters, "
                "or set mtp_off"
            )
        if not self.race and not self.verdict_levels:
            raise ValueError("race is off and verdict_levels is empty: nothing to measure")
        if self.verdict_levels and not self.drafters:
            raise ValueError("verdict_levels given without drafters: the verdict judges drafters against MTP")
        if (
            self.verdict_concurrency
            and self.verdict_levels
            and (self.verdict_concurrency not in self.verdict_levels)
        ):
            raise ValueError(
                f"verdict_concurrency {self.verdict_concurrency} is not one of verdict_levels "
                f"{self.verdict_levels}: the verdict measures the production concurrency, it does not extrapolate"
            )
        refused = []
        if self.engine == "sim":
            if (
                self.spec_candidates or self.adaptive_steps
            ) and self.speculative_algorithm not in MTP_ALGORITHMS:
                refused.append(
                    f"speculative_algorithm {self.speculative_algorithm}: the simulator models NEXTN and EAGLE "
                    "only (engine sglang runs it)"
                )
            if self.ngram_draft_tokens:
                refused.append(
                    "ngram_draft_tokens: the simulator does not model NGRAM (engine sglang runs it)"
                )
            refused += _sim_drafter_problems(self.drafters)
        named = [
            *self._space(),
            (f"verdict_baseline {self.verdict_baseline}", self.verdict_baseline_settings()),
        ]
        for name, settings in named:
            for reason in sglang_problems(
                settings,
                attention_backend=self.attention_backend or None,
                spec_v2=self.spec_v2,
                extra_args=self.extra_args,
            ):
                refused.append(f"{name}: {reason}")
        if refused:
            raise ValueError("candidates SGLang would not run as given:\n    " + "\n    ".join(refused))
        return self

    @property
    def prompt_path(self) -> Path:
        return prompt_source_path(self.prompts)

    @property
    def settings_path(self) -> Path:
        return Path(self.settings_file) if self.settings_file else Path(self.out_dir) / SETTINGS

    def _space(self) -> list[tuple[str, ServerSettings]]:
        """The race's speculative settings but off, each named by the parameter that gives it: spec_candidates,
        adaptive_steps (SGLang resolves them to top-k 1 and steps + 1 draft tokens), ngram_draft_tokens, drafters."""
        algorithm, path = self.speculative_algorithm, self.speculative_draft_model_path
        named = [
            (f"spec_candidates[{i}] {triple}", chain_settings(algorithm, triple, path))
            for i, triple in enumerate(self.spec_candidates)
        ]
        named += [
            (
                f"adaptive_steps[{i}] {steps}",
                chain_settings(algorithm, [steps, 1, steps + 1], path, adaptive=True),
            )
            for i, steps in enumerate(self.adaptive_steps)
        ]
        named += [
            (
                f"ngram_draft_tokens[{i}] {drafts}",
                ServerSettings(speculative_algorithm=NGRAM, speculative_num_draft_tokens=drafts),
            )
            for i, drafts in enumerate(self.ngram_draft_tokens)
        ]
        return named + [
            (f"drafters[{i}] {settings.label.split(',')[0]}", settings)
            for i, drafter in enumerate(self.drafters)
            for settings in drafter.settings()
        ]

    def verdict_baseline_settings(self) -> ServerSettings:
        if not self.verdict_baseline:
            return SPECULATION_OFF
        if len(self.verdict_baseline) != 3:
            return ServerSettings(speculative_num_steps=None)  # refused by sglang_problems: numbers missing
        steps, topk, drafts = self.verdict_baseline
        return ServerSettings(
            speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=drafts
        )

    @property
    def production_concurrency(self) -> int:
        return self.verdict_concurrency or max(self.verdict_levels, default=0)

    def verdict_candidates(self) -> list[Candidate]:
        """MTP first, then every drafter setting, each capped at the largest level (index 1000 + i)."""
        cap = max(self.verdict_levels)
        specs = [self.verdict_baseline_settings()] + [s for d in self.drafters for s in d.settings()]
        return [
            Candidate(
                1000 + i,
                spec.model_copy(
                    update={"max_running_requests": cap, "mem_fraction_static": self.mem_fraction_static}
                ),
                cap,
            )
            for i, spec in enumerate(specs)
        ]

    def candidates(self) -> list[Candidate]:
        specs = [SPECULATION_OFF] if self.mtp_off else []
        out = []
        for spec in specs + [settings for _, settings in self._space()]:
            for cap in self.max_running_requests:
                settings = spec.model_copy(
                    update={"max_running_requests": cap, "mem_fraction_static": self.mem_fraction_static}
                )
                out.append(Candidate(len(out), settings, self.concurrency or cap))
        return out

    def baseline_candidate(self, concurrency: int) -> Candidate:
        seeds = MTP_DEFAULT  # NEXTN 3/1/4 with SGLang's cap (48)
        assert batch_cap(seeds) is not None
        return Candidate(-1, seeds, concurrency)

    def job_requests(self, concurrency: int) -> int:
        return max(MIN_JOB_REQUESTS, math.ceil(self.rounds_per_job * concurrency))


def _sim_drafter_problems(drafters: list[DrafterSpace]) -> list[str]:
    """engine sim: the drafter profile each draft model path names must load (as the server would at start)."""
    from draftgen.sim.drafters import DrafterError, load_drafter

    problems = []
    for i, drafter in enumerate(drafters):
        try:
            profile = load_drafter(drafter.speculative_draft_model_path)
        except DrafterError as exc:
            problems.append(f"drafters[{i}]: {exc}")
            continue
        if drafter.speculative_algorithm not in profile.algorithms:
            problems.append(
                f"drafters[{i}]: {drafter.speculative_draft_model_path} is a {profile.name} drafter (for "
                f"{'/'.join(profile.algorithms)}), not one {drafter.speculative_algorithm} loads"
            )
    return problems
