"""One simulated SGLang server: the HTTP surface of sglang-protocol.md over the simulated scheduler.

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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiohttp import web

from draftgen.sim.defaults import DEFAULT_MODEL, EXIT_CRASH, EXIT_PORT_IN_USE, PARENT_PID_ENV
from draftgen.sim.engine import Engine, SimRequest
from draftgen.sim.faults import Faults, parse_faults
from draftgen.sim.metrics import ServerMetrics
from draftgen.sim.profiles import Profile, get_profile
from draftgen.sim.textgen import (
    EOS_TOKEN_ID,
    THINK_END,
    CompletionPlan,
    acceptance_probability,
    count_text_tokens,
    plan_acceptance,
    plan_completion,
    render_chat_prompt,
    request_seed,
)

# SGLang's /health_generate gives up after 20 s without scheduler output (simulated seconds here).
HEALTH_GENERATE_TIMEOUT_S = 20.0
HEALTH_GENERATE_POLL_S = 0.05
WARMUP_MAX_TOKENS = 8
SHUTDOWN_GRACE_S = 0.5  # on SIGTERM, in-flight requests get about this long before their connections drop


@dataclass(frozen=True)
class ServerConfig:
    port: int
    host: str = "127.0.0.1"
    model: str = DEFAULT_MODEL
    profile: Profile = field(default_factory=lambda: get_profile("b200-mtp"))
    speed: float = 1.0
    faults: Faults = field(default_factory=Faults)
    truth_path: Path | None = None
    seed: int = 0  # salts fault draws (which request fails), never the completion text
    max_running_requests: int | None = None  # overrides the profile, like --max-running-requests


class BadRequest(Exception):
    pass


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


def _sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class SimServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        profile = config.profile
        if config.max_running_requests:
            profile = profile.with_overrides(max_running_requests=config.max_running_requests)
        self.profile = profile
        self.faults = config.faults
        self.engine = Engine(profile, speed=config.speed, slow=config.faults.slow, on_finish=self._on_finish)
        self.metrics = ServerMetrics(self.engine, config.model)
        self.accept_p = acceptance_probability(profile.accept_mean, profile.draft_tokens)
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
                "completion_tokens": request.emitted,
                "verify_steps": request.verify_steps,
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
        warm = self._new_request(
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
    def _new_request(
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
    ) -> SimRequest:
        plan: CompletionPlan = plan_completion(
            seed,
            max_tokens=max_tokens,
            enable_thinking=enable_thinking,
            reasoning_median=self.profile.reasoning_median,
            answer_median=self.profile.answer_median,
            sigma=self.profile.length_sigma,
            empty_answer=empty_answer,
            ignore_eos=ignore_eos,
        )
        total = plan.completion_tokens
        if self.profile.instant:
            draws = [total]
        else:
            draws = plan_acceptance(
                seed, total, self.accept_p, self.profile.draft_tokens, self.profile.draft_tokens
            )
        return SimRequest(
            rid=rid, kind=kind, prompt_tokens=prompt_tokens, plan=plan, draws=draws, stream=stream
        )

    def _max_tokens(self, value: object, prompt_tokens: int, name: str) -> int:
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

    def _admission_fault(self, rid: str, kind: str) -> web.Response | None:
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
            response = _error(
                status,
                "The server is overloaded: too many queued requests.",
                "TooManyRequests" if status == 429 else "ServiceUnavailable",
            )
            return response
        if self.faults.error_rate and self.fault_rng.random() < self.faults.error_rate:
            self._record_rejected(rid, kind, "error_500", 500)
            return _error(500, "Internal server error (injected by draftgen sim).", "InternalServerError")
        return None

    def _draw(self, rate: float) -> bool:
        return bool(rate) and self.fault_rng.random() < rate

    async def _hang(self, rid: str, kind: str) -> web.Response:
        try:
            await asyncio.Event().wait()
        finally:
            self._record_rejected(rid, kind, "hung", 0)
        raise AssertionError("unreachable")

    async def _wait(self, request: SimRequest) -> None:
        try:
            await request.done.wait()
        except asyncio.CancelledError:
            self.engine.abort(request, "client_disconnected")
            raise

    # ----- spec decoding details --------------------------------------------------------------------------
    def _spec_fields(self, request: SimRequest, shape: str) -> dict:
        verify = request.verify_steps
        tokens = request.emitted
        accepted_drafts = max(0, tokens - verify)
        proposed = verify * max(0, self.profile.draft_tokens - 1)
        histogram = [0] * self.profile.draft_tokens
        for gained in request.draws[:verify]:
            histogram[min(gained, self.profile.draft_tokens) - 1] += 1
        fields: dict[str, object] = {"spec_verify_ct": verify}
        if shape == "0.5.4":
            return fields
        fields["spec_accept_length"] = tokens / verify if verify else None
        fields["spec_accept_rate"] = accepted_drafts / proposed if proposed else None
        fields["spec_accept_histogram"] = histogram
        if shape == "0.5.9":
            fields["spec_accept_token_num"] = accepted_drafts
            fields["spec_draft_token_num"] = proposed
        else:
            fields["spec_num_correct_drafts"] = accepted_drafts
            fields["spec_num_proposed_drafts"] = proposed
        return fields

    # ----- routes -----------------------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/health_generate", self.health_generate),
            web.get("/v1/models", self.models),
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            web.get("/metrics", self.prometheus),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/generate", self.generate),
            web.get("/sim/truth", self.sim_truth),
            web.get("/sim/info", self.sim_info),
        ]

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def health_generate(self, _: web.Request) -> web.Response:
        if not self.healthy:
            return web.Response(status=503)
        probe = self._new_request(
            "health-" + uuid.uuid4().hex[:8],
            "health",
            prompt_tokens=4,
            seed=1,
            max_tokens=1,
            enable_thinking=False,
            ignore_eos=True,
            stream=False,
        )
        # Like SGLang: any output from the scheduler after the call began proves it alive (a busy server's
        # probe may sit in the queue); silence for HEALTH_GENERATE_TIMEOUT_S means 503.
        began = time.time()
        self.engine.submit(probe)
        deadline = time.monotonic() + HEALTH_GENERATE_TIMEOUT_S / self.config.speed  # on the simulated clock
        while not probe.done.is_set() and self.engine.last_step_at <= began:
            if time.monotonic() >= deadline:
                self.engine.abort(probe, "health_timeout")
                return web.Response(status=503)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probe.done.wait(), HEALTH_GENERATE_POLL_S)
        self.engine.abort(probe, "health_answered")  # no-op once it finished; out of the queue otherwise
        return web.Response(status=200)

    async def models(self, _: web.Request) -> web.Response:
        model = self.config.model
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": int(self.started),
                        "owned_by": "sglang",
                        "root": model,
                        "parent": None,
                        "max_model_len": self.profile.context_length,
                    }
                ],
            }
        )

    async def server_info(self, _: web.Request) -> web.Response:
        stats = self.engine.stats
        state: dict[str, object] = {
            "last_gen_throughput": stats.interval_throughput,
            "memory_usage": {
                "weight": 51.2,
                "kvcache": 96.0,
                "token_capacity": self.profile.kv_capacity_tokens,
            },
            "effective_max_running_requests_per_dp": self.profile.max_running_requests,
        }
        if stats.avg_spec_accept_length is not None:
            state["avg_spec_accept_length"] = stats.avg_spec_accept_length
        spec = self.profile.speculative
        return web.json_response(
            {
                "model_path": self.config.model,
                "served_model_name": self.config.model,
                "host": self.config.host,
                "port": self.config.port,
                "tp_size": 1,
                "dp_size": 1,
                "max_running_requests": self.profile.max_running_requests,
                "context_length": self.profile.context_length,
                "reasoning_parser": "qwen3",
                "enable_metrics": True,
                "decode_log_interval": 40,
                "speculative_algorithm": "NEXTN" if spec else None,
                "speculative_num_steps": self.profile.draft_tokens - 1 if spec else None,
                "speculative_eagle_topk": 1 if spec else None,
                "speculative_num_draft_tokens": self.profile.draft_tokens if spec else None,
                "version": self.faults.sglang_version,
                "internal_states": [state],
            }
        )

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def sim_truth(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", "0"))
        return web.json_response({"records": self.truth[since:], "next": len(self.truth)})

    async def sim_info(self, _: web.Request) -> web.Response:
        profile = self.profile
        capacity = {
            str(b): profile.tokens_per_second(b) * self.config.speed / self.faults.slow
            for b in (1, 8, 16, 32, 48, 64, 96, 128)
            if not profile.instant
        }
        return web.json_response(
            {
                "profile": asdict(profile),
                "speed": self.config.speed,
                "faults": asdict(self.faults),
                "capacity_tok_s_by_batch": capacity,
                "started": self.started,
                "healthy": self.healthy,
            }
        )

    # ----- OpenAI chat completions -----------------------------------------------------------------------
    async def chat_completions(self, http: web.Request) -> web.StreamResponse:
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "Request body is not valid JSON.", "BadRequestError")
        try:
            parsed = self._parse_chat(body)
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        rid = parsed["rid"]
        refused = self._admission_fault(rid, "chat")
        if refused is not None:
            return refused
        if self._draw(self.faults.hang_rate):
            return await self._hang(rid, "chat")
        request = self._new_request(
            rid,
            "chat",
            prompt_tokens=parsed["prompt_tokens"],
            seed=parsed["seed"],
            max_tokens=parsed["max_tokens"],
            enable_thinking=parsed["thinking"],
            ignore_eos=parsed["ignore_eos"],
            stream=parsed["stream"],
            empty_answer=self._draw(self.faults.empty_answer_rate),
        )
        self.engine.submit(request)
        if self._draw(self.faults.abort_rate):
            self.engine.abort(request, "aborted")
        if parsed["stream"]:
            return await self._stream_chat(http, request, parsed)
        await self._wait(request)
        return web.json_response(self._chat_body(request, parsed))

    def _parse_chat(self, body: object) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise BadRequest(f"messages[{index}] must be an object with a 'role'.")
        n = body.get("n") or 1
        if n != 1:
            raise BadRequest("draftgen sim supports n=1 only.")
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = bool(kwargs.get("enable_thinking", True)) if isinstance(kwargs, dict) else True
        prompt_tokens = count_text_tokens(render_chat_prompt(messages, thinking))
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = self._max_tokens(body.get(max_key), prompt_tokens, max_key)
        stream_options = body.get("stream_options") or {}
        seed_payload = {"messages": messages, "thinking": thinking}
        return {
            "rid": str(body.get("rid") or uuid.uuid4().hex),
            "model": body.get("model") or self.config.model,
            "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "thinking": thinking,
            "separate": body.get("separate_reasoning", True) is not False,
            "stream": bool(body.get("stream")),
            "include_usage": bool(stream_options.get("include_usage"))
            if isinstance(stream_options, dict)
            else False,
            "spec_details": bool(body.get("return_spec_tokens_details")),
            "seed": request_seed(seed_payload, body.get("seed")),
            "ignore_eos": bool(body.get("ignore_eos")),
        }

    def _texts(self, request: SimRequest, parsed: dict, start: int, end: int) -> tuple[str | None, str]:
        """(reasoning_content, content) of shown tokens[start:end], as SGLang's qwen3 parser splits them."""
        reasoning, answer = request.plan.split_range(start, end, separate=parsed["separate"])
        if not parsed["thinking"] or not parsed["separate"]:
            return None, answer
        return reasoning, answer

    def _usage(self, request: SimRequest) -> dict:
        return {
            "prompt_tokens": request.prompt_tokens,
            "completion_tokens": request.emitted,
            "total_tokens": request.prompt_tokens + request.emitted,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    def _finish_reason(self, request: SimRequest) -> tuple[str, int | None]:
        if request.outcome != "ok":
            return "abort", None
        if request.plan.finish_type == "stop":
            return "stop", EOS_TOKEN_ID
        return "length", None

    def _sglext(self, request: SimRequest, parsed: dict) -> dict | None:
        if not (
            parsed["spec_details"] and self.profile.speculative and self.faults.sglang_version == "0.5.23"
        ):
            return None
        if request.outcome != "ok":
            return None
        return {"spec_tokens_details": self._spec_fields(request, "0.5.23")}

    def _chat_body(self, request: SimRequest, parsed: dict) -> dict:
        reasoning, content = self._texts(request, parsed, 0, request.shown_tokens)
        finish_reason, matched = self._finish_reason(request)
        body: dict[str, object] = {
            "id": request.rid,
            "object": "chat.completion",
            "created": int(request.arrival),
            "model": parsed["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content or None,
                        "reasoning_content": reasoning or None,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "matched_stop": matched,
                }
            ],
            "usage": None if self.faults.omit_usage else self._usage(request),
            "metadata": {"weight_version": "default"},
        }
        sglext = self._sglext(request, parsed)
        if sglext is not None:
            body["sglext"] = sglext
        return body

    def _chunk(
        self, request: SimRequest, parsed: dict, delta: dict, finish: tuple[str | None, int | None]
    ) -> dict:
        return {
            "id": request.rid,
            "object": "chat.completion.chunk",
            "created": int(request.arrival),
            "model": parsed["model"],
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish[0],
                    "matched_stop": finish[1],
                }
            ],
            "usage": None,
        }

    async def _stream_chat(self, http: web.Request, request: SimRequest, parsed: dict) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(http)
            await response.write(
                _sse(self._chunk(request, parsed, {"role": "assistant", "content": ""}, (None, None)))
            )
            sent = 0
            while True:
                await request.progress.wait()
                request.progress.clear()
                upto = request.shown_tokens
                if upto > sent:
                    reasoning, content = self._texts(request, parsed, sent, upto)
                    delta: dict[str, object] = {}
                    if reasoning:
                        delta["reasoning_content"] = reasoning
                    if content:
                        delta["content"] = content
                    if delta:
                        delta.setdefault("content", None)
                        await response.write(_sse(self._chunk(request, parsed, delta, (None, None))))
                    sent = upto
                if request.done.is_set():
                    break
            await response.write(_sse(self._chunk(request, parsed, {}, self._finish_reason(request))))
            if parsed["include_usage"] and not self.faults.omit_usage:
                usage_chunk = self._chunk(request, parsed, {}, (None, None))
                usage_chunk["choices"] = []
                usage_chunk["usage"] = self._usage(request)
                await response.write(_sse(usage_chunk))
            sglext = self._sglext(request, parsed)
            if sglext is not None:
                ext_chunk = self._chunk(request, parsed, {}, (None, None))
                ext_chunk["choices"] = []
                ext_chunk["sglext"] = sglext
                await response.write(_sse(ext_chunk))
            if not self.faults.omit_done:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(request, "client_disconnected")
            raise
        return response

    # ----- native /generate ------------------------------------------------------------------------------------
    async def generate(self, http: web.Request) -> web.StreamResponse:
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "Request body is not valid JSON.", "BadRequestError")
        try:
            parsed = self._parse_generate(body)
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        rid = parsed["rid"]
        refused = self._admission_fault(rid, "generate")
        if refused is not None:
            return refused
        if self._draw(self.faults.hang_rate):
            return await self._hang(rid, "generate")
        request = self._new_request(
            rid,
            "generate",
            prompt_tokens=parsed["prompt_tokens"],
            seed=parsed["seed"],
            max_tokens=parsed["max_tokens"],
            enable_thinking=parsed["thinking"],
            ignore_eos=parsed["ignore_eos"],
            stream=parsed["stream"],
            empty_answer=self._draw(self.faults.empty_answer_rate),
        )
        self.engine.submit(request)
        if self._draw(self.faults.abort_rate):
            self.engine.abort(request, "aborted")
        if not parsed["stream"]:
            await self._wait(request)
            return web.json_response(self._generate_body(request))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(http)
            while True:
                await request.progress.wait()
                request.progress.clear()
                await response.write(_sse(self._generate_body(request)))
                if request.done.is_set():
                    break
            if not self.faults.omit_done:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(request, "client_disconnected")
            raise
        return response

    def _parse_generate(self, body: object) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        text, input_ids = body.get("text"), body.get("input_ids")
        if (text is None) == (input_ids is None):
            raise BadRequest("Either text or input_ids should be provided.")
        if text is not None and not isinstance(text, str):
            raise BadRequest("draftgen sim supports a single 'text' string (no batches).")
        if input_ids is not None and not (
            isinstance(input_ids, list) and all(isinstance(i, int) for i in input_ids)
        ):
            raise BadRequest("draftgen sim supports a single flat 'input_ids' list (no batches).")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise BadRequest("sampling_params must be an object.")
        prompt_tokens = count_text_tokens(text) if text is not None else len(input_ids)  # type: ignore[arg-type]
        raw_max = sampling.get("max_new_tokens", 128)
        max_tokens = self._max_tokens(raw_max, prompt_tokens, "max_new_tokens")
        thinking = not (isinstance(text, str) and text.rstrip(" ").endswith(THINK_END + "\n\n"))
        return {
            "rid": str(body.get("rid") or uuid.uuid4().hex),
            "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "thinking": thinking,
            "stream": bool(body.get("stream")),
            "seed": request_seed({"text": text, "input_ids": input_ids}, sampling.get("sampling_seed")),
            "ignore_eos": bool(sampling.get("ignore_eos")),
        }

    def _generate_body(self, request: SimRequest) -> dict:
        shown = request.shown_tokens
        text = "".join(request.plan.tokens[:shown])
        meta: dict[str, object] = {
            "id": request.rid,
            "finish_reason": None,
            "prompt_tokens": request.prompt_tokens,
            "completion_tokens": request.emitted,
            "cached_tokens": 0,
            "e2e_latency": (request.finished or time.time()) - request.arrival,
        }
        if request.done.is_set():
            if request.outcome != "ok":
                meta["finish_reason"] = {"type": "abort", "message": request.outcome}
            elif request.plan.finish_type == "stop":
                meta["finish_reason"] = {"type": "stop", "matched": EOS_TOKEN_ID}
            else:
                meta["finish_reason"] = {"type": "length", "length": request.emitted}
        if self.profile.speculative:
            meta.update(self._spec_fields(request, self.faults.sglang_version))
        return {"text": text, "output_ids": list(range(request.emitted)), "meta_info": meta}


# ----- process entry point -----------------------------------------------------------------------------------
def build_app(server: SimServer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes(server.routes())
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
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--profile", default="b200-mtp")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--truth", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--die-with-parent", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.die_with_parent:
        _set_parent_death_signal()
    try:
        config = ServerConfig(
            port=args.port,
            host=args.host,
            model=args.model,
            profile=get_profile(args.profile),
            speed=args.speed,
            faults=parse_faults(args.fault),
            truth_path=args.truth,
            seed=args.seed,
            max_running_requests=args.max_running_requests,
        )
    except ValueError as exc:
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
