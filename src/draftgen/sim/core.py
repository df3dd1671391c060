"""One simulated SGLang server's core: what its HTTP surfaces share.

Ground truth (``draftgen.sim.truth``), start-up and the warm-up, request planning (``draftgen.sim.planner``),
arrival with the injected admission faults, and the streams and speculative details the surfaces send. The surfaces
(``openai_api``, ``native_api``, ``admin_api``; docs/engines.md) hold a ``SimServer`` each; ``draftgen.sim.server``
wires them into an app and runs it as a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from draftgen.defaults import MODEL
from draftgen.sglang_rules.adaptive import CANDIDATE_STEPS as ADAPTIVE_CANDIDATE_STEPS
from draftgen.sim.defaults import EXIT_CRASH
from draftgen.sim.engine import Engine, SimRequest
from draftgen.sim.faults import Faults
from draftgen.sim.metrics import ServerMetrics
from draftgen.sim.planner import RequestPlanner
from draftgen.sim.prefix_cache import CACHED_STATES_PER_RUNNING_REQUEST, CacheSettings, PrefixCache
from draftgen.sim.profiles import Profile, get_profile
from draftgen.sim.tokenizer import SimTokenizer, default_tokenizer
from draftgen.sim.toolcalls import SimCall, diverged, parses, planned_calls
from draftgen.sim.truth import GroundTruth
from draftgen.sim.wire import BadRequest, error_response

WARMUP_MAX_TOKENS = 8


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
        None  # a Hugging Face tokenizer folder; None: the model path's, else the tiny Qwen3-format one
    )
    # SGLang's --model-path: what /server_info and /model_info report the model (and tokenizer) loaded from; a
    # local folder holding a tokenizer is spoken unless ``tokenizer`` says otherwise. None: ``model``, as SGLang's
    # served name is its model path unless --served-model-name says otherwise.
    model_path: str | None = None
    # --disable-radix-cache, --enable-cache-report
    cache: CacheSettings = field(default_factory=CacheSettings)
    # --tool-call-parser: None (SGLang's default) leaves tool calls as text in content (draftgen.sim.toolcalls)
    tool_call_parser: str | None = None


def model_tokenizer(config: ServerConfig) -> Path | None:
    """The model path's folder when it holds a tokenizer (SGLang loads its tokenizer from there): None otherwise,
    a Hugging Face id or a path this machine lacks included."""
    folder = Path(config.model_path or config.model).expanduser()
    return folder if (folder / "tokenizer.json").is_file() else None


class SimServer:
    """One server's state and the rules its HTTP surfaces share (one per process)."""

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
        self.tokenizer = SimTokenizer.load(config.tokenizer or model_tokenizer(config) or default_tokenizer())
        self.planner = RequestPlanner(profile, self.tokenizer, config.faults)
        self.fault_rng = random.Random(config.seed ^ config.port)
        self.healthy = False
        self.started = time.time()
        self.requests_received = 0
        self.truth = GroundTruth(f"http://{config.host}:{config.port}", config.truth_path)
        self._tasks: set[asyncio.Task] = set()

    def _on_finish(self, request: SimRequest) -> None:
        if request.kind != "health":  # SGLang's health probe carries log_metrics=False
            self.metrics.observe_finished(request)
        self.truth.finished(request)

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
        warm = self.planner.new_request(
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
        self.truth.flush()
        sys.stderr.write(f"sim server on port {self.config.port}: injected crash\n")
        sys.stderr.flush()
        os._exit(EXIT_CRASH)

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.truth.close()

    # ----- a request's arrival ------------------------------------------------------------------------
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
            self.truth.rejected(rid, kind, "overloaded", status)
            response = error_response(
                status,
                "The server is overloaded: too many queued requests.",
                "TooManyRequests" if status == 429 else "ServiceUnavailable",
            )
            return response
        if self.faults.error_rate and self.fault_rng.random() < self.faults.error_rate:
            self.truth.rejected(rid, kind, "error_500", 500)
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
        request = self.planner.new_request(
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
            self.truth.rejected(rid, kind, "hung", 0)
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
        # SGLang 0.5.23 grows the list as drafts are accepted: as long as the most drafts a step accepted + 1
        if shape == "0.5.23":
            while histogram and histogram[-1] == 0:
                histogram.pop()
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
