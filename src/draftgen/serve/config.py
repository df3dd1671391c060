"""The validated, frozen settings of one ``draftgen serve`` run, and the GPU-list parser they need."""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.defaults import BASE_PORT
from draftgen.server_settings import MTP_DEFAULT, ServerSettings
from draftgen.sglang_rules.parsers import DEFAULT_FAMILY, FAMILIES
from draftgen.sim.faults import parse_faults
from draftgen.sim.profiles import get_profile

ENGINES = ("sglang", "sim")
DEFAULT_ROUTER_PORT = 30100
ROUTER_MODULE = "smg"  # SMG, SGLang's gateway: `python -m smg launch` (PyPI smg, a Rust binary in the wheel)
ROUTER_PIN = "smg==1.13.0"  # the release docs/engines.md measured (pyproject's dev extra pins the same)
# SMG's names (`smg launch --help`, --policy) for the policies that spread one model over equal workers.
ROUTER_POLICIES = ("cache_aware", "round_robin", "least_load", "power_of_two", "random")
LOCAL_HOSTS = ("127.0.0.1", "0.0.0.0", "localhost", "::", "")

# MTP on (without --no-mtp or --settings): NEXTN 3/1/4, the setting that reaches an acceptance length of
# ~3.1-3.8 on Qwen3.5-class models (docs/engines.md#the-sglang-surface-draftgen-relies-on).
MTP_ARGS = tuple(MTP_DEFAULT.sglang_args())

_RANGE = re.compile(r"^(\d+)-(\d+)$")


def parse_gpus(text: str) -> tuple[int, ...]:
    """``"0-6"`` → (0..6); ``"0,2,4"`` → (0, 2, 4); ``"0-3,6"`` → (0, 1, 2, 3, 6). Order is kept."""
    gpus: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"--gpus {text!r}: empty item; write a list like 0-6 or 0,2,4")
        match = _RANGE.match(part)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if low > high:
                raise ValueError(f"--gpus {text!r}: range {part} runs backwards; write {high}-{low}")
            gpus.extend(range(low, high + 1))
        elif part.isdigit():
            gpus.append(int(part))
        else:
            raise ValueError(f"--gpus {text!r}: {part!r} is not a GPU index or a range like 0-6")
    duplicates = sorted(g for g, n in Counter(gpus).items() if n > 1)
    if duplicates:
        raise ValueError(f"--gpus {text!r}: GPU {', '.join(map(str, duplicates))} listed twice")
    return tuple(gpus)


