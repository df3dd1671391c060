"""``draftgen sim``: run a simulated SGLang fleet in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import time

from draftgen.defaults import BASE_PORT, FLEET_SIZE, MODEL
from draftgen.exit_codes import ExitCode, Refused
from draftgen.paths import resolve_path
from draftgen.sglang_rules.parsers import DEFAULT_FAMILY, TOOL_CALL_PARSER
from draftgen.sim.faults import FAULT_KEYS
from draftgen.sim.fleet import FleetError, SimFleet
from draftgen.sim.prefix_cache import add_cache_flags, cache_settings
from draftgen.sim.profiles import PROFILES, get_profile
from draftgen.sim.speculative import (
    StartupError,
    add_sglang_flags,
    apply_settings,
    settings_argv,
    sim_settings,
)


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="run simulated SGLang servers on 127.0.0.1 (the test bed and dry run)",
        description="Simulated SGLang servers on 127.0.0.1, ports P..P+N-1, one process each. Ctrl-C stops them all.",
    )
    parser.add_argument(
        "--servers", type=int, default=FLEET_SIZE, help="number of servers (default %(default)s)"
    )
    parser.add_argument(
        "--base-port", type=int, default=BASE_PORT, help="port of the first server (default %(default)s)"
    )
    parser.add_argument("--profile", default="b200-mtp", help=f"hardware profile: {', '.join(PROFILES)}")
    parser.add_argument("--speed", type=float, default=1.0, help="run the clock X times faster (default 1)")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"inject a fault or quirk, repeatable; keys: {', '.join(FAULT_KEYS)}",
    )
    parser.add_argument("--model", default=MODEL, help="served model name (default %(default)s)")
    add_sglang_flags(parser)  # --speculative-*, --max-running-requests, --mem-fraction-static
    add_cache_flags(parser)  # --disable-radix-cache, --enable-cache-report
    parser.add_argument(
        "--work-dir", type=resolve_path, default=None, help="where ground-truth JSONL and logs go"
    )
    parser.add_argument("--seed", type=int, default=0, help="salts which requests get faults")
    parser.add_argument(
        "--tokenizer",
        type=resolve_path,
        default=None,
        metavar="DIR",
        help="a Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json with a chat_template) whose "
        "ids the servers report (default: the tiny Qwen3-format tokenizer, copied into the work dir from the user's cache)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=TOOL_CALL_PARSER[DEFAULT_FAMILY],
        metavar="NAME",
        help="SGLang's --tool-call-parser, as draftgen serve starts the target's family (default %(default)s, which "
        "reads the simulated model's calls); none: calls stay text in content, as SGLang without a parser",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.servers < 1:
        raise ValueError("--servers must be >= 1")
    if not 1 <= args.base_port <= 65535 - args.servers + 1:
        raise ValueError(f"--base-port {args.base_port} is not a usable port")
    flags = sim_settings(args)
    try:
        apply_settings(get_profile(args.profile), flags)  # refuse settings that cannot start, before spawning
    except StartupError as exc:
        raise ValueError(f"these settings would not start: {exc}") from None
    try:
        fleet = SimFleet(
            servers=args.servers,
            base_port=args.base_port,
            profile=args.profile,
            speed=args.speed,
            faults=args.fault,
            server_args=[*settings_argv(flags), *cache_settings(args).argv()],
            work_dir=args.work_dir,
            seed=args.seed,
            tokenizer=args.tokenizer,
            model=args.model,
            tool_call_parser=None if args.tool_call_parser in ("", "none") else args.tool_call_parser,
        )
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    stop_requested = []
    previous = {sig: signal.signal(sig, lambda *_: stop_requested.append(1)) for sig in (signal.SIGTERM,)}
    try:
        fleet.start(wait="none")
        print(
            f"draftgen sim: {args.servers} server(s), profile {args.profile}, speed {args.speed:g}x, "
            f"faults: {', '.join(args.fault) or 'none'}"
        )
        for url in fleet.urls:
            print(f"  {url}")
        print(f"  ground truth and logs: {fleet.directory}")
        print(f"  tokenizer (the ids the servers report): {fleet.tokenizer}")
        fleet.wait("listening", timeout=120)
        print("draftgen sim: listening; /health turns 200 after warm-up. Ctrl-C stops the fleet.", flush=True)
        reported: set[int] = set()
        while not stop_requested:
            for index in range(args.servers):
                code = fleet.returncode(index)
                if code is not None and index not in reported:
                    reported.add(index)
                    print(f"draftgen sim: server {fleet.urls[index]} exited with code {code}", flush=True)
            if len(reported) == args.servers:
                print("draftgen sim: every server has exited", flush=True)
                return ExitCode.FAILED
            time.sleep(0.5)
    except Refused:  # a port taken: exit code REFUSED
        raise
    except FleetError as exc:
        raise ValueError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        fleet.stop()
        print("draftgen sim: stopped", flush=True)
    return ExitCode.OK
