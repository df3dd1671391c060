"""Preflight: everything that can be checked before long work, reported as one table.

Rows: the environment (API key variable, estimate file), the run folder (lock, fingerprint, stored rows, room on
its filesystem for the projected output), the
prompt file (readable, malformed rows set aside in rejected.parquet, abort above ``max_rejected_rate``), and per
server: reachable, healthy (/health, /health_generate), serving ``model`` (/v1/models), engine and capabilities
(``ServerClient.probe``), batch cap (not below ``concurrency_per_server``), and one canary request that must come
back with reasoning AND an answer. Before all but the environment and the servers' health, what the config leaves
to the servers is filled in from them (``draftgen.generate.resolve``: the model name, the tokenizer folder).
Any "fail" row stops the run (``PreflightError``, whose message is the whole table) and lets go of the run
folder; a plan that passed keeps the folder's lease, opened once here, for generate's session (``Plan.store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from draftgen.client import introspect
from draftgen.client.clock import WALL, HardwareClock, fleet_clock, read_clock
from draftgen.client.errors import RequestError
from draftgen.client.records import Capabilities
from draftgen.client.retry import PROBE_RETRY, retrying
from draftgen.client.served import ServedFacts, read_served
from draftgen.client.server import ServerClient
from draftgen.defaults import CONCURRENCY_PER_SERVER
from draftgen.display.checks import checks_html as grouped_checks_html
from draftgen.display.checks import checks_text as grouped_checks_text
from draftgen.exit_codes import Refused
from draftgen.generate.acceptance import describe_source
from draftgen.generate.check import Check
from draftgen.generate.config import GenerateConfig
from draftgen.generate.disk import prompt_bytes_per_row, space_need
from draftgen.generate.dispatch import ServerPlan
from draftgen.generate.guard import classify
from draftgen.generate.length_cap import LengthCap, prompt_counter
from draftgen.generate.resolve import fill_in
from draftgen.generate.source import prompt_source
from draftgen.generate.store import (
    FingerprintMismatch,
    RunStore,
    StoreError,
    fingerprint_change,
)
from draftgen.params import ParameterError
from draftgen.prompts.audit import NEAR_LIMIT_BESIDE_A_RUN, AuditSettings, audit_prompts
from draftgen.prompts.audit_report import findings
from draftgen.prompts.rows import PromptFileError, PromptRow, RejectedRow
from draftgen.prompts.turn_budgets import TurnBudgets
from draftgen.sampling_plan import arm_sampling
from draftgen.sglang_rules.parsers import CALL_START, DEFAULT_FAMILY, tool_call_parser
from draftgen.training.masks import load_tokenizer
from draftgen.training.template_fit import template_problem
from draftgen.training.trainers import trainer_spec

ESTIMATE_KEYS = (
    "aggregate_output_tok_s",
    "wall_time_s",
    "num_prompts",
    "servers",
    "concurrency_per_server",
    "max_tokens",
    "mean_completion_tokens",
)
CANARY_PROMPTS = (
    "What is 17 + 25? Answer with the number.",
    "Name the largest planet of the solar system in one word.",
    "Is 91 a prime number? Answer yes or no.",
)
HEALTH_POLL_S = 2.0


PROMPT_SAMPLE = 10_000  # prompts whose length the max_length check reads
CHARS_PER_TOKEN = 4.0  # a rough rate for English-like text, used only without a tokenizer


@dataclass
class PromptScan:
    rows: int = 0  # rows read (valid + malformed) within the limit
    valid: int = 0
    rejected: int = 0  # malformed rows and skipped duplicates (all in rejected.parquet)
    # of them, conversations the file held earlier under another id: skipped, not malformed
    duplicates: int = 0
    stored: int = 0  # valid rows whose id is already in the shards
    reasons: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    prompt_chars: list[int] = field(
        default_factory=list
    )  # of the first PROMPT_SAMPLE valid rows (max_length check)
    # Fields of valid rows the reader did not use, by name: how many rows carry each (PromptRow.ignored).
    ignored: Counter = field(default_factory=Counter)
    with_tools: int = 0  # valid rows that offer tools (agentic conversations)

    @property
    def todo(self) -> int:
        return self.valid - self.stored

    @property
    def malformed(self) -> int:
        """Rejected rows that are not duplicates: what max_rejected_rate judges."""
        return self.rejected - self.duplicates

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows_scanned": self.rows,
            "valid": self.valid,
            "rejected": self.rejected,
            "duplicates": self.duplicates,
            "stored_at_start": self.stored,
            "todo_at_start": self.todo,
            "with_tools": self.with_tools,
            "ignored_fields": dict(self.ignored.most_common()),
        }


@dataclass(frozen=True)
class Plan:
    """What preflight found: the config to run (the one given, with what it left to the servers filled in), the
    servers to use (with capabilities) and the work to do, and the run folder, still held by its lease (``store``),
    for generate to write without opening it again."""

    config: GenerateConfig
    servers: list[ServerPlan]
    checks: list[Check]
    scan: PromptScan
    fingerprint: str
    clock: HardwareClock = WALL  # the servers' clock (draftgen sim: the simulated GPU's), for reports
    store: RunStore | None = field(default=None, repr=False, compare=False)
    length_cap: LengthCap | None = field(
        default=None, repr=False, compare=False
    )  # train_max_length + tokenizer
    requested: GenerateConfig | None = field(default=None, repr=False, compare=False)  # as given to preflight

    def run_config(self, given: GenerateConfig) -> GenerateConfig:
        """The config a run of this plan uses: ``config`` when ``given`` is the one preflight checked (filled in
        from the servers), else ``given`` as it is (which the run then refuses: preflight did not check it)."""
        return self.config if self.requested is not None and given == self.requested else given

    @property
    def todo(self) -> int:
        return self.scan.todo

    def release(self) -> None:
        """Let go of the run folder without running this plan (generate lets go of it when its session ends)."""
        if self.store is not None:
            self.store.release()

    def table(self) -> pl.DataFrame:
        return checks_frame(self.checks)

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return (
            f"preflight passed: {len(self.servers)} server(s), {self.todo:,} prompts to do\n"
            + format_checks(self.checks)
        )

    def _repr_html_(self) -> str:
        return (
            f"<p><b>preflight passed</b>: {len(self.servers)} server(s), {self.todo:,} prompts to do</p>"
            + checks_html(self.checks)
        )


class PreflightError(Refused):
    """A check before the first prompt failed: nothing was sent (exit code REFUSED)."""

    def __init__(self, checks: list[Check]):
        self.checks = checks
        failed = [c for c in checks if c.status == "fail"]
        super().__init__(
            f"preflight failed ({len(failed)} problem{'s' if len(failed) != 1 else ''}); nothing was sent. "
            "Fix the rows marked FAIL and run again:\n" + format_checks(checks)
        )


def checks_frame(checks: list[Check]) -> pl.DataFrame:
    return pl.DataFrame(
        [c.__dict__ for c in checks],
        schema={"check": pl.String, "target": pl.String, "status": pl.String, "detail": pl.String},
    )


def checks_html(checks: list[Check]) -> str:
    """One row per check with the count of servers that passed, and a row per server that did not."""
    return grouped_checks_html(checks)


def format_checks(checks: list[Check]) -> str:
    return grouped_checks_text(checks)


# ----- environment and files -------------------------------------------------------------------------------
def check_environment(config: GenerateConfig) -> list[Check]:
    checks = []
    if config.api_key_env is not None:
        try:
            config.api_key()
            checks.append(Check("api key", config.api_key_env, "ok", "set (value never shown or stored)"))
        except ParameterError as exc:
            checks.append(
                Check("api key", config.api_key_env, "fail", f"{exc.problems[0][1]}: export it first")
            )
    if config.loop_check and not config.stream:
        checks.append(
            Check(
                "loop check",
                "stream: false",
                "warn",
                "a looping answer runs on to max_tokens before the check sees it (kept up to its first repetition, "
                "no GPU time saved); stream: true ends it live",
            )
        )
    if config.estimate:
        try:
            estimate = load_estimate(config.estimate)
            checks.append(
                Check(
                    "estimate",
                    config.estimate,
                    "ok",
                    f"planned {estimate['aggregate_output_tok_s']:,.0f} tok/s, "
                    f"{estimate['wall_time_s'] / 3600:,.1f} h for {estimate['num_prompts']:,} prompts",
                )
            )
        except ValueError as exc:
            checks.append(Check("estimate", config.estimate, "fail", str(exc)))
    return checks


def load_estimate(path: str | Path) -> dict[str, Any]:
    """estimate.json from estimate.ipynb; ValueError naming the file and the missing keys."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    missing = [k for k in ESTIMATE_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)} (write it with estimate.ipynb)")
    return data


