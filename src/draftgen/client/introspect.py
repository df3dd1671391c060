"""Asking a server what it is: its start-up stage, health (with each engine's fallbacks), models, batch cap,
speculation, engine and version.

The one place that knows which endpoint answers which question on SGLang, its gateway SMG, vLLM,
``transformers serve`` and ``draftgen sim``; benchmark, preflight, tune, generate and serve read these facts from
here, never by hand.
"""

from __future__ import annotations

import contextlib
import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from draftgen.client.errors import RequestError
from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.params import SamplingParams

PROBE_MAX_TOKENS = 8
HEALTH_GENERATE = "/health_generate"  # SGLang: a real 1-token generation; 503 after 20 s of scheduler silence
HEALTH = "/health"


@dataclass(frozen=True)
class Health:
    status: int | None  # None: unreachable
    endpoint: str  # what answered: /health_generate, or /health where the engine has no /health_generate

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def generates(self) -> bool:
        """The answer came from a real generation (SGLang's /health_generate), not a liveness check."""
        return self.endpoint == HEALTH_GENERATE


async def health(client: ServerClient, *, generate: bool = False, timeout_s: float = 30.0) -> Health:
    """/health, or SGLang's /health_generate with ``generate``.

    Engines without /health_generate (vLLM, transformers serve answer 404) fall back to /health: callers that need
    proof of generation send a request of their own (preflight's probe and canary do).
    """
    if generate:
        status, _ = await client.get(HEALTH_GENERATE, timeout_s)
        if status != 404:
            return Health(status, HEALTH_GENERATE)
    status, _ = await client.get(HEALTH, timeout_s)
    return Health(status, HEALTH)


class StartupStage(enum.Enum):
    """What one health probe of a starting server says (SGLang's start-up, docs/engines.md)."""

    REFUSED = "refused"
    WARMING = "503"
    SILENT = "no answer"
    ERROR = "http error"
    READY = "ready"

    @property
    def meaning(self) -> str:
        return _STAGE_MEANINGS[self]


_STAGE_MEANINGS = {
    StartupStage.REFUSED: "connection refused: loading weights, port not open yet",
    StartupStage.WARMING: "HTTP 503: port open, warm-up not finished",
    StartupStage.SILENT: "connected but no answer within the probe timeout",
    StartupStage.ERROR: "unexpected HTTP status",
    StartupStage.READY: "HTTP 200: generates tokens",
}


@dataclass(frozen=True)
class Readiness:
    stage: StartupStage
    detail: str = ""  # e.g. the HTTP status for StartupStage.ERROR


async def startup_stage(client: ServerClient, path: str, timeout_s: float) -> Readiness:
    """GET ``path`` once and say which start-up stage the answer means; never raises for network trouble.

    refused: nothing listens yet (SGLang opens its port only after loading the weights); 503: warm-up not run yet;
    200: ready (``/health_generate`` runs a real 1-token generation); silent: connected, no answer in time."""
    try:
        reply = await client.request("GET", path, timeout_s=timeout_s)
    except RequestError as exc:
        if exc.kind == "timeout":
            return Readiness(StartupStage.SILENT, f"no answer in {timeout_s:g}s")
        if exc.refused:
            return Readiness(StartupStage.REFUSED)
        # Connected, then the server closed the connection mid-answer (often: it is going down).
        return Readiness(StartupStage.ERROR, exc.message[:80])
    if reply.status == 200:
        return Readiness(StartupStage.READY)
    if reply.status == 503:
        return Readiness(StartupStage.WARMING)
    return Readiness(StartupStage.ERROR, f"HTTP {reply.status}")


async def simulator_pid(client: ServerClient, timeout_s: float = 5.0) -> int | None:
    """The process a simulated server runs in (``/sim/info`` ``pid``); None from any other engine.

    A start-up watch needs it: a 200 on the port it waits on may come from another server that bound that port
    first, while the one it started is still importing (and about to exit 'port in use')."""
    data = await client.sim_info(timeout_s)
    pid = data.get("pid") if data is not None else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


@dataclass(frozen=True)
class ModelList:
    """``GET /v1/models``: the served names and the status that came with them (None: unreachable), and each
    card's ``root`` (SGLang: the served name again; vLLM: the model path)."""

    ids: tuple[str, ...]
    status: int | None
    roots: tuple[str, ...] = ()

    def serves(self, model: str) -> bool | None:
        """Whether ``model`` is served; None when the server lists nothing (transformers serve answers 500): then
        the probe request, which names the model, is the check."""
        return model in self.ids if self.ids else None


