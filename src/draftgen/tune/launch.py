"""Start one candidate on one GPU group with serve's launcher, wait until it generates, and stop it.

The command line is serve's own (``draftgen.serve.launch.server_specs`` with the candidate's settings), so what
tune measures is exactly what ``draftgen serve --settings FILE`` runs. A server that exits or misses the start-up
deadline is reported with the tail of its log (an out-of-memory start shows SGLang's message there).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from draftgen.params import build_config
from draftgen.serve.config import PROBE_TIMEOUT_S, STOP_GRACE_S, ServeConfig, ServerParams
from draftgen.serve.launch import LaunchSpec, server_specs
from draftgen.serve.preflight import check_engine, check_ports, port_in_use
from draftgen.serve.process import log_tail, spawn, stop_group
from draftgen.serve.startup import StartupWatch, wait_until_ready
from draftgen.tune.config import Candidate, TuneConfig

POLL_INTERVAL_S = 0.25  # a candidate is probed more often than serve probes its servers
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class Started:
    spec: LaunchSpec
    process: asyncio.subprocess.Process
    log_path: Path
    seconds: float  # process start → ready


@dataclass(frozen=True)
class FailedStart:
    reason: str  # "exited with code 1" / "not ready after 1800 s"
    log_tail: tuple[str, ...]
    log_path: Path


def _serve_config(config: TuneConfig, candidate: Candidate, group_index: int, run_name: str) -> ServeConfig:
    """Serve's config for one candidate on one GPU group: tune's server parameters (the same declarations,
    ``ServerParams``) with that group, its port, the candidate's settings and tune's own polling."""
    shared = {name: getattr(config, name) for name in ServerParams.model_fields}
    return build_config(
        ServeConfig,
        {
            **shared,
            "gpus": ",".join(map(str, config.groups[group_index])),
            "base_port": config.base_port + group_index,
            "extra_args": config.extra_args if config.engine == "sglang" else [],
            "sim_profile": config.sim_profile if config.engine == "sim" else None,
            "settings": candidate.settings,
            "out_dir": Path(config.out_dir) / "servers",
            "run_name": run_name,
            "poll_interval_s": POLL_INTERVAL_S,
        },
    )


def launch_spec(config: TuneConfig, candidate: Candidate, group_index: int, run_name: str) -> LaunchSpec:
    """The one server command for ``candidate`` on GPU group ``group_index`` (serve's own command line)."""
    return server_specs(_serve_config(config, candidate, group_index, run_name))[0]


def preflight(config: TuneConfig, candidate: Candidate) -> None:
    """Serve's own checks before anything starts: SGLang importable, the model path there, every port free."""
    check_engine(_serve_config(config, candidate, 0, "preflight"))
    check_ports(config.host, [config.base_port + i for i in range(len(config.groups))])


async def start(spec: LaunchSpec, log_path: Path, timeout_s: float) -> Started | FailedStart:
    """Spawn and probe until ``/health_generate`` answers 200 (serve's own start-up watch); on exit or timeout stop
    it and say why.

    Each job has a log of its own, so the whole log is this attempt's. The port is checked again first: tune's
    preflight saw it free, but another process may have taken it since, and then that process's health answers
    would pass for the candidate's (a shared machine showed exactly that: a simulator answered 200 while the
    candidate was still importing, and the job measured the wrong server)."""
    host = urlsplit(spec.url).hostname or "127.0.0.1"
    if port_in_use(host, spec.port):
        return FailedStart(
            f"port {spec.port} on {host} already in use by another process; nothing was started "
            "(free it, or choose another base_port)",
            (),
            log_path,
        )
    began = time.monotonic()
    process = await spawn(spec, log_path)
    watch = StartupWatch(timeout_s, PROBE_TIMEOUT_S, POLL_INTERVAL_S)
    outcome = await wait_until_ready(process, spec.url, spec.health_path, watch, started_at=began)
    if outcome.result == "ready":
        return Started(spec, process, log_path, time.monotonic() - began)
    await stop_group(process, STOP_GRACE_S)  # on an exit: its children, if any
    if outcome.result == "exited":
        reason = f"exited with code {process.returncode} during start-up"
    else:
        reason = f"not ready after {timeout_s:g} s (last stage: {outcome.last_stage})"
    return FailedStart(reason, tuple(log_tail(log_path, LOG_TAIL_LINES, since=0)), log_path)


async def stop(started: Started) -> None:
    await stop_group(started.process, STOP_GRACE_S)
