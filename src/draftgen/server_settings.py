"""SGLang server settings that decide tokens per second per GPU, as one validated record and a YAML file.

The settings are the speculative-decoding flags (``--speculative-algorithm / -num-steps / -eagle-topk /
-num-draft-tokens``, and ``--speculative-draft-model-path`` for a separate draft model), ``--max-running-requests``
and ``--mem-fraction-static``. ``draftgen tune`` measures
candidates of them and writes the winner with :func:`save_settings`; ``draftgen serve --settings FILE`` launches
it; benchmark and estimate record the file they were given.

:func:`sglang_problems` states, before anything starts, what SGLang's server-argument checks would do with a
candidate (facts read from SGLang 0.5.9 ``server_args.py``, see docs/simulator.md): ``NEXTN`` is an alias of
``EAGLE``; with top-k 1 a draft-token count other than steps + 1 is silently changed to steps + 1 (so a
measurement of it would measure another candidate); top-k > 1 is refused with the ``trtllm_mha`` attention
backend and with the overlap scheduler of spec v2; and the tree keeps the best ``num_draft_tokens - 1`` of its
``topk + (steps - 1) * topk**2`` candidates, so more draft tokens than that cannot run. Two more algorithms
(facts from SGLang 0.5.23's ``arg_groups/speculative_hook.py``, run for real by the SGLang tier): ``STANDALONE``
runs the EAGLE worker with an ordinary smaller model of the family as the draft (``--speculative-draft-model-path``,
required), with EAGLE's rules; ``NGRAM`` drafts from the text so far, needs no draft model and takes only
``--speculative-num-draft-tokens`` (SGLang sets top-k from ``--speculative-ngram-max-bfs-breadth`` and the steps
from draft tokens // top-k, so values given for those would not be what runs).

``speculative_adaptive`` is SGLang 0.5.23's ``--speculative-adaptive`` (facts from its
``speculative/adaptive_spec_params.py`` and ``arg_groups/speculative_hook.py``): the draft steps move at run time
between the candidates of a per-batch-size table, starting from ``--speculative-num-steps``, which must be one of
them (else SGLang refuses to start); the draft tokens are set to steps + 1. With top-k other than 1, attention
data parallelism, multi-layer EAGLE, two-batch overlap or PD multiplexing SGLang switches it off with a warning
and runs static speculation (another candidate than asked); with HiSparse or LoRA it refuses to start.

Trained drafters (facts from SGLang 0.5.23's ``arg_groups/speculative_hook.py`` and ``speculative/spec_info.py``):
``EAGLE3`` runs the EAGLE worker with an EAGLE-3 head (``--speculative-draft-model-path``; the draft worker reads
its model config from that path, so without one it cannot start), with EAGLE's steps/top-k/draft-token rules and
adaptive allowed. ``DFLASH`` (block drafting) needs ``--speculative-draft-model-path`` (SGLang: "DFLASH
speculative decoding requires setting --speculative-draft-model-path."), has one natural number, the block size
(verify window; ``--speculative-num-draft-tokens``, alias ``--speculative-dflash-block-size``), and overrides
steps and top-k other than 1 to 1 with a warning; it runs on CUDA, NPU and XPU only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

SPECULATIVE_ALGORITHMS = ("NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "NGRAM")
MTP_ALGORITHMS = ("NEXTN", "EAGLE")  # the target's own MTP heads or an EAGLE head: labelled "MTP s/k/d"
# trained or separate drafters: need --speculative-draft-model-path
DRAFT_MODEL_ALGORITHMS = ("EAGLE3", "STANDALONE", "DFLASH")
ADAPTIVE_ALGORITHMS = (
    "NEXTN",
    "EAGLE",
    "EAGLE3",
)  # SGLang: "only EAGLE/EAGLE3 are supported" (NEXTN = EAGLE)
NGRAM = "NGRAM"
DFLASH = "DFLASH"
DFLASH_DEVICES = ("cuda", "npu", "xpu")  # SGLang 0.5.23 refuses DFLASH on any other device
SPEC_DEFAULT_MAX_RUNNING = 48  # SGLang resets max_running_requests to 48 with EAGLE/NEXTN unless given
TOPK_ONE_ONLY_BACKENDS = ("trtllm_mha",)
# SGLang 0.5.23's default adaptive table (no --speculative-adaptive-config): every slot's candidate steps
ADAPTIVE_CANDIDATE_STEPS = (0, 1, 3, 5, 7)
# SGLang 0.5.23 switches adaptive off for these (warning "speculative_adaptive disabled: REASON. Falling back to
# static speculative params."): the flag, and the reason it gives
ADAPTIVE_DISABLED_BY = {
    "--enable-dp-attention": "attention DP is not supported (adaptive tier decisions are not synchronized across "
    "DP ranks)",
    "--enable-multi-layer-eagle": "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not "
    "implement adaptive)",
    "--enable-two-batch-overlap": "enable_two_batch_overlap=True is not supported (adaptive state swap would discard "
    "the TboAttnBackend wrapper)",
    "--enable-pdmux": "enable_pdmux=True is not supported (adaptive state swap does not update "
    "decode_attn_backend_group)",
}
# ... and refuses to start with these
ADAPTIVE_REFUSED_BY = {
    "--enable-hisparse": "HiSparse speculative decoding uses statically sized swap state; --speculative-adaptive "
    "is not supported.",
    "--enable-lora": "LoRA does not support --speculative-adaptive: the draft is built from a static ServerArgs "
    "snapshot, and the runtime-state swap does not rebuild LoRA cuda-graph metadata",
}
SETTINGS_KEY = "settings"


class ServerSettings(BaseModel):
    """One candidate: MTP off (``speculative_algorithm`` None) or on with its numbers (NGRAM: draft tokens only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    speculative_algorithm: Literal["NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "NGRAM"] | None = (
        "NEXTN"
    )
    speculative_num_steps: Annotated[int, Field(ge=1)] | None = 3
    speculative_eagle_topk: Annotated[int, Field(ge=1)] | None = 1
    speculative_num_draft_tokens: Annotated[int, Field(ge=2)] | None = 4
    speculative_draft_model_path: str | None = None  # EAGLE3/STANDALONE/DFLASH's draft model (None: none)
    max_running_requests: Annotated[int, Field(ge=1)] | None = None  # None: SGLang's default
    mem_fraction_static: Annotated[float, Field(gt=0, lt=1)] | None = None  # None: SGLang's default
    # --speculative-adaptive (SGLang 0.5.23): the steps move at run time; speculative_num_steps is where they start
    speculative_adaptive: bool = False

    @model_validator(mode="before")
    @classmethod
    def _ngram_takes_draft_tokens_only(cls, data: Any) -> Any:
        """NGRAM or DFLASH without steps or top-k given means none (SGLang sets them), not the MTP defaults 3
        and 1."""
        if isinstance(data, dict) and data.get("speculative_algorithm") in (NGRAM, DFLASH):
            data = {"speculative_num_steps": None, "speculative_eagle_topk": None, **data}
        if isinstance(data, dict) and data.get("speculative_algorithm") == DFLASH:
            data = {"speculative_num_draft_tokens": None, **data}  # the block size: given, or refused
        return data

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def label(self) -> str:
        """``MTP 3/1/4, 48 running``, ``MTP adaptive from 3/1/4, ...``, ``EAGLE3 3/1/4, ...``,
        ``DFLASH block 16, ...``, ``NGRAM 4 drafts, ...`` or ``MTP off, 128 running`` (steps/topk/draft tokens)."""
        numbers = (
            f"{self.speculative_num_steps}/{self.speculative_eagle_topk}/{self.speculative_num_draft_tokens}"
        )
        if not self.speculative:
            spec = "MTP off"
        elif self.speculative_algorithm == NGRAM:
            spec = f"NGRAM {self.speculative_num_draft_tokens} drafts"
        elif self.speculative_algorithm == DFLASH:
            spec = f"DFLASH block {self.speculative_num_draft_tokens}"
        elif self.speculative_adaptive:
            who = "MTP" if self.speculative_algorithm in MTP_ALGORITHMS else self.speculative_algorithm
            spec = f"{who} adaptive from {numbers}"
        elif self.speculative_algorithm in MTP_ALGORITHMS:
            spec = f"MTP {numbers}"
        else:
            spec = f"{self.speculative_algorithm} {numbers}"
        running = f"{self.max_running_requests} running" if self.max_running_requests else "default running"
        mem = f", mem {self.mem_fraction_static:g}" if self.mem_fraction_static else ""
        return f"{spec}, {running}{mem}"

    def sglang_args(self) -> list[str]:
        """The flags ``python -m sglang.launch_server`` takes for these settings (MTP off: no speculative flag).

        Each speculative number is written only when set (NGRAM has no steps or top-k of its own)."""
        args: list[str] = []
        if self.speculative:
            args += ["--speculative-algorithm", str(self.speculative_algorithm)]
            for flag, value in (
                ("--speculative-num-steps", self.speculative_num_steps),
                ("--speculative-eagle-topk", self.speculative_eagle_topk),
                ("--speculative-num-draft-tokens", self.speculative_num_draft_tokens),
                ("--speculative-draft-model-path", self.speculative_draft_model_path),
            ):
                if value is not None:
                    args += [flag, str(value)]
            if self.speculative_adaptive:
                args.append("--speculative-adaptive")
        if self.max_running_requests is not None:
            args += ["--max-running-requests", str(self.max_running_requests)]
        if self.mem_fraction_static is not None:
            args += ["--mem-fraction-static", f"{self.mem_fraction_static:g}"]
        return args

    @property
    def drafter(self) -> bool:
        """A separate draft model (EAGLE3, STANDALONE, DFLASH) rather than the target's MTP heads or n-grams."""
        return self.speculative_algorithm in DRAFT_MODEL_ALGORITHMS

    @property
    def simulated(self) -> bool:
        """Whether ``draftgen sim`` models these settings: all but NGRAM (a drafter through its drafter profile,
        docs/simulator.md "Drafter profiles")."""
        return self.speculative_algorithm != NGRAM

    def sim_args(self) -> list[str]:
        """The same flags for a simulated server, where MTP off must be said (its default profile has MTP on)."""
        if not self.simulated:
            raise ValueError(
                f"the simulator models MTP (NEXTN, EAGLE), drafters (EAGLE3, STANDALONE, DFLASH) or speculation "
                f"off, not {self.speculative_algorithm}: run these settings on real SGLang"
            )
        if self.speculative:
            return self.sglang_args()
        return ["--speculative-algorithm", "none", *self.sglang_args()]


def _flag_given(extra_args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in extra_args)


def adaptive_problems(settings: ServerSettings, extra_args: Sequence[str] = ()) -> list[str]:
    """Why SGLang 0.5.23 would refuse ``--speculative-adaptive`` here, or switch it off (quoting its reason)."""
    if not settings.speculative_adaptive:
        return []
    if not settings.speculative:
        return [
            "SGLang: speculative_adaptive disabled: speculative_algorithm=None (only EAGLE/EAGLE3 are supported); "
            "adaptive needs speculative_algorithm NEXTN or EAGLE"
        ]
    off = "SGLang: speculative_adaptive disabled: {}. Falling back to static speculative params"
    problems = []
    if settings.speculative_algorithm not in ADAPTIVE_ALGORITHMS:
        problems.append(
            off.format(
                f"speculative_algorithm={settings.speculative_algorithm} (only EAGLE/EAGLE3 are supported)"
            )
        )
    steps, topk = settings.speculative_num_steps, settings.speculative_eagle_topk
    if topk is not None and topk != 1:
        problems.append(off.format(f"speculative_eagle_topk={topk} (only topk=1 is supported)"))
    if steps is not None and steps not in ADAPTIVE_CANDIDATE_STEPS:
        problems.append(
            f"SGLang: --speculative-num-steps={steps} is not in the adaptive config candidate_steps "
            f"{list(ADAPTIVE_CANDIDATE_STEPS)}. Pass one of those values."
        )
    for flag, reason in ADAPTIVE_DISABLED_BY.items():
        if _flag_given(extra_args, flag):
            problems.append(f"{flag}: " + off.format(reason))
    if any(_flag_given(extra_args, flag) for flag in ("--attn-dp-size",)):
        sizes = [extra_args[i + 1] for i, a in enumerate(extra_args[:-1]) if a == "--attn-dp-size"]
        if any(size != "1" for size in sizes):
            problems.append("--attn-dp-size: " + off.format(ADAPTIVE_DISABLED_BY["--enable-dp-attention"]))
    for flag, reason in ADAPTIVE_REFUSED_BY.items():
        if _flag_given(extra_args, flag) or (
            flag == "--enable-lora" and _flag_given(extra_args, "--lora-paths")
        ):
            problems.append(f"{flag}: SGLang refuses to start: {reason}")
    return problems


# Speculation off: no algorithm and none of its numbers (SGLang refuses numbers without an algorithm).
SPECULATION_OFF = ServerSettings(
    speculative_algorithm=None,
    speculative_num_steps=None,
    speculative_eagle_topk=None,
    speculative_num_draft_tokens=None,
)


def sglang_problems(
    settings: ServerSettings,
    *,
    attention_backend: str | None = None,
    spec_v2: bool = False,
    extra_args: Sequence[str] = (),
    device: str | None = None,
) -> list[str]:
    """Why SGLang would refuse these settings, or run something else than asked; empty when it runs them.

    ``device`` ("cuda", "cpu", ...; None: not known) adds SGLang's device checks (DFLASH runs on CUDA/NPU/XPU)."""
    adaptive = adaptive_problems(settings, extra_args)
    if not settings.speculative:
        return adaptive
    algorithm = settings.speculative_algorithm
    if algorithm == NGRAM:
        return adaptive + _ngram_problems(settings)
    if algorithm == DFLASH:
        return adaptive + _dflash_problems(settings, device)
    if algorithm in DRAFT_MODEL_ALGORITHMS and not settings.speculative_draft_model_path:
        return [
            *adaptive,
            f"{algorithm} needs speculative_draft_model_path (the draft model SGLang loads beside the target; "
            "its draft worker reads the model config from that path, so without one it cannot start)",
        ]
    steps, topk, drafts = (
        settings.speculative_num_steps,
        settings.speculative_eagle_topk,
        settings.speculative_num_draft_tokens,
    )
    missing = [
        name
        for name, value in (
            ("speculative_num_steps", steps),
            ("speculative_eagle_topk", topk),
            ("speculative_num_draft_tokens", drafts),
        )
        if value is None
    ]
    if missing:
        return [
            f"{', '.join(missing)} must be set with speculative_algorithm {settings.speculative_algorithm}"
        ]
    assert steps is not None and topk is not None and drafts is not None
    problems = adaptive
    if topk == 1 and drafts != steps + 1:
        problems.append(
            f"with eagle_topk 1 SGLang changes num_draft_tokens {drafts} to num_steps + 1 = {steps + 1} "
            "(a chain has one draft per step plus the verified token), so this candidate would not be measured"
        )
    if topk > 1:
        if attention_backend in TOPK_ONE_ONLY_BACKENDS:
            problems.append(
                f"eagle_topk {topk} > 1: SGLang's {attention_backend} attention backend only supports topk = 1"
            )
        if spec_v2:
            problems.append(f"eagle_topk {topk} > 1: spec v2 (SGLANG_ENABLE_SPEC_V2) only supports topk = 1")
        candidates = topk + (steps - 1) * topk * topk  # first step topk, each later step topk x topk
        if drafts - 1 > candidates:
            problems.append(
                f"num_draft_tokens {drafts}: the draft tree of {steps} steps x top-{topk} holds only {candidates} "
                f"candidates + the verified token; SGLang's tree selection would fail at the first decode step"
            )
    return problems


def _ngram_problems(settings: ServerSettings) -> list[str]:
    problems = []
    given = [
        name
        for name, value in (
            ("speculative_num_steps", settings.speculative_num_steps),
            ("speculative_eagle_topk", settings.speculative_eagle_topk),
        )
        if value is not None
    ]
    if given:
        problems.append(
            f"NGRAM takes only speculative_num_draft_tokens: SGLang sets eagle_topk from "
            f"--speculative-ngram-max-bfs-breadth and num_steps from draft tokens // topk, so {', '.join(given)} "
            "would not be what runs (leave them null)"
        )
    if settings.speculative_num_draft_tokens is None:
        problems.append("NGRAM needs speculative_num_draft_tokens (tokens verified per request and step)")
    if settings.speculative_draft_model_path:
        problems.append("NGRAM drafts from the text so far: it loads no speculative_draft_model_path")
    return problems


def _dflash_problems(settings: ServerSettings, device: str | None) -> list[str]:
    """SGLang 0.5.23's ``_handle_dflash`` checks, quoted: it refuses or overrides, so the candidate is refused."""
    problems = []
    if device is not None and not any(device.startswith(ok) for ok in DFLASH_DEVICES):
        # as SGLang 0.5.23 words it on the SGLang tier's CPU (tests_sglang/test_server_args.py)
        problems.append(
            f"SGLang: DFLASH speculative decoding is not supported by SRTPlatform on device {device!r}."
        )
    if not settings.speculative_draft_model_path:
        problems.append(
            "SGLang: DFLASH speculative decoding requires setting --speculative-draft-model-path. "
            "(set speculative_draft_model_path to the trained DFlash drafter)"
        )
    for name, value in (
        ("speculative_num_steps", settings.speculative_num_steps),
        ("speculative_eagle_topk", settings.speculative_eagle_topk),
    ):
        if value is not None and value != 1:
            problems.append(
                f"SGLang: DFLASH only supports {name} == 1; overriding {name}={value} to 1. (DFLASH drafts a "
                "whole block in one forward: leave it null and set the block size as speculative_num_draft_tokens)"
            )
    if settings.speculative_num_draft_tokens is None:
        problems.append(
            "DFLASH needs speculative_num_draft_tokens, the block size (verify window): without it SGLang reads "
            "it from the draft's config or defaults to 16, so the candidate measured would not be known here"
        )
    return problems


def effective_max_running(settings: ServerSettings) -> int | None:
    """The batch cap SGLang will use when none is given: 48 with speculation, else memory-derived (None)."""
    if settings.max_running_requests is not None:
        return settings.max_running_requests
    return SPEC_DEFAULT_MAX_RUNNING if settings.speculative else None


def save_settings(path: str | Path, settings: ServerSettings, provenance: dict[str, Any]) -> Path:
    """Write ``settings:`` (what serve launches) and ``tuned:`` (how it was chosen) as YAML, atomically."""
    from draftgen.rundir import write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {SETTINGS_KEY: settings.model_dump(mode="json"), "tuned": provenance}
    header = (
        "# SGLang settings chosen by draftgen tune. Launch: draftgen serve --settings THIS_FILE ...\n"
        f"# sglang flags: {' '.join(settings.sglang_args()) or '(none: SGLang defaults)'}\n"
    )
    return write_text(path, header + yaml.safe_dump(body, sort_keys=False))


def load_settings(path: str | Path) -> ServerSettings:
    """Read a settings file; a clear error naming the file and the bad key otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"settings file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"settings file {path} is not YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get(SETTINGS_KEY), dict):
        raise ValueError(
            f"settings file {path} has no `{SETTINGS_KEY}:` mapping (write one with draftgen tune)"
        )
    try:
        return ServerSettings.model_validate(data[SETTINGS_KEY])
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"settings file {path}: {details}") from None


def check_settings_file(path: str) -> str:
    """A settings-file parameter: "" (none given) or a file :func:`load_settings` reads (else its clear error)."""
    if path:
        load_settings(path)
    return path


# A config field naming the settings file the servers were launched with (benchmark, estimate).
SettingsFile = Annotated[str, AfterValidator(check_settings_file)]


def settings_record(path: str | Path | None) -> dict[str, Any] | None:
    """What benchmark and estimate write into their JSON: the file and the settings it holds."""
    if not path:
        return None
    settings = load_settings(path)
    return {
        "path": str(path),
        "settings": settings.model_dump(mode="json"),
        "sglang_args": settings.sglang_args(),
    }
