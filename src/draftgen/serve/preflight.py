"""Checks made before any process starts, so a mistake costs one line and nothing else."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from draftgen.exit_codes import Refused
from draftgen.paths import project_root, resolve_path
from draftgen.serve.config import ROUTER_MODULE, ROUTER_PIN, ServeConfig


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


def importable(python: str, module: str) -> bool:
    """Whether ``python`` (another environment's interpreter, possibly) can import ``module``."""
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, timeout=60, cwd=project_root())
        return done.returncode == 0
    except FileNotFoundError:
        raise ValueError(f"--python {python}: no such interpreter") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"--python {python}: cannot run it ({exc})") from None


def check_engine(config: ServeConfig) -> None:
    """For real SGLang: the interpreter can import sglang, and a local model path exists."""
    if config.engine != "sglang":
        return
    if not importable(config.python, "sglang"):
        raise ServeRefused(
            f"sglang is not importable by {config.python}; install it there (pip install 'sglang[all]') or "
            f"pass --python /path/to/sglang-env/bin/python (try --engine sim to rehearse without a GPU)"
        )
    looks_local = config.model.startswith(("/", "./", "../", "~"))
    if looks_local and not resolve_path(config.model).exists():
        raise ServeRefused(f"--model {config.model}: no such file or folder (a RAM disk not mounted yet?)")


def check_router(config: ServeConfig) -> None:
    """With --router: SMG importable by the interpreter that will run it, else the command that installs it."""
    if config.router and not importable(config.python, ROUTER_MODULE):
        raise ServeRefused(
            f"--router: SMG ({ROUTER_MODULE}) is not importable by {config.python}; install it there with "
            f"`{config.python} -m pip install '{ROUTER_PIN}'` (in draftgen's own environment: "
            "pip install -e '.[router]'), or leave out --router"
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