def group_gpus(gpus: tuple[int, ...], tp: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive groups of ``tp`` GPUs, one server each."""
    if tp < 1:
        raise ValueError(f"--tp must be >= 1, got {tp}")
    if len(gpus) % tp:
        raise ValueError(
            f"--tp {tp} does not divide the {len(gpus)} GPUs of --gpus into whole servers; "
            f"list a multiple of {tp} GPUs or change --tp"
        )
    return tuple(gpus[i : i + tp] for i in range(0, len(gpus), tp))


def served_model_name(model: str, extra_args: tuple[str, ...]) -> str:
    """The name requests must use: ``--served-model-name`` from the extra args if given, else the model path."""
    name = None
    for i, arg in enumerate(extra_args):
        if arg == "--served-model-name" and i + 1 < len(extra_args):
            name = extra_args[i + 1]
        elif arg.startswith("--served-model-name="):
            name = arg.partition("=")[2]
    return name or model


def _check_port(value: int, name: str) -> None:
    if not 1 <= value <= 65535:
        raise ValueError(f"{name} {value} is not a port number (1-65535)")


@dataclass(frozen=True)
class ServeConfig:
    """Everything that decides which processes ``draftgen serve`` starts and how it watches them."""

    model: str
    gpus: tuple[int, ...]
    base_port: int = BASE_PORT
    tp: int = 1
    mtp: bool = True
    mem_fraction: float | None = None
    max_running_requests: int | None = None
    engine: str = "sglang"
    # whose reasoning and tool-call parsers the servers start with (sglang_rules.parsers)
    model_family: str = DEFAULT_FAMILY
    extra_args: tuple[str, ...] = ()
    settings: ServerSettings | None = (
        None  # --settings FILE (draftgen tune): replaces mtp, mem_fraction, the cap
    )
    host: str = "127.0.0.1"
    python: str = sys.executable
    # --engine sim only
    sim_profile: str | None = None
    sim_speed: float = 1.0
    sim_faults: tuple[str, ...] = ()
    # router
    router: bool = False
    router_port: int = DEFAULT_ROUTER_PORT
    router_workers: tuple[str, ...] = ()  # extra worker URLs on other nodes
    router_policy: str = "cache_aware"
    router_metrics_port: int | None = None  # the router's own Prometheus port; None: router_port + 1
    # supervision
    out_dir: Path = Path("outputs/serve")
    run_name: str = "run"
    startup_timeout_s: float = 1800.0
    poll_interval_s: float = 1.0
    probe_timeout_s: float = 30.0
    restart: bool = False
    max_restarts: int = 3
    restart_backoff_s: float = 10.0
    stop_grace_s: float = 20.0
    log_tail_lines: int = 20
    groups: tuple[tuple[int, ...], ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        if not self.model:
            raise ValueError("--model is required: the model path or Hugging Face id SGLang should load")
        if self.model_family not in FAMILIES:
            raise ValueError(f"--model-family {self.model_family!r}: choose one of {', '.join(FAMILIES)}")
        if not self.gpus:
            raise ValueError("--gpus is empty: list the GPUs to serve on, e.g. 0-6")
        object.__setattr__(self, "groups", group_gpus(self.gpus, self.tp))
        _check_port(self.base_port, "--base-port")
        _check_port(self.base_port + len(self.groups) - 1, "--base-port + servers - 1")
        if self.router:
            _check_port(self.router_port, "--router-port")
            if self.router_port in self.ports:
                raise ValueError(
                    f"--router-port {self.router_port} is also a server port "
                    f"({self.ports[0]}-{self.ports[-1]}); pick another"
                )
            metrics_port = self.metrics_port
            _check_port(metrics_port, "--router-metrics-port")
            if metrics_port in (*self.ports, self.router_port):
                raise ValueError(
                    f"--router-metrics-port {metrics_port} is also a server or the router's port; pick another"
                )
        if self.router_policy not in ROUTER_POLICIES:
            raise ValueError(
                f"--router-policy {self.router_policy!r}: choose one of {', '.join(ROUTER_POLICIES)}"
            )
        for url in self.router_workers:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--router-worker {url!r} must be a URL like http://node2:{BASE_PORT}")
        if self.router_workers and not self.router:
            raise ValueError("--router-worker needs --router")
        if self.settings is not None:
            given = [
                name
                for name, value in (
                    ("--no-mtp", not self.mtp),
                    ("--mem-fraction", self.mem_fraction is not None),
                    ("--max-running-requests", self.max_running_requests is not None),
                )
                if value
            ]
            if given:
                raise ValueError(f"--settings already sets what {', '.join(given)} would; drop one of them")
            if self.engine == "sim" and not self.settings.simulated:
                raise ValueError(
                    f"--settings {self.settings.label}: --engine sim models MTP (NEXTN, EAGLE), drafters "
                    "(EAGLE3, STANDALONE, DFLASH: docs/simulator.md) or speculation off, not NGRAM; serve these "
                    "settings with --engine sglang"
                )
        if self.mem_fraction is not None and not 0.0 < self.mem_fraction < 1.0:
            raise ValueError(f"--mem-fraction {self.mem_fraction} must be between 0 and 1 (e.g. 0.85)")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"--max-running-requests {self.max_running_requests} must be >= 1")
        if self.engine == "sim":
            get_profile(self.effective_sim_profile)  # raises with the valid names
            parse_faults(list(self.sim_faults))  # raises naming the bad fault
            if self.sim_speed <= 0:
                raise ValueError(f"--sim-speed {self.sim_speed} must be > 0")
        elif self.sim_faults or self.sim_profile:
            raise ValueError("--sim-profile and --sim-fault only apply with --engine sim")
        if not self.run_name or "/" in self.run_name or self.run_name in (".", ".."):
            raise ValueError(f"--run {self.run_name!r} must be a plain folder name")
        positive = {
            "--timeout": self.startup_timeout_s,
            "--poll-interval": self.poll_interval_s,
            "--probe-timeout": self.probe_timeout_s,
            "--grace": self.stop_grace_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} {value:g} must be > 0 seconds")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts {self.max_restarts} must be >= 0")
        if self.restart_backoff_s < 0:
            raise ValueError(f"--restart-backoff {self.restart_backoff_s:g} must be >= 0 seconds")

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
    def served_model(self) -> str:
        return served_model_name(self.model, self.extra_args)

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_name
