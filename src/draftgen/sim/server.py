"""One simulated SGLang server: the scheduler core, its app wiring and the process entry point.

SGLang's HTTP surfaces (docs/engines.md) live one per module (``openai_api``, ``native_api``, ``admin_api``)
and share the core below: ground truth, start-up, request planning and injected admission faults.

Run as a process: ``python -m draftgen.sim.server --port P [--profile NAME] [--speed X] [--fault K=V ...]``.
Extra, non-SGLang endpoints live under ``/sim/`` (ground truth and the profile's capacity curve).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from draftgen.defaults import MODEL
from draftgen.sglang_rules.adaptive import CANDIDATE_STEPS as ADAPTIVE_CANDIDATE_STEPS
from draftgen.sim import categories, temperature
from draftgen.sim.admin_api import AdminApi
from draftgen.sim.defaults import (
    EXIT_CRASH,
    EXIT_PORT_IN_USE,
    EXIT_STARTUP_FAILED,
    PARENT_PID_ENV,
)
from draftgen.sim.engine import Engine, SimRequest
from draftgen.sim.faults import Faults, parse_faults
from draftgen.sim.metrics import ServerMetrics
from draftgen.sim.native_api import NativeApi
from draftgen.sim.openai_api import OpenAIApi
from draftgen.sim.prefix_cache import (
    CACHED_STATES_PER_RUNNING_REQUEST,
    CacheSettings,
    PrefixCache,
    add_cache_flags,
    cache_settings,
)
from draftgen.sim.profiles import Profile, get_profile
from draftgen.sim.speculative import (
    StartupError,
    add_sglang_flags,
    apply_settings,
    mean_accept_length,
    sim_settings,
    startup_warnings,
)
from draftgen.sim.textgen import CompletionPlan, plan_acceptance_by_position, plan_completion
from draftgen.sim.tokenizer import SimTokenizer, TokenizerFolderError, default_tokenizer
from draftgen.sim.toolcalls import SimCall, diverged, parses, planned_calls
from draftgen.sim.wire import BadRequest, error_response

WARMUP_MAX_TOKENS = 8
SHUTDOWN_GRACE_S = 0.5  # on SIGTERM, in-flight requests get about this long before their connections drop


@dataclass(frozen=True)
class ServerConfig:
    port: int
    host: str = "127.0.0.1"
    model: str = MODEL
    profile: Profile = field(default_factory=lambda: get_profile("b200-mtp"))
    speed: float = 1.0
    faults: Faults = field(default_factory=Faults)
    truth_path: Path | None = None
    seed: int = 0  # salts fault draws (which request fails), never the completion text
    max_running_requests: int | None = None  # overrides the profile, like --max-running-requests
    tokenizer: Path | None = (
        None  # a Hugging Face tokenizer folder; None: the tiny Qwen3-format one, built here
    )
    # --disable-radix-cache, --enable-cache-report
    cache: CacheSettings = field(default_factory=CacheSettings)
    # --tool-call-parser: None (SGLang's default) leaves tool calls as text in content (draftgen.sim.toolcalls)
    tool_call_parser: str | None = None


class SimServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        profile = config.profile
        if config.max_running_requests:
            profile = profile.with_overrides(max_running_requests=config.max_running_requests)
        self.profile = profile
        self.faults = config.faults
        prefix_cache = (
            None
            if config.cache.disable_radix_cache
            else PrefixCache(CACHED_STATES_PER_RUNNING_REQUEST * profile.max_running_requests)
        )
        self.engine = Engine(
            profile,
            speed=config.speed,
            slow=config.faults.slow,
            on_finish=self._on_finish,
            prefix_cache=prefix_cache,
        )
        self.metrics = ServerMetrics(self.engine, config.model)
        self.accept_probs = profile.position_probabilities()
        self.tokenizer = SimTokenizer.load(config.tokenizer or default_tokenizer())
        self.fault_rng = random.Random(config.seed ^ config.port)
        self.healthy = False
        self.started = time.time()
        self.requests_received = 0
        self.truth: list[dict] = []
        self._truth_file = open(config.truth_path, "a", buffering=1) if config.truth_path else None
        self._tasks: set[asyncio.Task] = set()

    # ----- ground truth -------------------------------------------------------------------------------
    def _record(self, record: dict) -> None:
        record["server"] = f"http://{self.config.host}:{self.config.port}"
        self.truth.append(record)
        if self._truth_file:
            self._truth_file.write(json.dumps(record) + "\n")

    def _on_finish(self, request: SimRequest) -> None:
        if request.kind != "health":  # SGLang's health probe carries log_metrics=False
            self.metrics.observe_finished(request)
        self._record(
            {
                "rid": request.rid,
                "kind": request.kind,
                "outcome": request.outcome,
                "finish_type": request.finish_type,
                "stream": request.stream,
                "arrival": request.arrival,
                "admitted": request.admitted,
                "first_token": request.first_token,
                "finished": request.finished,
                "prompt_tokens": request.prompt_tokens,
                "cached_tokens": request.cached_tokens,
                "max_tokens": request.max_tokens,
                "completion_tokens": request.emitted,
                "verify_steps": request.verify_steps,
                "seed": request.seed,
                "noncanonical": request.plan.noncanonical,
                # what it would have generated, left alone (a request ended early generated completion_tokens)
                "planned_tokens": request.plan.completion_tokens,
                "loop_start": request.plan.loop_start,
                "loop_period": request.plan.loop_period,
                "category": request.category,
                "temperature": request.temperature,
                "accept_expected": request.accept_expected,
                "emit_times": request.emit_times if request.stream else None,
                "emit_counts": request.emit_counts if request.stream else None,
            }
        )

    def _record_rejected(self, rid: str, kind: str, outcome: str, status: int) -> None:
        now = time.time()
        self._record(
            {
                "rid": rid,
                "kind": kind,
                "outcome": outcome,
                "http_status": status,
                "arrival": now,
                "finished": now,
                "completion_tokens": 0,
                "verify_steps": 0,
            }
        )

    # ----- lifecycle ----------------------------------------------------------------------------------
    async def start_background(self) -> None:
        self._spawn(self.engine.run())
        self._spawn(self._warm_up())

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm_up(self) -> None:
        await asyncio.sleep(self.faults.startup_delay)
        warm = self.new_request(
            "warmup-" + uuid.uuid4().hex[:8],
            "warmup",
            prompt_tokens=4,
            seed=0,
            max_tokens=WARMUP_MAX_TOKENS,
            enable_thinking=True,
            ignore_eos=True,
            stream=False,
        )
        self.engine.submit(warm)
        await warm.done.wait()
        self.engine.mark_ready()
        self.healthy = True
        crash_seconds = self.faults.crash_after_seconds()
        if crash_seconds is not None:
            asyncio.get_running_loop().call_later(crash_seconds, self._crash)

    def _crash(self) -> None:
        if self._truth_file:
            self._truth_file.flush()
        sys.stderr.write(f"sim server on port {self.config.port}: injected crash\n")
        sys.stderr.flush()
        os._exit(EXIT_CRASH)

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._truth_file:
            self._truth_file.close()
            self._truth_file = None

    # ----- request planning ---------------------------------------------------------------------------
    def new_request(
        self,
        rid: str,
        kind: str,
        *,
        prompt_tokens: int,
        seed: int,
        max_tokens: int,
        enable_thinking: bool,
        ignore_eos: bool,
        stream: bool,
        empty_answer: bool = False,
        noncanonical: bool = False,
        category: str | None = None,
        sampling_temperature: float | None = None,
        prompt_ids: tuple[int, ...] | None = None,
        prefill_only: bool = False,
        calls: tuple[SimCall, ...] = (),
    ) -> SimRequest:
        plan: CompletionPlan = plan_completion(
            seed,
            self.tokenizer,
            max_tokens=max_tokens,
            enable_thinking=enable_thinking,
            reasoning_median=self.profile.reasoning_median,
            answer_median=self.profile.answer_median,
            sigma=self.profile.length_sigma,
            empty_answer=empty_answer,
            ignore_eos=ignore_eos,
            noncanonical=noncanonical,
            loop_rate=self.faults.loop_rate if kind in ("chat", "generate") else 0.0,
            loop_max_period=self.faults.loop_max_period,
            calls=calls,
            answer_before_calls=bool(seed & 1),
        )
        total = plan.completion_tokens
        rng = None
        expected = None  # the request's expected acceptance length (ground truth), where the model fixes one
        if self.profile.instant:
            draws = [total]
        elif self.profile.adaptive_steps is not None:
            draws, rng = [], random.Random(seed)  # drawn step by step, at the steps in force then
        else:
            factor = categories.factor_of(self.profile.category_accept, category) * temperature.factor_at(
                self.profile.temperature_accept, sampling_temperature
            )
            probs = categories.scaled(self.accept_probs, factor)
            draws = plan_acceptance_by_position(seed, total, probs, self.profile.draft_tokens)
            if self.profile.speculative:
                expected = mean_accept_length(probs[: self.profile.draft_tokens - 1])
        return SimRequest(
            rid=rid,
            kind=kind,
            prompt_tokens=prompt_tokens,
            plan=plan,
            draws=draws,
            stream=stream,
            seed=seed,
            rng=rng,
            category=category,
            temperature=sampling_temperature,
            accept_expected=expected,
            max_tokens=max_tokens,
            prompt_ids=prompt_ids,
            prefill_only=prefill_only,
        )

    def max_tokens(self, value: object, prompt_tokens: int, name: str) -> int:
        room = max(1, self.profile.context_length - prompt_tokens)
        if value is None:
            return room
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"{name} must be a positive integer, got {value!r}")
        if prompt_tokens + value > self.profile.context_length:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.profile.context_length} tokens. You requested a total of {prompt_tokens + value} tokens: "
                f"{prompt_tokens} tokens from the input messages and {value} tokens for the completion."
            )
        return value

    def admission_fault(self, rid: str, kind: str) -> web.Response | None:
        """Injected failures decided at arrival. Returns the response to send, or None to proceed."""
        self.requests_received += 1
        crash_n = self.faults.crash_after_requests()
        if crash_n is not None and self.requests_received >= crash_n:
            self._crash()
        if self.faults.wedge_after and self.requests_received >= self.faults.wedge_after:
            self.engine.wedge()  # this request and every other one now hangs
        if self.faults.overload and len(self.engine.waiting) >= self.faults.overload:
            status = self.faults.overload_status
            self._record_rejected(rid, kind, "overloaded", status)
            response = error_response(
                status,
                "The server is overloaded: too many queued requests.",
                "TooManyRequests" if status == 429 else "ServiceUnavailable",
            )
            return response
        if self.faults.error_rate and self.fault_rng.random() < self.faults.error_rate:
            self._record_rejected(rid, kind, "error_500", 500)
            return error_response(
                500, "Internal server error (injected by draftgen sim).", "InternalServerError"
            )
        return None

    async def accept(
        self, http: web.Request, parse: Callable[[object, Mapping[str, str]], dict], kind: str
    ) -> tuple[dict, SimRequest] | web.Response:
        """A generation request's arrival, shared by ``/generate`` and ``/v1/chat/completions``: reads the JSON
        body, ``parse`` turns it (and the request's headers) into the request's fields (``rid``, ``prompt_tokens``,
        ``seed``, ``max_tokens``,
        ``thinking``, ``ignore_eos``, ``stream``) or raises BadRequest, then the injected arrival faults, then it
        is queued. Returns the parsed fields and the queued request, or the response to send instead."""
        parsed = await self.arrive(http, parse, kind)
        if isinstance(parsed, web.Response):
            return parsed
        return parsed, self.queue(parsed, kind)

    async def arrive(
        self, http: web.Request, parse: Callable[[object, Mapping[str, str]], dict], kind: str
    ) -> dict | web.Response:
        """``accept`` up to the queue: the parsed fields, or the response to send instead."""
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "Request body is not valid JSON.", "BadRequestError")
        try:
            parsed = parse(body, http.headers)
        except BadRequest as exc:
            return error_response(400, str(exc), "BadRequestError")
        rid = parsed["rid"]
        refused = self.admission_fault(rid, kind)
        if refused is not None:
            return refused
        if self.draw(self.faults.hang_rate):
            return await self.hang(rid, kind)
        return parsed

    def queue(
        self,
        parsed: dict,
        kind: str,
        *,
        rid: str | None = None,
        seed: int | None = None,
        prefill_only: bool = False,
    ) -> SimRequest:
        """Plan the parsed request (under another ``rid`` or ``seed`` when given: one of ``n``'s copies) and
        queue it; the injected per-request faults are drawn here (a prefill-only request gets none)."""
        ids = parsed.get("prompt_ids")
        request = self.new_request(
            rid or parsed["rid"],
            kind,
            prompt_tokens=parsed["prompt_tokens"],
            seed=parsed["seed"] if seed is None else seed,
            max_tokens=1 if prefill_only else parsed["max_tokens"],
            enable_thinking=parsed["thinking"],
            ignore_eos=prefill_only or parsed["ignore_eos"],
            stream=parsed["stream"],
            empty_answer=not prefill_only and self.draw(self.faults.empty_answer_rate),
            noncanonical=not prefill_only and self.draw(self.faults.noncanonical_ids),
            category=parsed.get("category"),
            sampling_temperature=parsed.get("temperature"),
            prompt_ids=None if ids is None else tuple(ids),
            prefill_only=prefill_only,
            calls=() if prefill_only else parsed.get("calls", ()),
        )
        self.engine.submit(request)
        if not prefill_only and self.draw(self.faults.abort_rate):
            self.engine.abort(request, "aborted")
        return request

    def draw(self, rate: float) -> bool:
        return bool(rate) and self.fault_rng.random() < rate

    @property
    def parses_tool_calls(self) -> bool:
        """Started with a tool-call parser that reads the simulated model's calls (else they stay text)."""
        return parses(self.config.tool_call_parser)

    def plan_calls(self, tools: list[dict], messages: list[dict], seed: int) -> tuple[SimCall, ...]:
        """The tool calls a request's answer ends in: drawn from its seed (``tool_call_rate``, then
        ``tool_divergence_rate``), so the same prompt calls the same way on every server and attempt."""
        if not tools:
            return ()
        draws = random.Random(seed ^ 0x7001)
        if draws.random() >= self.faults.tool_call_rate:
            return ()
        calls = planned_calls(tools, messages)
        return diverged(calls) if draws.random() < self.faults.tool_divergence_rate else calls

    async def hang(self, rid: str, kind: str) -> web.Response:
        try:
            await asyncio.Event().wait()
        finally:
            self._record_rejected(rid, kind, "hung", 0)
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def event_stream(self, http: web.Request, request: SimRequest) -> AsyncIterator[web.StreamResponse]:
        """An SSE response for ``request``: the caller writes its events inside; ``data: [DONE]`` (unless the
        omit_done fault) and the end follow. A client that goes away aborts the request."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(http)
            yield response
            if not self.faults.omit_done:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(request, "client_disconnected")
            raise

    async def wait_for(self, *requests: SimRequest) -> None:
        """Until every one of ``requests`` is done; a client that goes away aborts them all."""
        try:
            for request in requests:
                await request.done.wait()
        except asyncio.CancelledError:
            for request in requests:
                self.engine.abort(request, "client_disconnected")
            raise

    # ----- spec decoding details --------------------------------------------------------------------------
    def spec_fields(self, request: SimRequest, shape: str) -> dict:
        verify = request.verify_steps
        tokens = request.emitted
        accepted_drafts = max(0, tokens - verify)
        if request.rng is not None:  # adaptive: the steps changed from verify to verify
            proposed = request.proposed_drafts
            width = max(ADAPTIVE_CANDIDATE_STEPS) + 1
        else:
            proposed = verify * max(0, self.profile.draft_tokens - 1)
            width = self.profile.draft_tokens
        histogram = [0] * width
        for gained in request.draws[:verify]:
            histogram[min(gained, width) - 1] += 1
        fields: dict[str, object] = {"spec_verify_ct": verify}
        if shape == "0.5.4":
            return fields
        fields["spec_accept_length"] = tokens / verify if verify else None
        fields["spec_accept_rate"] = accepted_drafts / proposed if proposed else None
        if shape == "0.5.9":
            fields["spec_accept_histogram"] = histogram
            fields["spec_accept_token_num"] = accepted_drafts
            fields["spec_draft_token_num"] = proposed
        else:
            fields["spec_num_correct_drafts"] = accepted_drafts
            fields["spec_num_proposed_drafts"] = proposed
            fields["spec_correct_drafts_histogram"] = histogram  # verify steps by drafts accepted: 0, 1, ...
        return fields

    def spec_tokens_details(self, request: SimRequest) -> dict:
        """0.5.23's ``sglext.spec_tokens_details``: meta_info's fields plus the capped-draft ones, which stay
        zero and empty without a draft-length cap (as real SGLang sends them for NGRAM and EAGLE)."""
        return {
            **self.spec_fields(request, "0.5.23"),
            "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0,
            "spec_cap_lens_histogram": [],
        }


# ----- process entry point -----------------------------------------------------------------------------------
def build_app(server: SimServer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    for surface in (OpenAIApi(server), NativeApi(server), AdminApi(server)):
        app.add_routes(surface.routes())
    return app


async def serve(config: ServerConfig, stop: asyncio.Event) -> None:
    """Run one server until ``stop`` is set. Binding errors propagate (OSError)."""
    await asyncio.sleep(config.faults.load_delay)  # weights loading: the port stays closed
    server = SimServer(config)
    runner = web.AppRunner(
        build_app(server), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True, backlog=1024)
    try:
        await site.start()
        await server.start_background()
        await stop.wait()
    finally:
        await server.shutdown()
        await runner.cleanup()


def _set_parent_death_signal() -> None:
    """Die with the parent (Linux): a fleet killed with SIGKILL leaves no orphan servers behind.

    The signal is armed only once this process runs; a parent killed during the start-up before that would be
    missed, so a parent that is already gone (different parent pid) ends the server here.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        sys.exit(0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m draftgen.sim.server", description="One simulated SGLang server."
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--profile", default="b200-mtp")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--truth", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="as SGLang's: a parser name (qwen3_coder reads the simulated model's calls); default none: calls "
        "stay text in content",
    )
    add_sglang_flags(parser)
    add_cache_flags(parser)
    parser.add_argument("--die-with-parent", action="store_true")
    return parser.parse_args(argv)


def _refuse_start(error: StartupError, faults: Faults, port: int) -> int:
    """Exit as SGLang does when its settings cannot run: flag errors at once, memory after the weights load."""
    if error.after_load:
        time.sleep(faults.load_delay)
    for line in error.lines:
        print(line, file=sys.stderr)
    print(f"sim server on port {port}: start-up failed, exiting", file=sys.stderr)
    return EXIT_STARTUP_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.die_with_parent:
        _set_parent_death_signal()
    try:
        faults = parse_faults(args.fault)
        base = get_profile(args.profile)
        if args.speed <= 0:
            raise ValueError(f"--speed {args.speed} must be > 0")
    except ValueError as exc:
        print(f"draftgen sim: error: {exc}", file=sys.stderr)
        return 2
    flags = sim_settings(args)
    try:
        for line in startup_warnings(base, flags):
            print(line, file=sys.stderr)
        profile = apply_settings(base, flags)
    except StartupError as error:
        return _refuse_start(error, faults, args.port)
    config = ServerConfig(
        port=args.port,
        host=args.host,
        model=args.model,
        profile=profile,
        speed=args.speed,
        faults=faults,
        truth_path=args.truth,
        seed=args.seed,
        tokenizer=args.tokenizer,
        cache=cache_settings(args),
        tool_call_parser=args.tool_call_parser or None,
    )
    try:
        if args.tokenizer is not None:
            SimTokenizer.load(args.tokenizer)  # a bad folder fails here, in one line, before the port opens
    except TokenizerFolderError as exc:
        print(f"draftgen sim: error: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, stop)

    try:
        asyncio.run(run())
    except OSError as exc:
        print(
            f"draftgen sim: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return EXIT_PORT_IN_USE
    return 0


if __name__ == "__main__":
    sys.exit(main())
