"""GenerateConfig: every parameter of generate.ipynb, validated and frozen before any request is sent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from draftgen.client.loops import LoopRule
from draftgen.params import (
    CategoryField,
    ConcurrencyPerServer,
    FleetParams,
    KeepDuplicates,
    Limit,
    MinTurnBudget,
    NonNegativeFloat,
    NotebookCell,
    PositiveFloat,
    PositiveInt,
    ProjectPath,
    SamplingParams,
    TrainerName,
    TrainMaxLength,
    Turns,
    param,
)
from draftgen.prompts.rows import SYNTHETIC, check_prompt_source, prompt_source_path
from draftgen.sampling_plan import SamplingPlan

Rate = Annotated[float, Field(ge=0, le=1)]

# Parameters that change what a completion looks like, or which prompts are answered: a resumed run must use the
# same ones.
FINGERPRINT_FIELDS = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "enable_thinking",
    "turns",
    "sampling_plan",
    "length_cap",
    "keep_duplicates",
)
# Fingerprint fields added after runs were made, with the value those runs used: left out of the hash when
# equal to it, so an older run resumes with that value (and only that value) without force.
FINGERPRINT_SINCE: dict[str, Any] = {
    "turns": "last",
    "sampling_plan": [],
    "length_cap": 0,
    "keep_duplicates": True,  # before duplicate conversations were skipped, every one was sent
}


def parse_shard(value: str | list[int] | None) -> tuple[int, int] | None:
    """``"i/n"`` or ``[i, n]`` → (i, n) with 0 <= i < n; ``""``/None → no sharding. ValueError says what is wrong."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        index_text, sep, count_text = value.partition("/")
        if not sep or not index_text.strip().isdigit() or not count_text.strip().isdigit():
            raise ValueError(f'{value!r} is not "index/count" like "0/4"')
        index, count = int(index_text), int(count_text)
    elif isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
        index, count = value
    else:
        raise ValueError(f'{value!r} is not "index/count" or [index, count]')
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ValueError(f"index must be in 0..{count - 1}, got {index}")
    return index, count


