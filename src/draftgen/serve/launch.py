"""Pure functions from a ServeConfig to the exact command lines and environments ``draftgen serve`` runs.

``--dry-run`` prints :func:`shell_line` of each spec, so what is printed is what would be executed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from draftgen.client.introspect import HEALTH_GENERATE
from draftgen.serve.config import MTP_ARGS, ROUTER_PYTHON, ServeConfig
from draftgen.sglang_rules.parsers import reasoning_parser, tool_call_parser


@dataclass(frozen=True)
class LaunchSpec:
    """One process to run: a server on a GPU group, or the router."""

    name: str  # "server-30000" or "router-30100": also the log file's stem
    role: str  # "server" or "router"
    port: int
    url: str
    gpus: tuple[int, ...]
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # added to the inherited environment
    health_path: str  # the endpoint whose 200 means ready

    @property
    def label(self) -> str:
        where = f"GPU {','.join(map(str, self.gpus))}" if self.gpus else "router"
        return f"{self.role} :{self.port} ({where})"


def shell_line(spec: LaunchSpec) -> str:
    """The command as one shell line, environment assignments first, every word quoted as needed."""
    assignments = [f"{key}={shlex.quote(value)}" for key, value in spec.env]
    return " ".join([*assignments, shlex.join(spec.argv)])


def _tool_call_parser(config: ServeConfig) -> list[str]:
    """``--tool-call-parser`` for the model's family, so the target's calls come back as ``tool_calls`` (SGLang
    starts without one: calls would stay text in content); none when the extra arguments already name one."""
    if any(a == "--tool-call-parser" or a.startswith("--tool-call-parser=") for a in config.extra_args):
        return []
    return ["--tool-call-parser", tool_call_parser(config.model_family)]


def _sglang_argv(config: ServeConfig, port: int, tp: int) -> list[str]:
    argv = [
        config.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        config.model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--reasoning-parser",
        reasoning_parser(config.model_family),
        "--enable-metrics",
        *_tool_call_parser(config),
        "--enable-cache-report",  # usage.prompt_tokens_details.cached_tokens: generate stores it per turn
    ]
    if tp > 1:
        argv += ["--tp-size", str(tp)]
    if config.settings is not None:
        return argv + config.settings.sglang_args() + list(config.extra_args)
    if config.mem_fraction is not None:
        argv += ["--mem-fraction-static", f"{config.mem_fraction:g}"]
    if config.batch_cap is not None:
        argv += ["--max-running-requests", str(config.batch_cap)]
    if config.mtp:
        argv += list(MTP_ARGS)
    return argv + list(config.extra_args)


def _sim_argv(config: ServeConfig, port: int) -> list[str]:
    argv = [
        config.python,
        "-m",
        "draftgen.sim.server",
        "--port",
        str(port),
        "--host",
        config.host,
        "--model",
        config.served_model,
        "--model-path",
        config.model,
        "--profile",
        config.effective_sim_profile,
        "--speed",
        f"{config.sim_speed:g}",
        "--enable-cache-report",
    ]
    if config.batch_cap is not None:
        argv += ["--max-running-requests", str(config.batch_cap)]
    argv += _tool_call_parser(config)
    if config.settings is not None:
        argv += config.settings.sim_args()
    for spec in config.sim_faults:
        argv += ["--fault", spec]
    return argv


def server_specs(config: ServeConfig) -> list[LaunchSpec]:
    """One spec per GPU group, ports counting up from --base-port."""
    specs = []
    for gpus, port, url in zip(config.groups, config.ports, config.urls, strict=True):
        if config.engine == "sglang":
            argv = _sglang_argv(config, port, len(gpus))
        else:
            argv = _sim_argv(config, port)
        env = (("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus))), ("PYTHONUNBUFFERED", "1"))
        specs.append(
            LaunchSpec(
                name=f"server-{port}",
                role="server",
                port=port,
                url=url,
                gpus=gpus,
                argv=tuple(argv),
                env=env,
                health_path=HEALTH_GENERATE,
            )
        )
    return specs


def router_argv(
    python: str,
    workers: list[str] | tuple[str, ...],
    *,
    host: str,
    port: int,
    metrics_port: int,
    policy: str = "cache_aware",
) -> list[str]:
    """SMG, SGLang's gateway (PyPI ``smg``: a Rust binary in a Python wheel), in front of ``workers``.

    ``python -m smg launch`` is the ``smg launch`` command run by draftgen's own interpreter (the ``router`` extra
    installs SMG in draftgen's environment), so one check (``import smg``) tells whether it can start. Its Prometheus metrics listen on their own port
    (``--prometheus-port``; 29000 when not given, which two gateways on one machine would fight over), not on
    the API port. The policy names are SMG's own (:data:`draftgen.serve.config.ROUTER_POLICIES`).
    """
    return [
        python,
        "-m",
        "smg",
        "launch",
        "--worker-urls",
        *workers,
        "--policy",
        policy,
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
    ]


def router_spec(config: ServeConfig) -> LaunchSpec:
    """SMG in front of this node's servers and any --router-worker URLs."""
    argv = router_argv(
        ROUTER_PYTHON,
        [*config.urls, *config.router_workers],
        host=config.host,
        port=config.router_port,
        metrics_port=config.metrics_port,
        policy=config.router_policy,
    )
    return LaunchSpec(
        name=f"router-{config.router_port}",
        role="router",
        port=config.router_port,
        url=config.router_url,
        gpus=(),
        argv=tuple(argv),
        env=(("PYTHONUNBUFFERED", "1"),),
        # SMG's /health (and /liveness) answer 200 as soon as it listens, while its workers may still be registering
        # in the background; /readiness answers 503 until at least one worker is registered and healthy (measured:
        # docs/engines.md).
        health_path="/readiness",
    )


def ignored_options(config: ServeConfig) -> list[str]:
    """Options that have no effect with --engine sim (reported, so a dry run is not misleading)."""
    if config.engine != "sim":
        return []
    ignored = []
    if config.mem_fraction is not None:
        ignored.append("--mem-fraction")
    if config.tp > 1:
        ignored.append("--tp (the simulator has no tensor parallelism; GPUs are still grouped)")
    if config.extra_args:
        ignored.append("extra SGLang args after --")
    return ignored