async def served_models(client: ServerClient) -> ModelList:
    status, text = await client.get("/v1/models")
    data = None
    if status == 200:
        with contextlib.suppress(json.JSONDecodeError):
            data = json.loads(text)
    return ModelList(parse_model_ids(data), status, parse_model_roots(data))


async def model_ids(client: ServerClient) -> tuple[str, ...]:
    """The served model names (``/v1/models``); () when the list is unavailable (transformers serve: 500)."""
    return (await served_models(client)).ids


def parse_model_ids(data: Any) -> tuple[str, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return ()
    return tuple(str(item.get("id")) for item in data["data"] if isinstance(item, dict))


def parse_model_roots(data: Any) -> tuple[str, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return ()
    roots = (item.get("root") for item in data["data"] if isinstance(item, dict))
    return tuple(root for root in roots if isinstance(root, str) and root)


@dataclass(frozen=True)
class ServerInfo:
    """SGLang's ``/server_info`` (``/get_server_info`` before 0.5): the launch arguments and per-DP-rank state.
    ``raw`` is empty when the server has no such endpoint (vLLM, transformers serve)."""

    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def is_sglang(self) -> bool:
        return "internal_states" in self.raw or "speculative_algorithm" in self.raw

    @property
    def version(self) -> str | None:
        value = self.raw.get("version")
        return str(value) if value else None

    @property
    def max_running_requests(self) -> int | None:
        """The batch cap the server runs: the effective cap of each DP rank, summed, else the launch argument.

        SGLang resolves the cap at start from the argument (48 by default with speculative decoding) and lowers it
        where the memory pools hold fewer requests; the argument in ``/server_info`` stays as given. A hybrid
        model's mamba state pool is such a limit (SGLang 0.5.23 logs "max_running_requests is capped to N by
        the mamba state cache"), so only the effective value is the real cap (docs/engines.md, "Capacity")."""
        per_dp = [
            s.get("effective_max_running_requests_per_dp") for s in self._states() if isinstance(s, dict)
        ]
        if per_dp and all(isinstance(v, int) and v > 0 for v in per_dp):
            return sum(per_dp)
        value = self.raw.get("max_running_requests")
        if isinstance(value, int) and value > 0:
            return value
        return None

    @property
    def model_folders(self) -> tuple[str, ...]:
        """Where the server loaded its model and tokenizer from (SGLang's resolved ``model_path`` and
        ``tokenizer_path``: a local folder or a Hugging Face id), each once, in that order."""
        values = [self.raw.get(key) for key in ("tokenizer_path", "model_path")]
        return tuple(dict.fromkeys(v for v in values if isinstance(v, str) and v))

    @property
    def speculative_algorithm(self) -> str | None:
        value = self.raw.get("speculative_algorithm")
        return str(value) if value is not None else None

    @property
    def speculation(self) -> bool | None:
        """True/False where the server says (``speculative_algorithm`` null = off), None when it does not."""
        if "speculative_algorithm" not in self.raw:
            return None
        return self.raw["speculative_algorithm"] is not None

    @property
    def cumulative_accept_length(self) -> float | None:
        """``avg_spec_accept_length`` of DP rank 0: cumulative since start (warm-up included) and refreshed only
        every decode-log interval, so for reference only — never a run's own acceptance."""
        values = [s.get("avg_spec_accept_length") for s in self._states() if isinstance(s, dict)]
        values = [float(v) for v in values if isinstance(v, (int, float))]
        return values[0] if values else None

    def _states(self) -> list[Any]:
        states = self.raw.get("internal_states")
        return states if isinstance(states, list) else []


def batch_cap(info: ServerInfo, capabilities: Capabilities) -> int | None:
    """How many requests the server runs at once. SMG answers ``/get_server_info`` from its first healthy worker,
    so behind a gateway the fleet holds that cap once per worker."""
    cap = info.max_running_requests
    if cap is not None and capabilities.workers:
        cap *= len(capabilities.workers)
    return cap


async def server_info(client: ServerClient) -> ServerInfo:
    for path in ("/server_info", "/get_server_info"):
        data = await client.get_json(path)
        if isinstance(data, dict):
            return ServerInfo(data)
    return ServerInfo()


GATEWAY = "smg"  # SMG, SGLang's gateway (the retired sglang-router spoke the same /workers list)


async def router_workers(client: ServerClient) -> tuple[str, ...] | None:
    """SMG: the worker URLs of ``GET /workers``; None when this is no gateway."""
    workers = await client.gateway_workers()
    return None if workers is None else tuple(workers)


async def gateway_version(client: ServerClient) -> str | None:
    """SMG's release, from ``GET /get_loads`` (``"version": "smg-1.13.0"``); None when it does not say."""
    data = await client.get_json("/get_loads")
    value = data.get("version") if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        return None
    return value.removeprefix(f"{GATEWAY}-")


@dataclass(frozen=True)
class Engine:
    name: str
    version: str | None
    metrics: bool  # /metrics answers Prometheus text
    workers: tuple[str, ...] = ()


async def detect_engine(client: ServerClient) -> Engine:
    """Which engine this is, from endpoints only one engine family serves.

    The gateway is asked first: SMG hands ``/get_server_info`` to its first healthy worker, so that answer alone
    would make it look like one SGLang server.
    """
    metrics = await client.metrics_text()
    has_metrics = metrics is not None and "# TYPE" in metrics
    workers = await router_workers(client)
    if workers is not None:
        return Engine(GATEWAY, await gateway_version(client), has_metrics, workers)
    info = await server_info(client)
    if info.is_sglang:
        return Engine("sglang", info.version, has_metrics)
    version = await client.get_json("/version")
    if isinstance(version, dict) and "version" in version and (metrics is None or "vllm:" in metrics):
        return Engine("vllm", str(version["version"]), has_metrics)
    return Engine("openai-compatible", None, has_metrics)


# Each step back drops what the previous one's 400/422 may have refused: first the token-id fields alone, then the
# sampling extras (keeping the ids: vLLM with speculative decoding refuses only min_p), then both, then
# chat_template_kwargs.
PROBE_STEPS = (
    {"extra_fields": True, "template_kwargs": True, "spec_details": True, "ids": True},
    {"extra_fields": True, "template_kwargs": True, "spec_details": True, "ids": False},
    {"extra_fields": False, "template_kwargs": True, "spec_details": False, "ids": True},
    {"extra_fields": False, "template_kwargs": True, "spec_details": False, "ids": False},
    {"extra_fields": False, "template_kwargs": False, "spec_details": False, "ids": False},
)
# Which way of asking for token ids each engine has (client.server.TOKEN_ID_FIELDS); others are asked for none.
# SMG passes SGLang's id fields to its workers and their sglext back unchanged (docs/engines.md's SMG table).
TOKEN_ID_FLAVOURS = {"sglang": "sglext", GATEWAY: "sglext", "vllm": "vllm"}


async def probe(client: ServerClient, model: str, sampling: SamplingParams) -> Capabilities:
    """Detect the engine and which extras it accepts, with one tiny request per step back; sets
    ``client.capabilities``.

    The first request carries every extra, the token-id fields in the engine's own flavour included; a 400/422
    (transformers serve: "Unexpected fields"; vLLM with speculative decoding: min_p "not yet supported") steps
    back through ``PROBE_STEPS`` down to plain OpenAI fields. Any other failure, or a 400/422 on the plain request
    (a wrong model name), raises. Token ids count as offered only when the answer carried output ids. A client
    that wants logprobs (``entropy_top_k``) asks first with them too, and drops them alone first; they count as
    answered only when the answer carried them.
    """
    engine = await detect_engine(client)
    ids = await model_ids(client)
    flavour = TOKEN_ID_FLAVOURS.get(engine.name)
    steps = [s for s in PROBE_STEPS if flavour is not None or not s["ids"]]
    if client.entropy_top_k:  # logprobs wanted: asked with everything first, and dropped alone first
        steps = [{**steps[0], "logprobs": True}, *steps]
    for index, step in enumerate(steps):
        client.capabilities = Capabilities(
            engine=engine.name,
            model_ids=ids,
            metrics=engine.metrics,
            version=engine.version,
            workers=engine.workers,
            extra_fields=step["extra_fields"],
            template_kwargs=step["template_kwargs"],
            spec_details=step["spec_details"],
            token_ids=flavour if step["ids"] else None,
            logprobs=step.get("logprobs", False),
        )
        try:
            result = await client.chat(
                [{"role": "user", "content": "Say OK."}],
                sampling,
                model,
                max_tokens=PROBE_MAX_TOKENS,
                timeout_s=min(client.timeout_s, 120.0),
            )
        except RequestError as exc:
            if exc.status not in (400, 422) or index == len(steps) - 1:
                raise
            continue
        client.capabilities = replace(
            client.capabilities,
            spec_details=step["spec_details"] and result.spec_verify_ct is not None,
            token_ids=client.capabilities.token_ids if result.output_ids is not None else None,
            logprobs=client.capabilities.logprobs and result.entropy is not None,
        )
        break
    return client.capabilities