class GenerateConfig(FleetParams, SamplingParams):
    """Parameters of one generation run (shared names: docs/design.md; defaults: the production settings)."""

    parameters_cell = NotebookCell(
        ("fleet", "servers model api_key_env request_timeout_s"),
        ("data", "prompts out_dir limit shard turns batch_save_size category_field keep_duplicates"),
        ("sampling plan (several answers per prompt, mixed settings)", "sampling_plan"),
        ("sampling (production settings)", "max_tokens temperature top_p top_k min_p enable_thinking"),
        (
            "dispatch",
            "concurrency_per_server stream loop_check entropy_top_k affinity_hold_s max_attempts backoff_base_s backoff_max_s hang_factor hang_min_s "
            "server_silence_s server_down_after probe_interval_s probe_max_interval_s all_down_timeout_s "
            "wait_for_servers_s",
        ),
        (
            "garbage guard",
            "guard_window guard_min_results max_empty_answer_rate max_empty_reasoning_rate max_truncated_rate "
            "max_loop_rate max_failed_rate max_rejected_rate",
        ),
        (
            "checks and reporting",
            "canary estimate train_max_length min_turn_budget tokenizer trainer force acceptance_interval_s hedge_slow_ratio progress_interval_s "
            "status_interval_s",
        ),
        help={
            "request_timeout_s": "one request's hard time limit (s); see hang_factor for hangs",
            "train_max_length": "the trainer's max_length: with a tokenizer, each turn's max_tokens is capped at "
            "max_length − its prompt tokens (0: no cap, not checked)",
        },
        doc={
            "servers": 'base URLs, one per server, or one SMG (gateway) URL ("Beyond one node" below)',
            "request_timeout_s": "one request's hard time limit (s); a hung request is retried elsewhere",
            "limit": "take the first N valid prompts of this shard (0: all); a resumed run selects the same N",
        },
    )

    prompts: str = param(
        ...,
        'prompt file (.jsonl/.parquet), or "synthetic" for the bundled 2,000 rows',
        notebook=SYNTHETIC,
        min_length=1,
    )
    out_dir: ProjectPath = param(
        ...,
        "run folder: shards/, manifest.json, failed/rejected.parquet (draftgen run sets it); the same folder resumes",
        notebook="outputs/generate/interactive",
        min_length=1,
    )
    turns: Turns
    category_field: CategoryField
    keep_duplicates: KeepDuplicates
    sampling_plan: SamplingPlan
    concurrency_per_server: ConcurrencyPerServer
    batch_save_size: PositiveInt = param(500, "rows per parquet shard (written atomically)")
    limit: Limit
    shard: str | list[int] = param(
        "", '"i/n": this process takes the prompts whose id hashes to i of n ("": all)'
    )
    stream: bool = param(
        True,
        "stream responses: the loop check then ends a looping answer live, and TTFT is recorded (more client CPU)",
        doc="stream responses: the loop check then ends a looping answer live (the server stops generating it), and "
        "TTFT is recorded; costs client CPU (docs/figures.md); false: one whole body per answer, a loop found only "
        "after the fact",
    )
    loop_check: bool = param(
        True,
        "end an answer that falls into a repetition loop, stored up to its first repetition (streamed: live, the "
        "request stops; else found after the fact)",
        doc="end an answer that falls into a repetition loop and store it up to the end of the cycle's first "
        'repetition, flagged `repetition_loop` ("Repetition loops" below): streamed, the stream is closed there and '
        "the server stops generating; not streamed, the loop is found in the whole answer (nothing saved)",
    )
    entropy_top_k: Annotated[int, Field(ge=0, le=20)] = param(
        0,
        "ask for this many top_logprobs per token and store each turn's entropy summary (turn_entropy); 0: off",
        doc="ask each answer for its top `entropy_top_k` logprobs per token (OpenAI's `logprobs`, `top_logprobs`; "
        "preflight's probe finds whether each server answers them) and store each turn's **top-k entropy summary** "
        '(`turn_entropy`: tokens, mean, p10, p50, p90, in nats; "Target flatness" below), so data can later be '
        "selected by how flat the target was without a second run; needs `stream: true`; 0: not asked, nothing "
        "stored",
    )
    affinity_hold_s: NonNegativeFloat = param(
        10.0,
        "a conversation's next turn and a prompt's next sample wait up to this long (s) for a free slot on the "
        "server that holds their prefix before any server takes them (0: no affinity)",
        doc="a conversation's next turn, and a prompt's next sample, wait up to this long for a free slot on the "
        "server that served the previous one (its prefix cache holds their prefix), then any server takes them; "
        "never while another server would sit idle, and never for a server that is down or slow "
        '("Prefix affinity" below); 0: no affinity',
    )
    max_attempts: PositiveInt = param(
        5,
        "tries per prompt before it goes to failed.parquet",
        doc="tries per request (per turn) before the prompt goes to failed.parquet",
    )
    backoff_base_s: PositiveFloat = param(
        1.0,
        "first retry waits up to this (full jitter, doubling)",
        doc="retry wait: full jitter over [0, min(backoff_max_s, backoff_base_s · 2^(attempt-1))], never below a "
        "server's Retry-After",
    )
    backoff_max_s: PositiveFloat = param(
        60.0, "longest single retry wait (a server's Retry-After is honoured)"
    )
    hang_factor: NonNegativeFloat = param(
        3.0,
        "presume a request hung after this x the time max_tokens take at the server's slow rate (0: off)",
        doc="once a server has answered 50 requests, a request there is presumed hung after this many times the "
        "time max_tokens take at its slow (5th-percentile) per-request rate; 0 turns it off",
    )
    hang_min_s: PositiveFloat = param(
        300.0, "never presume hung sooner; request_timeout_s stays the hard limit"
    )
    server_silence_s: NonNegativeFloat = param(
        120.0,
        "requests in flight, no answer this long: /health_generate decides (0: off)",
        doc="a server with requests in flight that answers nothing for this long is checked with /health_generate "
        "(SGLang: 200 on any scheduler output, 503 after 20 s of silence); a failed check benches it; 0 turns it off",
    )
    server_down_after: PositiveInt = param(
        5,
        "consecutive connection/5xx/timeout failures that mark a server down",
        doc="consecutive connection / 5xx / timeout failures that mark a server down (429 never does)",
    )
    probe_interval_s: PositiveFloat = param(
        2.0, "delay of the first /health_generate probe of a down server (doubles)"
    )
    probe_max_interval_s: PositiveFloat = param(60.0, "longest gap between probes")
    all_down_timeout_s: PositiveFloat = param(
        3600.0, "halt (work saved) if every server stays down this long"
    )
    guard_window: PositiveInt = param(200, "recent results the guard looks at")
    guard_min_results: PositiveInt = param(
        100, "results before the guard may halt (shorter runs: the canary guards)"
    )
    max_empty_answer_rate: Rate = param(
        0.05, "halt above this share of empty answers (finished, not truncated)"
    )
    max_empty_reasoning_rate: Rate = param(0.05, "halt above this share of empty reasoning (thinking on)")
    max_truncated_rate: Rate = param(0.5, 'halt above this share of finish_reason "length"')
    max_loop_rate: Rate = param(0.1, "halt above this share of answers ended as repetition loops")
    max_failed_rate: Rate = param(0.2, "halt above this share of prompts failing every attempt")
    max_rejected_rate: Rate = param(0.01, "abort before starting above this share of malformed prompt rows")
    wait_for_servers_s: NonNegativeFloat = param(
        0.0, "preflight: keep polling /health of servers still loading for this long"
    )
    canary: bool = param(
        True, "preflight sends one full request per server (reasoning and answer must be non-empty)"
    )
    train_max_length: TrainMaxLength
    min_turn_budget: MinTurnBudget
    trainer: TrainerName
    tokenizer: ProjectPath = param(
        "",
        "the target model's folder (tokenizer.json + chat template): counts each turn's prompt to cap its "
        'max_tokens at train_max_length ("": the folder the servers loaded, if on this machine; else real servers '
        "are refused)",
        doc="the target model's folder (tokenizer.json + chat template), local files only: each turn's prompt is "
        "counted with it, rendered as the server renders it, and the turn is sent with max_tokens = min(max_tokens, "
        'train_max_length − prompt tokens) ("Nothing generated past max_length" below); "": the model folder the '
        "servers loaded when it is on this machine, else real servers are refused and simulated ones run uncapped "
        '("Preflight" below)',
    )
    estimate: ProjectPath = param(
        "", "path to estimate.json from estimate.ipynb: planned vs actual at the end"
    )
    force: bool = param(False, "resume even though model/sampling parameters differ from the stored run")
    progress_interval_s: NonNegativeFloat = param(1.0, "seconds between progress-bar refreshes")
    acceptance_interval_s: NonNegativeFloat = param(
        60.0,
        "scrape each worker's /metrics this often for MTP acceptance over time (0: never)",
        doc="scrape each worker's /metrics this often for MTP acceptance over time (acceptance.parquet); a gateway's "
        "workers (when its answers carry no sglext) come from its GET /workers; 0: never",
    )
    status_interval_s: PositiveFloat = param(
        5.0,
        "seconds between progress.json writes, read by draftgen status and monitor.ipynb",
        doc="seconds between progress.json writes (one progress-history.jsonl line each time), read by draftgen "
        "status and monitor.ipynb; a heartbeat older than max(30 s, 4 × this) is stale",
    )
    hedge_slow_ratio: Annotated[float, Field(ge=0, lt=1)] = param(
        0.7,
        "queue empty: copy requests running on a server slower than this x the fleet's median per-request rate "
        "to an idle one, first answer kept (0: never)",
        doc="once nothing is left to send, requests still running on a server whose median per-request rate is "
        'below this × the fleet\'s are also sent to idle servers, the first answer kept ("Hedging the tail" below); '
        "0: never",
    )

    @field_validator("shard")
    @classmethod
    def _shard(cls, value: str | list[int]) -> str | list[int]:
        parse_shard(value)
        return value

    @field_validator("estimate")
    @classmethod
    def _estimate(cls, value: str) -> str:
        if value and not Path(value).is_file():
            raise ValueError(
                f"estimate file {value} does not exist (write it with estimate.ipynb, or set '')"
            )
        return value

    _prompts = field_validator("prompts")(check_prompt_source)

    @model_validator(mode="after")
    def _consistent(self) -> GenerateConfig:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_base_s ({self.backoff_base_s})"
            )
        if self.probe_max_interval_s < self.probe_interval_s:
            raise ValueError(
                f"probe_max_interval_s ({self.probe_max_interval_s}) must be >= probe_interval_s "
                f"({self.probe_interval_s})"
            )
        if self.guard_min_results > self.guard_window:
            raise ValueError(
                f"guard_min_results ({self.guard_min_results}) must be <= guard_window ({self.guard_window})"
            )
        if self.entropy_top_k and not self.stream:
            raise ValueError(
                f"entropy_top_k ({self.entropy_top_k}) needs stream: true: a whole answer is read through the "
                "openai SDK, whose objects for top-k logprobs cost 10-50 times the client CPU per token "
                "(docs/figures.md); set stream: true, or entropy_top_k: 0"
            )
        return self

    # ----- derived values --------------------------------------------------------------------------------
    @property
    def loop_rule(self) -> LoopRule | None:
        """The repetition-loop rule the clients apply (None: loop_check off)."""
        return LoopRule() if self.loop_check else None

    @property
    def prompt_path(self) -> Path:
        return prompt_source_path(self.prompts)

    @property
    def length_cap(self) -> int:
        """The max_length every turn is capped at (0: none): train_max_length, when a tokenizer counts prompts."""
        return self.train_max_length if self.tokenizer else 0

    @property
    def shard_spec(self) -> tuple[int, int] | None:
        return parse_shard(self.shard)

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = {name: getattr(self, name) for name in FINGERPRINT_FIELDS}
        fields["sampling_plan"] = [arm.model_dump(exclude_none=True) for arm in self.sampling_plan]
        shard = self.shard_spec
        fields["shard"] = list(shard) if shard else None
        return fields

    def fingerprint(self) -> str:
        """Stable hash of the parameters that decide the data (model, sampling, shard)."""
        fields = {
            name: value
            for name, value in self.fingerprint_fields().items()
            if name not in FINGERPRINT_SINCE or value != FINGERPRINT_SINCE[name]
        }
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