def scan_prompts(config: GenerateConfig, stored: set[str]) -> tuple[PromptScan, list[dict[str, Any]]]:
    """Read the prompt file once (streamed): counts, the malformed rows, and how many are already stored."""
    scan = PromptScan()
    rejected: list[dict[str, Any]] = []
    for item in prompt_source(config):
        scan.rows += 1
        if isinstance(item, RejectedRow):
            scan.rejected += 1
            rejected.append({"row": item.row, "id": item.id, "reason": item.reason, "raw": item.raw})
            if item.duplicate:  # skipped, not malformed: the audit's row says how many
                scan.duplicates += 1
                continue
            kind = item.reason.split(":")[0].split("(")[0].strip()
            scan.reasons[kind] += 1
            if len(scan.examples) < 3:
                scan.examples.append(f"row {item.row}: {item.reason}")
        elif isinstance(item, PromptRow):
            scan.valid += 1
            scan.ignored.update(item.ignored)
            scan.with_tools += item.tools is not None
            if len(scan.prompt_chars) < PROMPT_SAMPLE:
                scan.prompt_chars.append(sum(len(m.get("content") or "") for m in item.messages))
            if item.id in stored:
                scan.stored += 1
    return scan, rejected


def disk_check(config: GenerateConfig, scan: PromptScan) -> Check:
    """Room on out_dir's filesystem for the rows still to do (sized from the estimate, else max_tokens)."""
    mean = None
    if config.estimate:
        try:
            mean = float(load_estimate(config.estimate)["mean_completion_tokens"])
        except (ValueError, TypeError):
            mean = None  # the estimate row already says what is wrong with it
    need = space_need(
        config.out_dir,
        scan.todo,
        config.max_tokens,
        mean,
        prompt_bytes_per_row(config.prompt_path, scan.rows),
    )
    return Check("disk space", config.out_dir, "ok" if need.fits else "fail", need.detail())


