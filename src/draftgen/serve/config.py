"""The settings of SGLang servers, declared once: where and how they start (``ServerParams``, shared by
``draftgen serve`` and tune's candidates), and the rest of one ``draftgen serve`` run (``ServeConfig``, whose
command line, ``SERVE_FLAGS``, is built from it by ``draftgen.flags``).

Both are ``Params``: frozen, strict, and every problem reported at once (a check of several parameters together
raises ``Problems``, each under its own parameter). A face names its parameters its own way in those messages:
the serve command by its flags (``--tp``), tune's notebook by the parameter names (``tp``).
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from draftgen.defaults import BASE_PORT, CONCURRENCY_PER_SERVER, FLEET_SIZE, MODEL, SGLANG_PYTHON_ENV
from draftgen.flags import EXTRA, Flag, spelling
from draftgen.params import (
    NOTEBOOK_MODEL,
    Params,
    PositiveFloat,
    PositiveInt,
    Problem,
    Problems,
    _unset_if_empty,
    param,
)
from draftgen.paths import resolve_path
from draftgen.server_settings import MTP_DEFAULT, ServerSettings, load_settings
from draftgen.sglang_rules.parsers import DEFAULT_FAMILY, FAMILIES
from draftgen.sim.faults import FAULT_KEYS, parse_faults
from draftgen.sim.profiles import PROFILES, get_profile

ENGINES = ("sglang", "sim")
DEFAULT_ROUTER_PORT = 30100
ROUTER_MODULE = "smg"  # SMG, SGLang's gateway: `python -m smg launch` (PyPI smg, a Rust binary in the wheel)
ROUTER_PIN = "smg==1.13.0"  # the release docs/engines.md measured: pyproject's `router` extra pins the same
# SMG runs in draftgen's own environment, where the `router` extra installs it (SGLang's has its own pins).
ROUTER_PYTHON = sys.executable
# SMG's names (`smg launch --help`, --policy) for the policies that spread one model over equal workers.
ROUTER_POLICIES = ("cache_aware", "round_robin", "least_load", "power_of_two", "random")
LOCAL_HOSTS = ("127.0.0.1", "0.0.0.0", "localhost", "::", "")
# What serve and tune wait for and how they stop a server (tune polls its candidates more often).
PROBE_TIMEOUT_S = 30.0
STOP_GRACE_S = 20.0

# MTP on (without --no-mtp or --settings): NEXTN 3/1/4, the setting that reaches an acceptance length of
# ~3.1-3.8 on Qwen3.5-class models (docs/engines.md#the-sglang-surface-draftgen-relies-on).
MTP_ARGS = tuple(MTP_DEFAULT.sglang_args())

_RANGE = re.compile(r"^(\d+)-(\d+)$")

Port = Annotated[int, Field(ge=1, le=65535)]


def parse_gpus(text: str) -> tuple[int, ...]:
    """``"0-6"`` → (0..6); ``"0,2,4"`` → (0, 2, 4); ``"0-3,6"`` → (0, 1, 2, 3, 6). Order is kept."""
    gpus: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError("empty item; write a list like 0-6 or 0,2,4")
        match = _RANGE.match(part)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if low > high:
                raise ValueError(f"range {part} runs backwards; write {high}-{low}")
            gpus.extend(range(low, high + 1))
        elif part.isdigit():
            gpus.append(int(part))
        else:
            raise ValueError(f"{part!r} is not a GPU index or a range like 0-6")
    duplicates = sorted(g for g, n in Counter(gpus).items() if n > 1)
    if duplicates:
        raise ValueError(f"GPU {', '.join(map(str, duplicates))} listed twice")
    return tuple(gpus)


def served_model_name(model: str, extra_args: list[str] | tuple[str, ...]) -> str:
    """The name requests must use: ``--served-model-name`` from the extra args if given, else the model path."""
    name = None
    for i, arg in enumerate(extra_args):
        if arg == "--served-model-name" and i + 1 < len(extra_args):
            name = extra_args[i + 1]
        elif arg.startswith("--served-model-name="):
            name = arg.partition("=")[2]
    return name or model


def _settings_file(value: Any) -> Any:
    """A settings file's path (the command line's --settings) → the settings it holds."""
    if isinstance(value, (str, Path)):
        try:
            return load_settings(resolve_path(value))
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
    return value


class ServerParams(Params):
    """Where and how SGLang servers start: what ``draftgen serve`` and tune's candidates both take."""

    # How this face writes a parameter in its messages (the serve command: its flags); the name itself otherwise.
    spelled: ClassVar[Mapping[str, str]] = {}

    engine: Literal[ENGINES] = param(
        "sglang", '"sglang" on the GPU node, "sim" for simulated servers (rehearsals, tests)'
    )
    model: str = param(
        ...,
        "--model-path for SGLang; also the served model name",
        notebook=NOTEBOOK_MODEL,
        min_length=1,
    )
    gpus: str = param(f"0-{FLEET_SIZE - 1}", "GPU indices: 0-6, 0,2,4 or 0-3,6; one server per group of tp")
    tp: PositiveInt = param(1, "GPUs per server, taken in order from the GPU list")
    base_port: Port = param(BASE_PORT, "GPU group i's server listens on the base port + i")
    host: str = param("127.0.0.1", "bind address of the servers (0.0.0.0 for other nodes)")
    python: str = param(
        "",
        f'SGLang\'s interpreter, in its own environment ("": ${SGLANG_PYTHON_ENV} if set, else this one; engine '
        "sim: this one)",
        validate_default=True,
    )
    model_family: Literal[FAMILIES] = param(
        DEFAULT_FAMILY,
        "the model's family: picks SGLang's --reasoning-parser and --tool-call-parser (qwen3_5: Qwen3.5/3.6, "
        "tool calls read by qwen3_coder; qwen3: by qwen)",
    )
    extra_args: list[str] = param(default_factory=list, help="appended to every SGLang server's command line")
    sim_profile: str | None = param(
        None,
        f'engine sim: simulated hardware, one of {", ".join(PROFILES)} ("": b200-mtp, or rtx-pro-6000 with '
        "speculation off)",
    )
    sim_speed: PositiveFloat = param(
        1.0, "engine sim: simulated clock speed-up (tok/s come out this many times higher)"
    )
    startup_timeout_s: PositiveFloat = param(
        1800.0, "a server not generating by then has failed to start (per attempt)"
    )

    _profile_unset = field_validator("sim_profile", mode="before")(_unset_if_empty)

    @model_validator(mode="before")
    @classmethod
    def _simulator_model(cls, data: Any) -> Any:
        """The simulator serves draftgen's model name unless told another."""
        if isinstance(data, dict) and data.get("engine") == "sim" and not data.get("model"):
            return {**data, "model": MODEL}
        return data

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, text: str) -> str:
        parse_gpus(text)
        return text

    @field_validator("python")
    @classmethod
    def _python(cls, path: str, info: ValidationInfo) -> str:
        if path:
            return path
        if info.data.get("engine") == "sglang":
            return os.environ.get(SGLANG_PYTHON_ENV) or sys.executable
        return sys.executable  # the simulator is draftgen's: it runs in draftgen's environment

    @field_validator("sim_profile")
    @classmethod
    def _profile(cls, name: str | None) -> str | None:
        if name is not None:
            get_profile(name)  # raises naming the profiles
        return name

    @model_validator(mode="after")
    def _check_together(self) -> ServerParams:
        problems = self.problems()
        if problems:
            raise Problems(problems)
        return self

    @classmethod
    def spell(cls, field: str) -> str:
        """How this face writes ``field`` (serve: its flag)."""
        return cls.spelled.get(field, field)

    def problems(self) -> list[Problem]:
        """What no single parameter shows: the GPUs split into servers, the ports they take."""
        problems = []
        tp, gpus = self.spell("tp"), self.spell("gpus")
        count = len(self.gpu_list)
        if count % self.tp:
            problems.append(
                Problem(
                    "tp",
                    f"{tp} {self.tp} does not divide the {count} GPUs of {gpus} into whole servers; list a "
                    f"multiple of {self.tp} GPUs or change {tp}",
                )
            )
        elif self.ports[-1] > 65535:
            problems.append(
                Problem(
                    "base_port",
                    f"{self.spell('base_port')} {self.base_port} + {len(self.ports)} servers runs past port 65535",
                )
            )
        return problems

    @property
    def gpu_list(self) -> tuple[int, ...]:
        return parse_gpus(self.gpus)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Consecutive groups of ``tp`` GPUs, one server each."""
        gpus = self.gpu_list
        return tuple(gpus[i : i + self.tp] for i in range(0, len(gpus), self.tp))

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(self.base_port + i for i in range(len(self.groups)))

    @property
    def url_host(self) -> str:
        """The address clients on this node use: loopback when binding to every interface."""
        return "127.0.0.1" if self.host in LOCAL_HOSTS else self.host

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(f"http://{self.url_host}:{port}" for port in self.ports)

    @property
    def served_model(self) -> str:
        return served_model_name(self.model, self.extra_args)


WHAT, WATCH = "what to run", "supervision"
ROUTING, SIM = "router: SMG, SGLang's gateway (multi-node)", "--engine sim (tests and rehearsals)"
# draftgen serve's command line: one flag per field of ServeConfig (the names users' scripts already use).
SERVE_FLAGS = (
    Flag("model", "--model", WHAT, "PATH", note=f"required with --engine sglang; --engine sim: {MODEL}"),
    Flag("gpus", "--gpus", WHAT, "LIST", required=True),  # serve starts nothing on GPUs it was not given
    Flag("tp", "--tp", WHAT, "N"),
    Flag("base_port", "--base-port", WHAT, "P"),
    Flag("host", "--host", WHAT, "H"),
    Flag("mtp", "--no-mtp", WHAT, negates=True, note="leave speculative decoding (MTP, NEXTN 3/1/4) off"),
    Flag("mem_fraction", "--mem-fraction", WHAT, "F"),
    Flag("max_running_requests", "--max-running-requests", WHAT, "N"),
    Flag("settings", "--settings", WHAT, "FILE", parse=resolve_path),
    Flag("engine", "--engine", WHAT),
    Flag("model_family", "--model-family", WHAT, "FAMILY"),
    Flag("python", "--python", WHAT, "PATH"),
    Flag("extra_args", EXTRA, WHAT),
    Flag("restart", "--restart", WATCH),
    Flag("max_restarts", "--max-restarts", WATCH, "N"),
    Flag("restart_backoff_s", "--restart-backoff", WATCH, "S"),
    Flag("startup_timeout_s", "--timeout", WATCH, "S"),
    Flag("poll_interval_s", "--poll-interval", WATCH, "S"),
    Flag("probe_timeout_s", "--probe-timeout", WATCH, "S"),
    Flag("stop_grace_s", "--grace", WATCH, "S"),
    Flag("out_dir", "--out", WATCH, "DIR"),
    Flag("run_name", "--run", WATCH, "NAME", note="default: a timestamp"),
    Flag("router", "--router", ROUTING),
    Flag("router_port", "--router-port", ROUTING, "P"),
    Flag("router_policy", "--router-policy", ROUTING),
    Flag("router_metrics_port", "--router-metrics-port", ROUTING, "P"),
    Flag("router_workers", "--router-worker", ROUTING, "URL"),
    Flag("sim_profile", "--sim-profile", SIM, "NAME"),
    Flag("sim_speed", "--sim-speed", SIM, "X"),
    Flag("sim_faults", "--sim-fault", SIM, "KEY=VALUE"),
)


class ServeConfig(ServerParams):
    """Everything that decides which processes ``draftgen serve`` starts and how it watches them."""

    spelled: ClassVar[Mapping[str, str]] = spelling(SERVE_FLAGS)

    mtp: bool = param(True, "speculative decoding: MTP, NEXTN 3/1/4")
    mem_fraction: float | None = param(None, "--mem-fraction-static (e.g. 0.85)", gt=0, lt=1)
    max_running_requests: PositiveInt | None = param(
        None,
        f"batch cap per server (MTP on: {CONCURRENCY_PER_SERVER}, the requests generate keeps in flight per "
        "server; MTP off: SGLang's own)",
    )
    settings: Annotated[ServerSettings | None, BeforeValidator(_settings_file)] = param(
        None,
        "speculative settings and batch cap chosen by draftgen tune (replaces --no-mtp, --mem-fraction, "
        "--max-running-requests)",
    )
    sim_faults: list[str] = param(
        default_factory=list, help=f"engine sim: a fault KEY=VALUE, repeatable; keys: {', '.join(FAULT_KEYS)}"
    )
    router: bool = param(False, "put SMG, SGLang's gateway, in front of the servers")
    router_port: Port = param(DEFAULT_ROUTER_PORT, "router port")
    router_workers: list[str] = param(default_factory=list, help="a worker on another node, repeatable")
    router_policy: Literal[ROUTER_POLICIES] = param("cache_aware", "how SMG picks a worker, by SMG's names")
    router_metrics_port: Port | None = param(
        None, "the router's own Prometheus /metrics port (default: the router port + 1)"
    )
    out_dir: Annotated[Path, AfterValidator(resolve_path)] = param(
        Path("outputs/serve"), "runs folder (relative: under the project root)"
    )
    run_name: str = param(..., "run folder name")
    poll_interval_s: PositiveFloat = param(1.0, "seconds between health probes")
    probe_timeout_s: PositiveFloat = param(PROBE_TIMEOUT_S, "seconds one probe may take")
    restart: bool = param(False, "bring crashed or stuck servers back")
    max_restarts: Annotated[int, Field(ge=0)] = param(3, "failures in a row before giving up")
    restart_backoff_s: Annotated[float, Field(ge=0)] = param(10.0, "first restart delay in seconds, doubling")
    stop_grace_s: PositiveFloat = param(STOP_GRACE_S, "SIGTERM → SIGKILL grace on stop, seconds")
    log_tail_lines: PositiveInt = param(20, "lines of a failed server's log shown")

    @field_validator("sim_faults")
    @classmethod
    def _faults(cls, specs: list[str]) -> list[str]:
        parse_faults(specs)  # raises naming the bad fault
        return specs

    @field_validator("router_workers")
    @classmethod
    def _worker_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} must be a URL like http://node2:{BASE_PORT}")
        return urls

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError("must be a plain folder name")
        return name

    def problems(self) -> list[Problem]:
        name = self.spell
        problems = super().problems()
        if self.router and not problems:
            if self.router_port in self.ports:
                problems.append(
                    Problem(
                        "router_port",
                        f"{name('router_port')} {self.router_port} is also a server port "
                        f"({self.ports[0]}-{self.ports[-1]}); pick another",
                    )
                )
            elif self.metrics_port in (*self.ports, self.router_port) or self.metrics_port > 65535:
                problems.append(
                    Problem(
                        "router_metrics_port",
                        f"{name('router_metrics_port')} {self.metrics_port} is also a server or the router's "
                        "port, or past 65535; pick another",
                    )
                )
        if self.router_workers and not self.router:
            problems.append(Problem("router_workers", f"{name('router_workers')} needs {name('router')}"))
        if self.settings is not None:
            given = [
                name(field)
                for field, value in (
                    ("mtp", not self.mtp),
                    ("mem_fraction", self.mem_fraction is not None),
                    ("max_running_requests", self.max_running_requests is not None),
                )
                if value
            ]
            if given:
                problems.append(
                    Problem(
                        "settings",
                        f"{name('settings')} already sets what {', '.join(given)} would; drop one of them",
                    )
                )
            if self.engine == "sim" and not self.settings.simulated:
                problems.append(
                    Problem(
                        "settings",
                        f"{name('settings')} {self.settings.label}: {name('engine')} sim models MTP (NEXTN, EAGLE), "
                        "drafters (EAGLE3, STANDALONE, DFLASH: docs/simulator.md) or speculation off, not NGRAM; "
                        "serve these settings with engine sglang",
                    )
                )
        if self.engine != "sim" and (self.sim_faults or self.sim_profile):
            problems.append(
                Problem(
                    "sim_profile",
                    f"{name('sim_profile')} and {name('sim_faults')} only apply with {name('engine')} sim",
                )
            )
        return problems

    @property
    def batch_cap(self) -> int | None:
        """The --max-running-requests each server starts with: the one given; with MTP on (no --settings, which
        names its own), the production concurrency, so every request generate keeps in flight runs at once (SGLang's
        own default with speculation is lower); None: SGLang's own."""
        if self.max_running_requests is not None or self.settings is not None:
            return self.max_running_requests
        return CONCURRENCY_PER_SERVER if self.mtp else None

    @property
    def router_url(self) -> str:
        return f"http://{self.url_host}:{self.router_port}"

    @property
    def metrics_port(self) -> int:
        """The router's Prometheus port (its /metrics are not on its API port)."""
        return self.router_metrics_port if self.router_metrics_port is not None else self.router_port + 1

    @property
    def effective_sim_profile(self) -> str:
        if self.sim_profile:
            return self.sim_profile
        return "b200-mtp" if self.mtp or self.settings is not None else "rtx-pro-6000"

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_name
