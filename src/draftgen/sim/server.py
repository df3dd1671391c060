"""One simulated SGLang server as a process: its app wiring and its entry point.

SGLang's HTTP surfaces (docs/engines.md) live one per module (``openai_api``, ``native_api``, ``admin_api``)
and share one core, ``draftgen.sim.core.SimServer``: ground truth, start-up, request planning and injected
admission faults.

Run as a process: ``python -m draftgen.sim.server --port P [--profile NAME] [--speed X] [--fault K=V ...]``.
Extra, non-SGLang endpoints live under ``/sim/`` (ground truth and the profile's capacity curve).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from draftgen.defaults import MODEL
from draftgen.sim.admin_api import AdminApi
from draftgen.sim.core import ServerConfig, SimServer, model_tokenizer
from draftgen.sim.defaults import EXIT_PORT_IN_USE, EXIT_STARTUP_FAILED, PARENT_PID_ENV
from draftgen.sim.faults import Faults, parse_faults
from draftgen.sim.native_api import NativeApi
from draftgen.sim.openai_api import OpenAIApi
from draftgen.sim.prefix_cache import add_cache_flags, cache_settings
from draftgen.sim.profiles import get_profile
from draftgen.sim.speculative import (
    StartupError,
    add_sglang_flags,
    apply_settings,
    sim_settings,
    startup_warnings,
)
from draftgen.sim.tokenizer import SimTokenizer, TokenizerFolderError

SHUTDOWN_GRACE_S = 0.5  # on SIGTERM, in-flight requests get about this long before their connections drop


# ----- process entry point -----------------------------------------------------------------------------------
def build_app(server: SimServer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    for surface in (OpenAIApi(server), NativeApi(server), AdminApi(server)):
        app.add_routes(surface.routes())
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
    parser.add_argument("--model", default=MODEL, help="the served model name (SGLang's --served-model-name)")
    parser.add_argument(
        "--model-path",
        default=None,
        help="SGLang's --model-path: reported in /server_info and /model_info; a local folder with a tokenizer is "
        "spoken unless --tokenizer says otherwise (default: --model)",
    )
    parser.add_argument("--profile", default="b200-mtp")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--truth", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="as SGLang's: a parser name (qwen3_coder reads the simulated model's calls); default none: calls "
        "stay text in content",
    )
    add_sglang_flags(parser)
    add_cache_flags(parser)
    parser.add_argument("--die-with-parent", action="store_true")
    return parser.parse_args(argv)


def _refuse_start(error: StartupError, faults: Faults, port: int) -> int:
    """Exit as SGLang does when its settings cannot run: flag errors at once, memory after the weights load."""
    if error.after_load:
        time.sleep(faults.load_delay)
    for line in error.lines:
        print(line, file=sys.stderr)
    print(f"sim server on port {port}: start-up failed, exiting", file=sys.stderr)
    return EXIT_STARTUP_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.die_with_parent:
        _set_parent_death_signal()
    try:
        faults = parse_faults(args.fault)
        base = get_profile(args.profile)
        if args.speed <= 0:
            raise ValueError(f"--speed {args.speed} must be > 0")
    except ValueError as exc:
        print(f"draftgen sim: error: {exc}", file=sys.stderr)
        return 2
    flags = sim_settings(args)
    try:
        for line in startup_warnings(base, flags):
            print(line, file=sys.stderr)
        profile = apply_settings(base, flags)
    except StartupError as error:
        return _refuse_start(error, faults, args.port)
    config = ServerConfig(
        port=args.port,
        host=args.host,
        model=args.model,
        profile=profile,
        speed=args.speed,
        faults=faults,
        truth_path=args.truth,
        seed=args.seed,
        tokenizer=args.tokenizer,
        model_path=args.model_path,
        cache=cache_settings(args),
        tool_call_parser=args.tool_call_parser or None,
    )
    try:
        if args.tokenizer is not None or model_tokenizer(config) is not None:
            # a bad folder fails here, in one line, before the port opens
            SimTokenizer.load(args.tokenizer or model_tokenizer(config))
    except TokenizerFolderError as exc:
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