def max_length_check(config: GenerateConfig, scan: PromptScan) -> Check | None:
    """max_tokens and the trainer's max_length collide when an answer plus its prompt can be longer than the
    trainer keeps: say so before the GPUs spend the tokens, with the share the estimate measured where there is one.
    Without an estimate, prompt tokens are guessed from characters (÷ 4, English-like text)."""
    limit = config.train_max_length
    if config.length_cap:
        return Check(
            "max_length",
            str(limit),
            "ok",
            f"each turn is sent with max_tokens = min({config.max_tokens}, {limit} − its prompt tokens), the prompt "
            f"counted with {config.tokenizer}; a turn whose prompt alone reaches {limit} is set aside, not sent",
        )
    if not limit or not scan.prompt_chars:
        return None
    median = float(np.median(scan.prompt_chars)) / CHARS_PER_TOKEN
    room = limit - median
    measured = ""
    status = "warn" if config.max_tokens > room else "ok"
    if config.estimate:
        with contextlib.suppress(ValueError, OSError):
            cost = load_estimate(config.estimate).get("train_max_length")
            if cost:
                share = cost["share_of_tokens"]
                measured = f"; the estimate measured {share:.1%} of the generated tokens past it"
                status = "warn" if share > 0.005 else "ok"
    if status == "ok":
        return Check(
            "max_length", str(limit), "ok", f"max_tokens {config.max_tokens} + prompts fit{measured}"
        )
    return Check(
        "max_length",
        str(limit),
        "warn",
        f"max_tokens {config.max_tokens} + prompts of ~{median:,.0f} tokens (median, from characters ÷ "
        f"{CHARS_PER_TOKEN:g}) reach past the trainer's max_length {limit} (train_max_length): an answer longer "
        f"than ~{max(room, 0):,.0f} tokens is cut there in training{measured or ' (run the estimate for the share)'}; "
        "raise the trainer's max_length or lower max_tokens, or give tokenizer to cap each turn there",
    )


