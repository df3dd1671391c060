"""``draftgen serve``: launch one SGLang server per GPU group and supervise them in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import sys

from draftgen.defaults import CONCURRENCY_PER_SERVER
from draftgen.exit_codes import ExitCode
from draftgen.flags import add_flags, config_from_flags, given_values
from draftgen.paths import resolve_path
from draftgen.rundir.layout import COMMANDS
from draftgen.serve.config import SERVE_FLAGS, WATCH, WHAT, ServeConfig
from draftgen.serve.launch import ignored_options, router_spec, server_specs, shell_line
from draftgen.serve.preflight import check_engine, check_ports, check_router, check_run_dir, default_run_name
from draftgen.serve.records import write_commands
from draftgen.serve.supervisor import Supervisor
from draftgen.serve.view import LineView, TableView


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="launch and supervise one SGLang server per GPU (or GPU group), MTP on",
        description=(
            "Start one SGLang server per GPU group on ports from --base-port, follow each through start-up "
            "(refused → 503 → 200 on /health_generate), write RUN/servers.yaml for papermill -f, and keep "
            "them running until Ctrl-C. Arguments after -- go to every server unchanged."
        ),
        epilog="Example: draftgen serve --model /dev/shm/Qwen3.6-27B --gpus 0-6 --python /opt/sglang/bin/python",
    )
    groups = {flag.group: None for flag in SERVE_FLAGS}
    sections = {group: parser.add_argument_group(group) for group in groups}
    add_flags(sections, ServeConfig, SERVE_FLAGS)
    sections[WHAT].add_argument("--dry-run", action="store_true", help="print the exact commands and exit")
    sections[WATCH].add_argument("--plain", action="store_true", help="event lines only, no live table")
    parser.set_defaults(handler=run)


def build_config(args: argparse.Namespace) -> ServeConfig:
    """The command line's values, checked all at once (ValueError: one line per problem, by flag)."""
    if args.extra_args and not args.extra_args[0].startswith("-"):
        raise ValueError(f"unexpected argument {args.extra_args[0]!r}; extra server arguments go after --")
    values = given_values(args, SERVE_FLAGS)
    values.setdefault("run_name", default_run_name(resolve_path(args.out_dir)))
    return config_from_flags(ServeConfig, values, SERVE_FLAGS)


def _notes(config: ServeConfig) -> list[str]:
    notes = [f"--engine sim ignores {item}" for item in ignored_options(config)]
    if config.batch_cap is not None and config.batch_cap < CONCURRENCY_PER_SERVER:
        notes.append(
            f"--max-running-requests {config.batch_cap} is below the {CONCURRENCY_PER_SERVER} requests generate keeps "
            "in flight per server by default: its preflight refuses these servers unless concurrency_per_server is "
            f"{config.batch_cap} or less"
        )
    return notes


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    servers = server_specs(config)
    router = router_spec(config) if config.router else None
    for note in _notes(config):
        print(f"note: {note}", file=sys.stderr)
    if args.dry_run:
        for spec in servers:
            print(shell_line(spec))
        if router is not None:
            print(shell_line(router))
        return ExitCode.OK

    check_engine(config)
    check_router(config)
    ports = list(config.ports) + ([config.router_port, config.metrics_port] if router else [])
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
    print(f"  servers.yaml is written to {config.run_dir} once every server is ready", flush=True)

    view = TableView() if sys.stdout.isatty() and not args.plain else LineView()
    return asyncio.run(Supervisor(config, servers, router, view).run())
