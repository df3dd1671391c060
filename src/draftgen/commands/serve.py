"""``draftgen serve``: launch one SGLang server per GPU group and supervise them in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from draftgen.defaults import BASE_PORT, MODEL
from draftgen.rundir.layout import COMMANDS
from draftgen.serve.config import (
    DEFAULT_ROUTER_PORT,
    ENGINES,
    ROUTER_MODULE,
    ROUTER_PIN,
    ROUTER_POLICIES,
    ServeConfig,
    parse_gpus,
)
from draftgen.serve.launch import ignored_options, router_spec, server_specs, shell_line
from draftgen.serve.preflight import check_engine, check_ports, check_run_dir, default_run_name, importable
from draftgen.serve.records import write_commands
from draftgen.serve.supervisor import Supervisor
from draftgen.serve.view import LineView, TableView
from draftgen.server_settings import load_settings
from draftgen.sglang_rules.parsers import DEFAULT_FAMILY, FAMILIES
from draftgen.sglang_rules.speculation import SPEC_DEFAULT_MAX_RUNNING
from draftgen.sim.faults import FAULT_KEYS
from draftgen.sim.profiles import PROFILES


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="launch and supervise one SGLang server per GPU (or GPU group), MTP on",
        description=(
            "Start one SGLang server per GPU group on ports from --base-port, follow each through start-up "
            "(refused → 503 → 200 on /health_generate), write RUN/servers.yaml for papermill -f, and keep "
            "them running until Ctrl-C. Arguments after -- go to every server unchanged."
        ),
        epilog="Example: draftgen serve --model /dev/shm/Qwen3.6-27B --gpus 0-6 --max-running-requests 64",
    )
    what = parser.add_argument_group("what to run")
    what.add_argument("--model", default=None, help="model path or Hugging Face id (--model-path)")
    what.add_argument("--gpus", required=True, help="GPU indices: 0-6, 0,2,4 or 0-3,6")
    what.add_argument("--tp", type=int, default=1, help="GPUs per server (consecutive in --gpus; default 1)")
    what.add_argument(
        "--base-port", type=int, default=BASE_PORT, help="first server's port (default %(default)s)"
    )
    what.add_argument(
        "--host", default="127.0.0.1", help="bind address (0.0.0.0 for other nodes; default 127.0.0.1)"
    )
    what.add_argument("--no-mtp", action="store_true", help="leave speculative decoding (MTP / NEXTN) off")
    what.add_argument("--mem-fraction", type=float, default=None, help="--mem-fraction-static (e.g. 0.85)")
    what.add_argument("--max-running-requests", type=int, default=None, help="batch cap per server")
    what.add_argument(
        "--settings",
        type=Path,
        default=None,
        metavar="FILE",
        help="speculative settings and batch cap chosen by draftgen tune (replaces --no-mtp, --mem-fraction, "
        "--max-running-requests)",
    )
    what.add_argument(
        "--engine", choices=ENGINES, default="sglang", help="sglang (default) or sim (simulated)"
    )
    what.add_argument(
        "--model-family",
        choices=FAMILIES,
        default=DEFAULT_FAMILY,
        help="the model's family, which picks SGLang's --reasoning-parser and --tool-call-parser "
        "(default %(default)s: Qwen3.5/3.6, tool calls read by qwen3_coder; qwen3: by qwen)",
    )
    what.add_argument(
        "--python", default=sys.executable, help="interpreter that runs the servers (default: this one)"
    )
    what.add_argument("--dry-run", action="store_true", help="print the exact commands and exit")
    what.add_argument(
        "extra", nargs="*", metavar="-- EXTRA", help="arguments passed to every server unchanged"
    )

    watch = parser.add_argument_group("supervision")
    watch.add_argument("--restart", action="store_true", help="bring crashed or stuck servers back")
    watch.add_argument(
        "--max-restarts", type=int, default=3, help="failures in a row before giving up (default 3)"
    )
    watch.add_argument(
        "--restart-backoff", type=float, default=10.0, help="first restart delay, doubling (default 10s)"
    )
    watch.add_argument(
        "--timeout", type=float, default=1800.0, help="start-up deadline per server (default 1800s)"
    )
    watch.add_argument(
        "--poll-interval", type=float, default=1.0, help="seconds between health probes (default 1)"
    )
    watch.add_argument(
        "--probe-timeout", type=float, default=30.0, help="seconds one probe may take (default 30)"
    )
    watch.add_argument(
        "--grace", type=float, default=20.0, help="SIGTERM → SIGKILL grace on stop (default 20s)"
    )
    watch.add_argument(
        "--out", type=Path, default=Path("outputs/serve"), help="runs folder (default outputs/serve)"
    )
    watch.add_argument("--run", default=None, help="run folder name (default: a timestamp)")
    watch.add_argument("--plain", action="store_true", help="event lines only, no live table")

    routing = parser.add_argument_group("router: SMG, SGLang's gateway (multi-node)")
    routing.add_argument(
        "--router", action="store_true", help="put SMG, SGLang's gateway, in front of the servers"
    )
    routing.add_argument(
        "--router-port", type=int, default=DEFAULT_ROUTER_PORT, help="router port (default 30100)"
    )
    routing.add_argument(
        "--router-policy",
        choices=ROUTER_POLICIES,
        default="cache_aware",
        help="how SMG picks a worker, by SMG's names (default cache_aware)",
    )
    routing.add_argument(
        "--router-metrics-port",
        type=int,
        default=None,
        help="the router's own Prometheus /metrics port (default: --router-port + 1)",
    )
    routing.add_argument(
        "--router-worker",
        action="append",
        default=[],
        metavar="URL",
        help="a worker on another node, repeatable",
    )

    sim = parser.add_argument_group("--engine sim (tests and rehearsals)")
    sim.add_argument(
        "--sim-profile", default=None, help=f"profile: {', '.join(PROFILES)} (default from --no-mtp)"
    )
    sim.add_argument("--sim-speed", type=float, default=1.0, help="simulated clock speed-up (default 1)")
    sim.add_argument(
        "--sim-fault", action="append", default=[], metavar="KEY=VALUE", help=f"keys: {', '.join(FAULT_KEYS)}"
    )
    parser.set_defaults(handler=run)


def build_config(args: argparse.Namespace, run_name: str) -> ServeConfig:
    if args.extra and not args.extra[0].startswith("-"):
        raise ValueError(f"unexpected argument {args.extra[0]!r}; extra server arguments go after --")
    model = args.model
    if model is None:
        if args.engine == "sglang":
            raise ValueError(
                "--model is required: the model path (e.g. /dev/shm/Qwen3.6-27B) or Hugging Face id"
            )
        model = MODEL
    return ServeConfig(
        model=model,
        gpus=parse_gpus(args.gpus),
        base_port=args.base_port,
        tp=args.tp,
        mtp=not args.no_mtp,
        mem_fraction=args.mem_fraction,
        max_running_requests=args.max_running_requests,
        engine=args.engine,
        model_family=args.model_family,
        extra_args=tuple(args.extra),
        settings=load_settings(args.settings) if args.settings else None,
        host=args.host,
        python=args.python,
        sim_profile=args.sim_profile,
        sim_speed=args.sim_speed,
        sim_faults=tuple(args.sim_fault),
        router=args.router,
        router_port=args.router_port,
        router_workers=tuple(args.router_worker),
        router_policy=args.router_policy,
        router_metrics_port=args.router_metrics_port,
        out_dir=args.out,
        run_name=run_name,
        startup_timeout_s=args.timeout,
        poll_interval_s=args.poll_interval,
        probe_timeout_s=args.probe_timeout,
        restart=args.restart,
        max_restarts=args.max_restarts,
        restart_backoff_s=args.restart_backoff,
        stop_grace_s=args.grace,
    )


def _notes(config: ServeConfig) -> list[str]:
    notes = [f"--engine sim ignores {item}" for item in ignored_options(config)]
    if (
        config.engine == "sglang"
        and config.mtp
        and config.max_running_requests is None
        and not config.settings
    ):
        notes.append(
            f"with speculative decoding SGLang runs at most {SPEC_DEFAULT_MAX_RUNNING} requests per server unless "
            f"--max-running-requests is set; more in flight only queue"
        )
    return notes


def run(args: argparse.Namespace) -> int:
    config = build_config(args, args.run or default_run_name(args.out))
    servers = server_specs(config)
    router = router_spec(config) if config.router else None
    for note in _notes(config):
        print(f"note: {note}", file=sys.stderr)
    if args.dry_run:
        for spec in servers:
            print(shell_line(spec))
        if router is not None:
            print(shell_line(router))
        return 0

    check_engine(config)
    start_router = router is not None and importable(config.python, ROUTER_MODULE)
    ports = list(config.ports) + ([config.router_port, config.metrics_port] if start_router else [])
    check_ports(config.host, ports)
    check_run_dir(config.run_dir)
    try:
        config.run_dir.mkdir(parents=True, exist_ok=True)
        write_commands(config.run_dir / COMMANDS, [*servers, *([router] if router else [])])
    except OSError as exc:
        raise ValueError(
            f"cannot write the run folder {config.run_dir}: {exc.strerror or exc}; check --out"
        ) from None

    groups = "GPU " + " | ".join(",".join(map(str, g)) for g in config.groups)
    print(
        f"draftgen serve: {len(servers)} server(s) on {groups}, engine {config.engine}, "
        f"{config.settings.label if config.settings else 'MTP ' + ('on' if config.mtp else 'off')}; "
        f"run folder {config.run_dir}"
    )
    for spec in servers:
        print(f"  {spec.url}  log {config.run_dir / (spec.name + '.log')}")
    if router is not None:
        print(f"  router: {shell_line(router)}")
        if not start_router:
            print(
                f"  router not started: {ROUTER_MODULE} is not importable by {config.python} "
                f"(pip install {ROUTER_PIN}); servers.yaml will list the servers themselves"
            )
            router = None
    print(f"  servers.yaml is written to {config.run_dir} once every server is ready", flush=True)

    view = TableView() if sys.stdout.isatty() and not args.plain else LineView()
    return asyncio.run(Supervisor(config, servers, router, view).run())