def prompt_checks(config: GenerateConfig, scan: PromptScan, rejected_path: Path | None) -> list[Check]:
    target = str(config.prompt_path)
    checks = []
    where = f"; shard {config.shard_spec[0]}/{config.shard_spec[1]}" if config.shard_spec else ""
    limit = f"; limit {config.limit:,}" if config.limit else ""
    checks.append(
        Check("prompts", target, "ok", f"{scan.valid:,} valid of {scan.rows:,} rows read{where}{limit}")
    )
    if scan.valid == 0:
        checks.append(Check("prompts", target, "fail", "no valid prompt rows: check the file's format"))
    if scan.malformed:
        rate = scan.malformed / max(1, scan.rows)
        status = "fail" if rate > config.max_rejected_rate else "warn"
        kinds = ", ".join(f"{k} ×{n}" for k, n in scan.reasons.most_common(4))
        detail = (
            f"{scan.malformed:,} malformed rows ({rate:.1%}) set aside in {rejected_path} — {kinds}; "
            f"e.g. {'; '.join(scan.examples)}"
        )
        if status == "fail":
            detail += f". Above max_rejected_rate={config.max_rejected_rate:g}: fix the file or raise it"
        checks.append(Check("malformed rows", target, status, detail))
    if scan.ignored:
        checks.append(ignored_fields_check(scan, target))
    if scan.with_tools:
        checks.append(
            Check(
                "tools",
                target,
                "info",
                f"{scan.with_tools:,} rows offer tools: sent with every turn of their conversation; a turn whose "
                "calls are not the source's ends it there (tool_divergence)",
            )
        )
    limit_check = max_length_check(config, scan)
    if limit_check is not None:
        checks.append(limit_check)
    if scan.stored:
        checks.append(
            Check(
                "resume",
                config.out_dir,
                "info",
                f"{scan.stored:,} prompts already stored: {scan.todo:,} to do",
            )
        )
    return checks


IGNORED_SHOWN = 8  # fields named in the ignored-fields row, most common first


def ignored_fields_check(scan: PromptScan, target: str) -> Check:
    """The fields of valid rows that reach neither the request nor the row's identity, each with how many rows carry
    it: nothing the prompt file holds is dropped without a word."""
    shown = scan.ignored.most_common(IGNORED_SHOWN)
    more = len(scan.ignored) - len(shown)
    names = ", ".join(f"{name} {count:,} rows" for name, count in shown)
    return Check(
        "ignored fields",
        target,
        "info",
        f"ignored fields: {names}{f' and {more} more' if more else ''} (not sent; the manifest lists them all)",
    )


# ----- servers ---------------------------------------------------------------------------------------------
async def _wait_healthy(client: ServerClient, wait_s: float) -> int | None:
    deadline = time.monotonic() + wait_s
    while True:
        status = (await introspect.health(client, timeout_s=10.0)).status
        if status == 200 or time.monotonic() >= deadline:
            return status
        await asyncio.sleep(HEALTH_POLL_S)


CapLoad = Awaitable[tuple[LengthCap | None, Check | None]]


async def reach_server(
    config: GenerateConfig, url: str, api_key: str
) -> tuple[list[Check], ServedFacts | None]:
    """Is the server up and generating, and what does it serve (``ServedFacts``; None when it is not up)."""
    async with ServerClient(url, api_key=api_key, timeout_s=config.request_timeout_s) as client:
        checks: list[Check] = []
        status = await _wait_healthy(client, config.wait_for_servers_s)
        if status is None:
            checks.append(
                Check(
                    "reachable",
                    client.url,
                    "fail",
                    "connection refused or timed out: is the server running? "
                    "(SGLang opens its port only after loading the weights; see wait_for_servers_s)",
                )
            )
            return checks, None
        if status != 200:
            checks.append(
                Check("healthy", client.url, "fail", f"/health answered {status} (still warming up?)")
            )
            return checks, None
        generating = await introspect.health(client, generate=True, timeout_s=60.0)
        if not generating.ok:
            checks.append(
                Check(
                    "healthy",
                    client.url,
                    "fail",
                    f"/health answered 200 but /health_generate {generating.status}: it cannot generate; restart it",
                )
            )
            return checks, None
        healthy_note = (
            "/health and /health_generate 200"
            if generating.generates  # vLLM, transformers serve: no such endpoint; the probe and canary generate
            else "/health 200 (no /health_generate on this engine: the probe and canary prove it generates)"
        )
        checks.append(Check("healthy", client.url, "ok", healthy_note))
        return checks, await read_served(client)


async def check_server(
    config: GenerateConfig, facts: ServedFacts, api_key: str, cap_load: CapLoad | None = None
) -> tuple[str, list[Check], Capabilities | None]:
    """A server that is up, with ``model`` known: serving it, probe, engine, batch cap, canary. ``cap_load``: the
    length cap being loaded, whose tokenizer the canary's prompt count is compared with."""
    # entropy_top_k: the probe asks for the logprobs too, so an engine that refuses them steps back with the extras
    async with ServerClient(
        facts.url, api_key=api_key, timeout_s=config.request_timeout_s, entropy_top_k=config.entropy_top_k
    ) as client:
        checks, caps = await _server_checks(config, client, facts, cap_load)
        return client.url, checks, caps


