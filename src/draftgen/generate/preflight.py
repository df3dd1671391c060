"""Preflight: everything that can be checked before long work, reported as one table.

Rows: the environment (API key variable, estimate file), the run folder (lock, fingerprint, stored rows, room on
its filesystem for the projected output), the
prompt file (readable, malformed rows set aside in rejected.parquet, abort above ``max_rejected_rate``), and per
server: reachable, healthy (/health, /health_generate), serving ``model`` (/v1/models), engine and capabilities
(``ServerClient.probe``), batch cap, and one canary request that must come back with reasoning AND an answer.
Any "fail" row stops the run (``PreflightError``, whose message is the whole table) and lets go of the run
folder; a plan that passed keeps the folder's lease, opened once here, for generate's session (``Plan.store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
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
from draftgen.client.server import ServerClient
from draftgen.display.checks import checks_html as grouped_checks_html
from draftgen.display.checks import checks_text as grouped_checks_text
from draftgen.generate.acceptance import describe_source
from draftgen.generate.config import GenerateConfig
from draftgen.generate.disk import prompt_bytes_per_row, space_need
from draftgen.generate.dispatch import ServerPlan
from draftgen.generate.guard import classify
from draftgen.generate.length_cap import LengthCap, tokenizer_counter
from draftgen.generate.source import prompt_source
from draftgen.generate.store import (
    FingerprintMismatch,
    RunStore,
    StoreError,
    fingerprint_change,
)
from draftgen.params import ParameterError
from draftgen.prompts.rows import PromptFileError, PromptRow, RejectedRow

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


@dataclass(frozen=True)
class Check:
    check: str
    target: str
    status: str  # "ok", "info", "warn", "fail"
    detail: str


PROMPT_SAMPLE = 10_000  # prompts whose length the max_length check reads
CHARS_PER_TOKEN = 4.0  # a rough rate for English-like text, used only without a tokenizer


@dataclass
class PromptScan:
    rows: int = 0  # rows read (valid + malformed) within the limit
    valid: int = 0
    rejected: int = 0
    stored: int = 0  # valid rows whose id is already in the shards
    reasons: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    prompt_chars: list[int] = field(
        default_factory=list
    )  # of the first PROMPT_SAMPLE valid rows (max_length check)

    @property
    def todo(self) -> int:
        return self.valid - self.stored

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows_scanned": self.rows,
            "valid": self.valid,
            "rejected": self.rejected,
            "stored_at_start": self.stored,
            "todo_at_start": self.todo,
        }


@dataclass(frozen=True)
class Plan:
    """What preflight found: the servers to use (with capabilities) and the work to do, and the run folder, still
    held by its lease (``store``), for generate to write without opening it again."""

    servers: list[ServerPlan]
    checks: list[Check]
    scan: PromptScan
    fingerprint: str
    clock: HardwareClock = WALL  # the servers' clock (draftgen sim: the simulated GPU's), for reports
    store: RunStore | None = field(default=None, repr=False, compare=False)
    length_cap: LengthCap | None = field(
        default=None, repr=False, compare=False
    )  # train_max_length + tokenizer

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


class PreflightError(RuntimeError):
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
            kind = item.reason.split(":")[0].split("(")[0].strip()
            scan.reasons[kind] += 1
            if len(scan.examples) < 3:
                scan.examples.append(f"row {item.row}: {item.reason}")
            rejected.append({"row": item.row, "id": item.id, "reason": item.reason, "raw": item.raw})
        elif isinstance(item, PromptRow):
            scan.valid += 1
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
    if scan.rejected:
        rate = scan.rejected / max(1, scan.rows)
        status = "fail" if rate > config.max_rejected_rate else "warn"
        kinds = ", ".join(f"{k} ×{n}" for k, n in scan.reasons.most_common(4))
        detail = (
            f"{scan.rejected:,} malformed rows ({rate:.1%}) set aside in {rejected_path} — {kinds}; "
            f"e.g. {'; '.join(scan.examples)}"
        )
        if status == "fail":
            detail += f". Above max_rejected_rate={config.max_rejected_rate:g}: fix the file or raise it"
        checks.append(Check("malformed rows", target, status, detail))
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


# ----- servers ---------------------------------------------------------------------------------------------
async def _wait_healthy(client: ServerClient, wait_s: float) -> int | None:
    deadline = time.monotonic() + wait_s
    while True:
        status = (await introspect.health(client, timeout_s=10.0)).status
        if status == 200 or time.monotonic() >= deadline:
            return status
        await asyncio.sleep(HEALTH_POLL_S)


async def check_server(
    config: GenerateConfig, url: str, api_key: str
) -> tuple[str, list[Check], Capabilities | None]:
    async with ServerClient(url, api_key=api_key, timeout_s=config.request_timeout_s) as client:
        checks, caps = await _server_checks(config, client)
        return client.url, checks, caps


async def _server_checks(
    config: GenerateConfig, client: ServerClient
) -> tuple[list[Check], Capabilities | None]:
    checks: list[Check] = []
    url = client.url
    status = await _wait_healthy(client, config.wait_for_servers_s)
    if status is None:
        checks.append(
            Check(
                "reachable",
                url,
                "fail",
                "connection refused or timed out: is the server running? "
                "(SGLang opens its port only after loading the weights; see wait_for_servers_s)",
            )
        )
        return checks, None
    if status != 200:
        checks.append(Check("healthy", url, "fail", f"/health answered {status} (still warming up?)"))
        return checks, None
    generating = await introspect.health(client, generate=True, timeout_s=60.0)
    if not generating.ok:
        checks.append(
            Check(
                "healthy",
                url,
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
    checks.append(Check("healthy", url, "ok", healthy_note))
    models = await introspect.served_models(client)
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
                f"serves {list(models.ids)}, not {config.model!r}: set model to the name /v1/models reports",
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
    if cap is not None and cap < config.concurrency_per_server:
        checks.append(
            Check(
                "batch cap",
                url,
                "info",
                f"runs {cap} at once; the other "
                f"{config.concurrency_per_server - cap} of concurrency_per_server queue there (keeps it full)",
            )
        )
    if config.canary:
        checks.append(await canary(client, config))
    return checks, caps


def describe_token_ids(caps: Capabilities) -> str:
    """Where this server's token ids come from, for preflight's engine row."""
    if caps.token_ids:
        return f"token ids from the server ({caps.token_ids})"
    return f"no token ids from {caps.engine}: validate re-tokenizes"


async def canary(client: ServerClient, config: GenerateConfig) -> Check:
    """One real request: with thinking on, reasoning and answer must both be non-empty."""
    truncated = 0
    for prompt in CANARY_PROMPTS:
        try:
            result = await retrying(
                lambda prompt=prompt: client.chat(
                    [{"role": "user", "content": prompt}],
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
            )
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
            )
        return Check(
            "canary",
            client.url,
            "ok",
            f"reasoning {len(result.reasoning_content or '')} chars, answer {len(result.content or '')} chars, "
            f"{result.completion_tokens} tokens in {result.latency_s:.1f} s",
        )
    return Check(
        "canary",
        client.url,
        "warn",
        f"all {truncated} canaries stopped at max_tokens={config.max_tokens} before answering: "
        "reasoning seen, answer not confirmed",
    )


# ----- the whole preflight ---------------------------------------------------------------------------------
async def preflight(config: GenerateConfig) -> Plan:
    """Run every check (servers concurrently, the prompt scan in a thread); raise PreflightError on any fail."""
    checks = check_environment(config)
    api_key = "EMPTY"
    if not any(c.check == "api key" and c.status == "fail" for c in checks):
        api_key = config.api_key() if config.api_key_env else "EMPTY"
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
        server_task = asyncio.gather(*(check_server(config, url, api_key) for url in config.servers))
        scan_task = asyncio.to_thread(scan_prompts, config, store.done_ids if store else set())
        cap_task = asyncio.ensure_future(load_length_cap(config))
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
        plans = []
        for url, server_checks, caps in servers:
            checks.extend(server_checks)
            if caps is not None:
                plans.append(ServerPlan(url, caps))
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
        servers=plans,
        checks=checks,
        scan=scan,
        fingerprint=config.fingerprint(),
        clock=clock,
        store=store,
        length_cap=length_cap,
    )


async def load_length_cap(config: GenerateConfig) -> tuple[LengthCap | None, Check | None]:
    """The trainer's max_length as a cap on each turn, with the tokenizer that counts prompts (None: no cap)."""
    if not config.length_cap:
        return None, None
    try:
        counter = await asyncio.to_thread(tokenizer_counter, config.tokenizer)
    except ValueError as exc:
        return None, Check("tokenizer", config.tokenizer, "fail", str(exc))
    return LengthCap(config.length_cap, counter, config.tokenizer), None


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
