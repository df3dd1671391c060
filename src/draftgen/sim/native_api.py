"""The simulated server's SGLang-native surface: ``/health``, ``/health_generate``, ``/server_info``,
``/model_info``, ``/get_load`` and ``/generate``."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from draftgen.sglang_rules.hybrid_memory import RESOLVED_CACHE
from draftgen.sglang_rules.speculation import NEXTN, resolved_algorithm
from draftgen.sim.categories import classify_rendered
from draftgen.sim.engine import SimRequest
from draftgen.sim.temperature import temperature_of
from draftgen.sim.textgen import THINK_END, request_seed
from draftgen.sim.wire import BadRequest, sse

if TYPE_CHECKING:
    from draftgen.sim.core import SimServer

# SGLang's /health_generate gives up after 20 s without scheduler output (simulated seconds here).
HEALTH_GENERATE_TIMEOUT_S = 20.0
HEALTH_GENERATE_POLL_S = 0.05

# The simulated target is Qwen3.6-27B, a qwen3_5 hybrid; /server_info reports the cache SGLang 0.5.23 resolves for
# it (sglang_rules.hybrid_memory.RESOLVED_CACHE).
TARGET_MODEL_TYPE, TARGET_ARCHITECTURES = "qwen3_5", ("Qwen3_5ForConditionalGeneration",)


def reported_algorithm(requested: str | None) -> str:
    """``speculative_algorithm`` as SGLang reports it after resolving its arguments (None: the profile's own
    NEXTN); the resolution is sglang_rules.speculation.resolved_algorithm."""
    return resolved_algorithm(requested or NEXTN)


class NativeApi:
    def __init__(self, sim: SimServer):
        self.sim = sim

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/health_generate", self.health_generate),
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            # SGLang's router asks each worker for these when it registers it and to balance by load.
            web.get("/model_info", self.model_info),
            web.get("/get_model_info", self.model_info),
            web.get("/get_load", self.load),
            web.post("/generate", self.generate),
        ]

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.sim.healthy else 503)

    async def health_generate(self, _: web.Request) -> web.Response:
        if not self.sim.healthy:
            return web.Response(status=503)
        probe = self.sim.planner.new_request(
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
        self.sim.engine.submit(probe)
        # The timeout runs on the simulated clock.
        deadline = time.monotonic() + HEALTH_GENERATE_TIMEOUT_S / self.sim.config.speed
        while not probe.done.is_set() and self.sim.engine.last_step_at <= began:
            if time.monotonic() >= deadline:
                self.sim.engine.abort(probe, "health_timeout")
                return web.Response(status=503)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probe.done.wait(), HEALTH_GENERATE_POLL_S)
        self.sim.engine.abort(probe, "health_answered")  # no-op once it finished; out of the queue otherwise
        return web.Response(status=200)

    async def server_info(self, _: web.Request) -> web.Response:
        stats = self.sim.engine.stats
        state: dict[str, object] = {
            "last_gen_throughput": stats.interval_throughput,
            "memory_usage": {
                "weight": 51.2,
                "kvcache": 96.0,
                "token_capacity": self.sim.profile.kv_capacity_tokens,
            },
            "effective_max_running_requests_per_dp": self.sim.profile.max_running_requests,
        }
        if stats.avg_spec_accept_length is not None:
            state["avg_spec_accept_length"] = stats.avg_spec_accept_length
        spec = self.sim.profile.speculative
        return web.json_response(
            {
                "model_path": self.sim.config.model_path or self.sim.config.model,
                "tokenizer_path": self.sim.config.model_path or self.sim.config.model,
                "served_model_name": self.sim.config.model,
                "host": self.sim.config.host,
                "port": self.sim.config.port,
                "tp_size": 1,
                "dp_size": 1,
                "max_running_requests": self.sim.profile.max_running_requests,
                "context_length": self.sim.profile.context_length,
                "reasoning_parser": "qwen3",
                "tool_call_parser": self.sim.config.tool_call_parser,
                "enable_metrics": True,
                "decode_log_interval": 40,
                "speculative_algorithm": reported_algorithm(self.sim.profile.spec_algorithm)
                if spec
                else None,
                "speculative_draft_model_path": self.sim.profile.draft_model_path,
                "speculative_num_steps": self.sim.profile.spec_steps if spec else None,
                "speculative_eagle_topk": self.sim.profile.spec_topk if spec else None,
                "speculative_num_draft_tokens": self.sim.profile.draft_tokens if spec else None,
                "mem_fraction_static": self.sim.profile.mem_fraction_static,
                "speculative_adaptive": self.sim.profile.adaptive_steps is not None,
                **RESOLVED_CACHE,
                "disable_radix_cache": self.sim.config.cache.disable_radix_cache,
                "enable_cache_report": self.sim.config.cache.enable_cache_report,
                "version": self.sim.faults.sglang_version,
                "internal_states": [state],
            }
        )

    async def model_info(self, _: web.Request) -> web.Response:
        """SGLang's model description: paths, a generation model, its weight version and HF model type."""
        model = self.sim.config.model_path or self.sim.config.model
        return web.json_response(
            {
                "model_path": model,
                "tokenizer_path": model,
                "is_generation": True,
                "weight_version": "default",
                "model_type": TARGET_MODEL_TYPE,
                "architectures": list(TARGET_ARCHITECTURES),
            }
        )

    async def load(self, _: web.Request) -> web.Response:
        """SGLang's ``/get_load``: per data-parallel rank (one here), requests running + waiting, the waiting
        ones, and the tokens they hold."""
        engine = self.sim.engine
        held = sum(r.prompt_tokens + r.emitted for r in engine.running)
        waiting = sum(r.prompt_tokens for r in engine.waiting)
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": len(engine.running) + len(engine.waiting),
                    "num_waiting_reqs": len(engine.waiting),
                    "num_tokens": held + waiting,
                }
            ]
        )

    async def generate(self, http: web.Request) -> web.StreamResponse:
        accepted = await self.sim.accept(http, self._parse_generate, "generate")
        if isinstance(accepted, web.Response):
            return accepted
        parsed, request = accepted
        if not parsed["stream"]:
            await self.sim.wait_for(request)
            return web.json_response(self._generate_body(request))
        async with self.sim.event_stream(http, request) as response:
            first = True
            while True:
                await request.progress.wait()
                request.progress.clear()
                await response.write(sse(self._generate_body(request, first=first)))
                first = False
                if request.done.is_set():
                    break
        return response

    def _parse_generate(self, body: object, headers: Mapping[str, str]) -> dict:
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
        prompt_ids = self.sim.tokenizer.encode(text) if text is not None else list(input_ids)  # type: ignore[arg-type]
        raw_max = sampling.get("max_new_tokens", 128)
        max_tokens = self.sim.max_tokens(raw_max, len(prompt_ids), "max_new_tokens")
        if text is None:
            text = self.sim.tokenizer.decode(prompt_ids)
        thinking = not text.rstrip(" ").endswith(THINK_END + "\n\n")
        return {
            "rid": str(body.get("rid") or uuid.uuid4().hex),
            "prompt_ids": prompt_ids,
            "prompt_tokens": len(prompt_ids),
            "max_tokens": max_tokens,
            "thinking": thinking,
            "stream": bool(body.get("stream")),
            "seed": request_seed(
                {"text": body.get("text"), "input_ids": input_ids}, sampling.get("sampling_seed")
            ),
            "ignore_eos": bool(sampling.get("ignore_eos")),
            "category": classify_rendered(text),
            "temperature": temperature_of(sampling),
        }

    def _generate_body(self, request: SimRequest, *, first: bool = False) -> dict:
        """SGLang 0.5.23's reply (or, streaming, one cumulative event): raw text with ``</think>`` (no reasoning
        parser here), the output ids so far (the EOS included once generated), and ``meta_info``; the final
        event adds the end-of-request timings, as SGLang's does."""
        shown = request.shown_tokens
        now = time.time()
        done = request.done.is_set()
        meta: dict[str, object] = {
            "id": request.rid,
            "finish_reason": None,
            "prompt_tokens": request.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "storage_prefetch_wait": 0.0,
            "storage_staging_wait": 0.0,
            "forward_entry_time": request.admitted or request.arrival,
            "prefill_finished_time": request.first_token or request.admitted or request.arrival,
            "queue_time": max(0.0, (request.admitted or request.arrival) - request.arrival),
            "reasoning_tokens": 0,
            "completion_tokens": request.emitted,
            "cached_tokens": request.cached_tokens,
            # SGLang's breakdown (the output streamer's get_cached_tokens_details): null when nothing was cached
            "cached_tokens_details": (
                {"device": request.cached_tokens, "host": 0} if request.cached_tokens else None
            ),
            "dp_rank": None,
        }
        if done:
            if request.outcome != "ok":
                meta["finish_reason"] = {"type": "abort", "message": request.outcome}
            elif request.plan.finish_type == "stop":
                meta["finish_reason"] = {"type": "stop", "matched": request.plan.eos_id}
            else:
                meta["finish_reason"] = {"type": "length", "length": request.emitted}
            finished = request.finished or now
            first_token = request.first_token or finished
            meta["weight_versions"] = [{"version": "default", "start": 0, "end": request.emitted}]
            meta["e2e_latency"] = finished - request.arrival
            meta["request_received_ts"] = request.arrival
            meta["first_token_latency"] = first_token - request.arrival
            meta["api_server_dispatch_finish_ts"] = request.arrival
            meta["request_finished_ts"] = finished
            decode_s = finished - first_token
            meta["decode_throughput"] = request.emitted / decode_s if decode_s > 0 else 0.0
        shape = self.sim.faults.sglang_version
        # 0.5.23 adds them once the request is finished, and only after a verify step (tokenizer_manager's
        # _calculate_spec_decoding_metrics); the older shapes' timing is not modelled
        if self.sim.profile.speculative and (shape != "0.5.23" or (done and request.verify_steps > 0)):
            meta.update(self.sim.spec_fields(request, shape))
        if done or first:
            meta["response_sent_to_client_ts"] = now
        text = "".join(request.plan.tokens[:shown])
        return {"text": text, "output_ids": request.plan.output_ids(request.emitted), "meta_info": meta}