async def _server_checks(
    config: GenerateConfig, client: ServerClient, facts: ServedFacts, cap_load: CapLoad | None = None
) -> tuple[list[Check], Capabilities | None]:
    checks: list[Check] = []
    url = client.url
    assert config.model is not None, "preflight fills in the model before it checks the servers"
    models = facts.models
    served = models.serves(config.model)
    if served is None:  # transformers serve answers 500 here: the probe's request names the model instead
        checks.append(
            Check(
                "model",
                url,
                "info",
                f"model list unavailable (GET /v1/models answered {models.status}): "
                f"the probe request checks {config.model!r} instead",
            )
        )
    elif not served:
        checks.append(
            Check(
                "model",
                url,
                "fail",
                f"serves {list(models.ids)}, not {config.model!r}: set model to the name /v1/models reports "
                '(or "": the one model every server lists)',
            )
        )
        return checks, None
    else:
        checks.append(Check("model", url, "ok", config.model))
    try:
        caps = await retrying(lambda: introspect.probe(client, config.model, config.sampling), PROBE_RETRY)
    except RequestError as exc:
        checks.append(
            Check("probe", url, "fail", f"a tiny request failed {PROBE_RETRY.max_attempts} times: {exc}")
        )
        return checks, None
    notes = [f"engine {caps.engine}{' ' + caps.version if caps.version else ''}"]
    notes.append(describe_source(caps))
    notes.append(describe_token_ids(caps))
    if not caps.extra_fields:
        notes.append("top_k/min_p not accepted: not sent")
    if config.entropy_top_k and not caps.logprobs:
        notes.append("top_logprobs not answered: no entropy summary (turn_entropy)")
    if not caps.template_kwargs:
        notes.append(
            "chat_template_kwargs not accepted: enable_thinking not sent (the template's default applies)"
        )
    dropped = not caps.template_kwargs or (
        not caps.extra_fields and (config.top_k is not None or config.min_p is not None)
    )
    probe_status = "warn" if dropped else "ok"
    checks.append(Check("engine", url, probe_status, "; ".join(notes)))
    cap = introspect.batch_cap(await introspect.server_info(client), caps)
    if cap is not None:
        checks.append(batch_cap_check(url, cap, config.concurrency_per_server))
    if config.canary:
        checks.extend(await canary(client, config, cap_load))
    return checks, caps


def batch_cap_check(url: str, cap: int, concurrency: int) -> Check:
    """A server that runs fewer requests at once than generate keeps in flight there is refused: the rest would
    wait in its queue, and the run would go at the cap's pace while the estimate priced the concurrency."""
    if cap >= concurrency:
        return Check("batch cap", url, "ok", f"runs {cap} at once (concurrency_per_server {concurrency})")
    return Check(
        "batch cap",
        url,
        "fail",
        f"runs {cap} at once, fewer than concurrency_per_server {concurrency}: start the server with "
        f"--max-running-requests {concurrency} or more (draftgen serve starts SGLang with {CONCURRENCY_PER_SERVER} "
        f"when MTP is on), or set concurrency_per_server to {cap} (-p concurrency_per_server {cap})",
    )


def describe_token_ids(caps: Capabilities) -> str:
    """Where this server's token ids come from, for preflight's engine row."""
    if caps.token_ids:
        return f"token ids from the server ({caps.token_ids})"
    return f"no token ids from {caps.engine}: validate re-tokenizes"


async def prompt_count_check(
    url: str, messages: list[dict[str, str]], served: int | None, cap_load: CapLoad, thinking: bool
) -> Check | None:
    """The tokenizer that caps every turn counts a canary's prompt as the server did, or the cap is off by the
    difference (a tokenizer folder that is not the served model's)."""
    length_cap, _ = await cap_load
    if length_cap is None or served is None:
        return None
    limit = length_cap.limit(messages, 1, thinking)  # the count only, rendered as the canary was sent
    if limit.prompt_tokens is None:
        return Check("prompt count", url, "warn", "the tokenizer's chat template could not render the canary")
    if limit.prompt_tokens == served:
        return Check(
            "prompt count", url, "ok", f"the tokenizer counts the canary's prompt as the server: {served}"
        )
    return Check(
        "prompt count",
        url,
        "warn",
        f"the server counted {served} prompt tokens for the canary, the tokenizer ({length_cap.tokenizer}) "
        f"{limit.prompt_tokens}: each turn's max_tokens is capped on the tokenizer's count, so a turn can run "
        "past the trainer's max_length or stop short of it; give the served model's tokenizer folder",
    )


