"""Checks made before any process starts, so a mistake costs one line and nothing else."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from draftgen.defaults import SGLANG_PYTHON_ENV
from draftgen.exit_codes import Refused
from draftgen.paths import resolve_path
from draftgen.serve.config import ROUTER_MODULE, ROUTER_PIN, ROUTER_PYTHON, ServeConfig
from draftgen.serve.environment import described, probe


class ServeRefused(Refused):
    """serve's (and tune's) checks before a server starts: a port busy, the engine or SMG not installed, the model
    path missing (exit code REFUSED)."""


def port_in_use(host: str, port: int) -> bool:
    """True when something listens on ``host:port`` (bound like a server: SO_REUSEADDR, so TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_ports(host: str, ports: list[int]) -> None:
    busy = [port for port in ports if port_in_use(host, port)]
    if busy:
        listed = ", ".join(map(str, busy))
        raise ServeRefused(
            f"port{'s' if len(busy) > 1 else ''} {listed} on {host} already in use (another server still "
            f"running? see `ss -ltnp`); stop it or choose another --base-port / --router-port"
        )


def check_engine(config: ServeConfig) -> None:
    """For real SGLang: the interpreter's environment has sglang, with the openai its pin asks for (draftgen's
    openai>=3 beside it means the two environments were merged), and a local model path exists. One short
    subprocess: seconds before any GPU is touched (``draftgen.serve.environment``)."""
    if config.engine != "sglang":
        return
    env = probe(config.python, "sglang", "openai")
    where = described(config.python)
    if not env.importable.get("sglang"):
        raise ServeRefused(
            f"{where} has no sglang: SGLang lives in an environment of its own (it pins openai==2.8.0, draftgen "
            f"needs openai>=3); pass --python /path/to/sglang-env/bin/python or export "
            f'{SGLANG_PYTHON_ENV}=/path/to/sglang-env/bin/python (README, "On the GPU node"; '
            "--engine sim rehearses without a GPU)"
        )
    pin, have = env.pinned("openai"), env.versions.get("openai")
    if pin is not None and have != pin:
        raise ServeRefused(
            f"{where} has sglang {env.versions.get('sglang')} with openai {have or '(none)'}, but sglang pins "
            f"openai=={pin}: SGLang's environment was changed (draftgen installed into it? draftgen, openai>=3, "
            f"belongs in its own); restore it with `{config.python} -m pip install 'openai=={pin}'`, or point "
            "--python at an environment with SGLang alone"
        )
    looks_local = config.model.startswith(("/", "./", "../", "~"))
    if looks_local and not resolve_path(config.model).exists():
        raise ServeRefused(f"--model {config.model}: no such file or folder (a RAM disk not mounted yet?)")


def check_router(config: ServeConfig) -> None:
    """With --router: SMG importable by draftgen's own interpreter (the ``router`` extra installs it there, and serve
    runs it there), else the command that installs it."""
    if config.router and not probe(ROUTER_PYTHON, ROUTER_MODULE).importable.get(ROUTER_MODULE):
        raise ServeRefused(
            f"--router: {described(ROUTER_PYTHON)} has no SMG ({ROUTER_MODULE}); install it there (this checkout's "
            f"requirements.txt holds it, or `{ROUTER_PYTHON} -m pip install '{ROUTER_PIN}'`), or leave out --router"
        )


def default_run_name(out_dir: Path) -> str:
    """A timestamp, with a -2, -3 ... suffix if a run of that second already exists."""
    stem = time.strftime("%Y%m%d-%H%M%S")
    name, counter = stem, 1
    while (out_dir / name).exists():
        counter += 1
        name = f"{stem}-{counter}"
    return name


def check_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(
            f"{run_dir} already holds a run; choose another --run name (runs are never overwritten)"
        )