async def canary(
    client: ServerClient, config: GenerateConfig, cap_load: CapLoad | None = None
) -> list[Check]:
    """One real request: with thinking on, reasoning and answer must both be non-empty; with a length cap, its
    tokenizer's count of the prompt must be the server's."""
    check, counted = await _canary(client, config)
    checks = [check]
    if cap_load is not None and counted is not None:
        counts = await prompt_count_check(client.url, *counted, cap_load, config.enable_thinking)
        if counts is not None:
            checks.append(counts)
    return checks


async def _canary(
    client: ServerClient, config: GenerateConfig
) -> tuple[Check, tuple[list[dict[str, str]], int | None] | None]:
    """The canary's verdict, and the messages of its first answered request with the server's prompt count."""
    truncated = 0
    counted = None
    for prompt in CANARY_PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        try:
            result = await retrying(
                lambda messages=messages: client.chat(
                    messages,
                    config.sampling,
                    config.model,
                    stream=config.stream,
                    timeout_s=config.request_timeout_s,
                ),
                PROBE_RETRY,
            )
        except RequestError as exc:
            return Check(
                "canary", client.url, "fail", f"request failed {PROBE_RETRY.max_attempts} times: {exc}"
            ), counted
        if counted is None:
            counted = (messages, result.prompt_tokens)
        defects = classify(
            thinking=config.enable_thinking,
            content=result.content,
            reasoning=result.reasoning_content,
            finish_reason=result.finish_reason,
            failed=False,
        )
        if defects == ("truncated",):
            truncated += 1
            continue
        if defects:
            reasoning = (result.reasoning_content or "")[:80]
            answer = (result.content or "")[:80]
            return Check(
                "canary",
                client.url,
                "fail",
                f"{', '.join(d.replace('_', ' ') for d in defects)} (finish {result.finish_reason}, reasoning "
                f"{reasoning!r}, answer {answer!r}): check --reasoning-parser and the chat template",
            ), counted
        return Check(
            "canary",
            client.url,
            "ok",
            f"reasoning {len(result.reasoning_content or '')} chars, answer {len(result.content or '')} chars, "
            f"{result.completion_tokens} tokens in {result.latency_s:.1f} s",
        ), counted
    return Check(
        "canary",
        client.url,
        "warn",
        f"all {truncated} canaries stopped at max_tokens={config.max_tokens} before answering: "
        "reasoning seen, answer not confirmed",
    ), counted


# A function the canary offers, and prompts that ask for it (tried in turn until one is answered with a call).
CANARY_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_word_length",
            "description": "The number of letters in a word.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string", "description": "the word to measure"}},
                "required": ["word"],
            },
        },
    },
)
CANARY_TOOL_PROMPTS = (
    "Use the get_word_length tool: how many letters are in Draftgen?",
    "Call get_word_length to count the letters of the word Speculative.",
    "I need the length of a word. Call the get_word_length function for Drafter.",
)


async def tool_canary(client: ServerClient, config: GenerateConfig) -> Check:
    """The prompt set offers tools: one request with a tool must come back with the call parsed into ``tool_calls``.
    A call left as text in ``content`` means the server has no tool-call parser for the model (SGLang starts without
    one): every agentic turn would be stored as text and end its conversation. Fails then."""
    parser = tool_call_parser(DEFAULT_FAMILY)
    for prompt in CANARY_TOOL_PROMPTS:
        try:
            result = await retrying(
                lambda prompt=prompt: client.chat(
                    [{"role": "user", "content": prompt}],
                    config.sampling,
                    config.model,
                    stream=config.stream,
                    timeout_s=config.request_timeout_s,
                    tools=CANARY_TOOLS,
                ),
                PROBE_RETRY,
            )
        except RequestError as exc:
            return Check(
                "tool canary",
                client.url,
                "fail",
                f"a request with tools failed {PROBE_RETRY.max_attempts} times: {exc}",
            )
        if result.tool_calls:
            names = ", ".join(c["function"]["name"] for c in result.tool_calls)
            return Check(
                "tool canary", client.url, "ok", f"the call came back parsed in tool_calls ({names})"
            )
        if CALL_START in (result.content or "") and result.finish_reason != "length":
            # a whole call left as text (a call cut by max_tokens is never parsed, parser or not: next prompt)
            return Check(
                "tool canary",
                client.url,
                "fail",
                f"the call came back as text in content ({(result.content or '').strip()[:80]!r}): the server parses "
                f"no tool calls; start SGLang with --tool-call-parser ({parser} for Qwen3.5/3.6; draftgen serve adds "
                "it by --model-family)",
            )
    return Check(
        "tool canary",
        client.url,
        "warn",
        f"the model answered all {len(CANARY_TOOL_PROMPTS)} tool canaries without a whole call (none, or cut by "
        f"max_tokens {config.max_tokens}): that its calls are parsed is not confirmed",
    )


async def tool_canaries(config: GenerateConfig, plans: list[ServerPlan], api_key: str) -> list[Check]:
    """``tool_canary`` on every approved server, at once."""

    async def one(plan: ServerPlan) -> Check:
        async with ServerClient(
            plan.url, api_key=api_key, timeout_s=config.request_timeout_s, capabilities=plan.capabilities
        ) as client:
            return await tool_canary(client, config)

    return list(await asyncio.gather(*(one(plan) for plan in plans)))


# ----- the whole preflight ---------------------------------------------------------------------------------
async def preflight(config: GenerateConfig) -> Plan:
    """Run every check (servers concurrently, the prompt scan in a thread); raise PreflightError on any fail."""
    requested = config
    checks = check_environment(config)
    api_key = "EMPTY"
    if not any(c.check == "api key" and c.status == "fail" for c in checks):
        api_key = config.api_key() if config.api_key_env else "EMPTY"
    reached = await asyncio.gather(*(reach_server(config, url, api_key) for url in config.servers))
    for server_checks, _ in reached:
        checks.extend(server_checks)
    up = [facts for _, facts in reached if facts is not None]
    config, filled = fill_in(config, up)
    checks.extend(filled)
    if any(c.status == "fail" for c in filled):
        raise PreflightError(checks)  # nothing else can be checked without them
    scan = PromptScan()
    store: RunStore | None = None
    try:
        store = RunStore.open(config)
        change = fingerprint_change(config, store.manifest)
        if change:
            checks.append(Check("out_dir", config.out_dir, "warn", change))
    except FingerprintMismatch as exc:
        checks.append(Check("out_dir", config.out_dir, "fail", str(exc)))
    except StoreError as exc:
        checks.append(Check("out_dir", config.out_dir, "fail", str(exc)))
    try:
        cap_task = asyncio.ensure_future(load_length_cap(config))
        server_task = asyncio.gather(
            *(check_server(config, facts, api_key, asyncio.shield(cap_task)) for facts in up)
        )
        scan_task = asyncio.to_thread(scan_prompts, config, store.done_ids if store else set())
        audit_task = asyncio.ensure_future(audit_checks(config, cap_task))
        try:
            scanned, servers = await asyncio.gather(scan_task, server_task)
        except PromptFileError as exc:
            checks.append(Check("prompts", str(config.prompt_path), "fail", str(exc)))
            servers = await server_task
            scanned = None
        if scanned is not None:
            scan, rejected = scanned
            rejected_path = None
            if store is not None:
                rejected_path = store.write_rejected(rejected, scan.as_dict())
            checks.extend(prompt_checks(config, scan, rejected_path))
            if scan.todo > 0:
                checks.append(disk_check(config, scan))
        length_cap, cap_check = await cap_task
        if cap_check is not None:
            checks.append(cap_check)
        checks.extend(await audit_task)
        plans = []
        for url, server_checks, caps in servers:
            checks.extend(server_checks)
            if caps is not None:
                plans.append(ServerPlan(url, caps))
        failed = any(c.status == "fail" for c in checks)
        if config.canary and scan.with_tools and plans and not failed:  # no run will follow a failed check
            checks.extend(await tool_canaries(config, plans, api_key))
        clock, clock_check = await servers_clock([p.url for p in plans], api_key)
        if clock_check is not None:
            checks.append(clock_check)
        if any(c.status == "fail" for c in checks):
            raise PreflightError(checks)
    except BaseException:
        if store is not None:
            store.release()  # nothing will run
        raise
    # The run folder stays leased: generate's session writes through this store (the lock is never let go between).
    return Plan(
        config=config,
        servers=plans,
        checks=checks,
        scan=scan,
        fingerprint=config.fingerprint(),
        clock=clock,
        store=store,
        length_cap=length_cap,
        requested=requested,
    )


async def load_length_cap(config: GenerateConfig) -> tuple[LengthCap | None, Check | None]:
    """The trainer's max_length as a cap on each turn, with the tokenizer that counts prompts (None: no cap)."""
    if not config.tokenizer:
        return None, None
    try:
        tokenizer = await asyncio.to_thread(load_tokenizer, config.tokenizer)
    except ValueError as exc:
        return None, Check("tokenizer", config.tokenizer, "fail", str(exc))
    arms = [arm_sampling(config.sampling, arm) for arm in config.sampling_plan] or [config.sampling]
    modes = sorted({arm.enable_thinking for arm in arms}, reverse=True)
    problems = [
        template_problem(tokenizer, trainer_spec(config.trainer), config.trainer.value, m) for m in modes
    ]
    problem = next((p for p in problems if p), None)
    if problem:
        return None, Check(
            "tokenizer",
            config.tokenizer,
            "fail",
            f"does not fit the trainer {config.trainer.value}: {problem}",
        )
    fit = Check(
        "tokenizer",
        config.tokenizer,
        "ok",
        f"its chat template renders what the trainer ({config.trainer.value}) expects",
    )
    if not config.length_cap:
        return None, fit
    return LengthCap(
        config.length_cap, prompt_counter(tokenizer), config.tokenizer, config.min_turn_budget
    ), fit


async def audit_checks(config: GenerateConfig, cap_task: asyncio.Future) -> list[Check]:
    """The prompt audit's findings as info/warn rows, never a fail (docs/generate.md, "The prompt audit"): read
    beside the server checks, with the run's length cap once it is loaded; near-duplicates among the first
    NEAR_LIMIT_BESIDE_A_RUN conversations. With a shard, the whole file is audited."""
    length_cap, _ = await cap_task
    target = str(config.prompt_path) + (" (whole file)" if config.shard_spec else "")
    settings = AuditSettings(
        path=config.prompt_path,
        category_field=config.category_field or None,
        keep_duplicates=config.keep_duplicates,
        turns=config.turns,
        limit=0 if config.shard_spec else config.limit,
        near_limit=NEAR_LIMIT_BESIDE_A_RUN,
        cap=length_cap,
        max_tokens=config.max_tokens,
        enable_thinking=config.enable_thinking,
        progress=False,
    )
    try:
        audit = await asyncio.to_thread(audit_prompts, settings)
    except (PromptFileError, OSError):
        return []  # the prompts row says what is wrong with the file
    rows = [
        Check(f"audit: {f.check}", target, f.status, f.detail)
        for f in findings(audit)
        if f.check != "malformed rows"
    ]
    if audit.budgets is not None and audit.budgets.turns:
        rows.append(cut_prediction(config, audit.budgets))
    return rows or [
        Check("audit", target, "info", "no duplicates, shared first turns, openers or near-duplicates")
    ]


def cut_prediction(config: GenerateConfig, budgets: TurnBudgets) -> Check:
    """How many turns the trainer's max_length cap will cut, before a request is sent: every capped turn at most;
    with the estimate, the expected number from its measured completion lengths. Cut by design, trained as
    generated: an info row, so a long multi-turn set's many cuts are expected, not a surprise at the gate."""
    capped = len(budgets.capped_rooms)
    sent = budgets.turns - budgets.set_aside
    small = sum(room <= 1024 for room in budgets.capped_rooms)
    sample = (
        ""
        if budgets.conversations == budgets.of_conversations
        else f" (of {budgets.conversations:,} counted)"
    )
    detail = (
        f"{capped:,} of the {sent:,} turns sent{sample} get less room than max_tokens {config.max_tokens:,} "
        f"({small:,} of them 1,024 tokens or less)"
    )
    percentiles = None
    if config.estimate:
        with contextlib.suppress(ValueError, OSError):
            percentiles = load_estimate(config.estimate).get("completion_tokens_percentiles")
    if percentiles:
        expected = budgets.expected_cuts(percentiles)
        detail += (
            f"; from the estimate's completion lengths about {expected:,.0f} ({expected / max(1, sent):.0%} of the "
            "turns sent) will end at the cap"
        )
    else:
        detail += "; each may end at the cap (an estimate, -p estimate ..., predicts how many)"
    detail += (
        " — cut at max_length, expected: they train as generated and never count against max_truncated_rate or "
        "validate's gate"
    )
    return Check("audit: cut prediction", str(config.prompt_path), "info", detail)


async def servers_clock(urls: list[str], api_key: str = "EMPTY") -> tuple[HardwareClock, Check | None]:
    """The fleet's clock (``/sim/info`` on draftgen sim, else the wall clock) and a row saying so when simulated."""

    async def one(url: str) -> HardwareClock:
        async with ServerClient(url, api_key=api_key) as client:
            return await read_clock(client)

    clocks = list(await asyncio.gather(*(one(url) for url in urls)))
    clock, warning = fleet_clock(clocks)
    if warning:
        return clock, Check("clock", f"{len(urls)} servers", "warn", warning)
    if clock.simulated:
        return clock, Check(
            "clock", f"{len(urls)} servers", "info", f"draftgen sim: {clock.note} in the reports"
        )
    return clock, None
