"""``draftgen smoke -f params/b200x7.yaml ... -p prompts FILE --name NAME``: generate then validate on a slice of the
prompt file, with the production settings, before the benchmark and the long run.

The seeds' run failed in ways a short check with their own settings would have shown: 87% of the answers came back
empty. So the smoke run takes enough prompts to arm generate's garbage guard (twice ``guard_min_results``), keeps
the production ``max_tokens`` and every other setting of the files it is given, and then runs validate's gate on
what it made. Both steps run as ``draftgen run`` runs them (their notebooks, their own run folders:
``outputs/generate/NAME`` and ``outputs/validate/NAME``); the exit code says whether both passed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from draftgen.exit_codes import ExitCode
from draftgen.paths import resolve_path
from draftgen.rundir.layout import MANIFEST, PARAMETERS
from draftgen.runner import (
    RunPlan,
    add_parameter_options,
    check_parameters,
    cli_parameters,
    declared_parameters,
    execute,
    headline,
    is_refusal,
    plan_run,
    resolve_notebook,
    taken_parameters,
)

GUARD_ROUNDS = (
    2  # the smoke run's prompts: this many times guard_min_results (armed for the second half at least)
)


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "smoke",
        help="generate then validate on enough prompts to arm the garbage guard, with the production settings",
        description="Run generate on the first prompts of the file (twice guard_min_results: the garbage guard "
        "is armed), with the settings of the -f files (production max_tokens), then validate on that folder; "
        "minutes on the GPU node, before benchmark. Exit code 0 when both passed, 1 when one failed, 3 when a "
        "check before any work refused (nothing was sent).",
    )
    add_parameter_options(parser)
    parser.add_argument("--name", default="smoke", help="both run folders' name (default smoke)")
    parser.add_argument(
        "--out-root",
        type=resolve_path,
        default="outputs",
        help="root of run folders (default outputs; relative: under the project root, docs/design.md#paths)",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML reports")
    parser.set_defaults(handler=run)


def guard_min_results(given: dict[str, Any]) -> int:
    """The results the guard waits for, as the generate run will have it (given, else its config's default)."""
    from draftgen.generate.config import GenerateConfig

    value = given.get("guard_min_results", GenerateConfig.model_fields["guard_min_results"].default)
    return int(value)


def generate_parameters(given: dict[str, Any]) -> dict[str, Any]:
    """generate's parameters: those given, and a ``limit`` that arms the guard (a smaller one is refused)."""
    need = guard_min_results(given)
    limit = given.get("limit") or GUARD_ROUNDS * need
    if limit < need:
        raise ValueError(
            f"limit {limit} is below guard_min_results {need}: the smoke run would end before the garbage guard "
            f"may halt it; leave limit out (the smoke run takes {GUARD_ROUNDS * need})"
        )
    return {**given, "limit": limit}


def validate_parameters(given: dict[str, Any], generation_dir: Path, tokenizer: str | None) -> dict[str, Any]:
    """validate's parameters: the generate folder, the tokenizer generate ran with, and the shared names given."""
    from draftgen.params import SHARED_PARAMETERS

    values = {name: value for name, value in given.items() if name in SHARED_PARAMETERS}
    values["generation_dir"] = str(generation_dir)
    if tokenizer:
        values["tokenizer"] = tokenizer
    return values


def _run(plan: RunPlan, html: bool) -> tuple[ExitCode, str]:
    """Execute one step's notebook: OK, or FAILED / REFUSED (a check before any work) with the notebook's error."""
    print(f"draftgen smoke: {plan.notebook} → {plan.run_dir}", flush=True)
    try:
        execute(plan, html=html)
    except Exception as exc:
        block = headline(plan)
        if block:
            print("\n" + block + "\n", file=sys.stderr)
        said = getattr(exc, "evalue", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        code = ExitCode.REFUSED if is_refusal(plan, exc) else ExitCode.FAILED
        return code, f"{getattr(exc, 'ename', type(exc).__name__)}: {said}"
    block = headline(plan)
    if block:
        print("\n" + block + "\n")
    return ExitCode.OK, ""


def _recorded(run_dir: Path, name: str) -> Any:
    """A value of the run's parameters.yaml (what the step ran with, filled in from the servers)."""
    import yaml

    path = run_dir / PARAMETERS
    return (yaml.safe_load(path.read_text()) or {}).get(name) if path.exists() else None


def answered_turns(run_dir: Path) -> int:
    """Turns answered over the run's sessions (what the guard counts)."""
    path = run_dir / MANIFEST
    if not path.exists():
        return 0
    sessions = json.loads(path.read_text()).get("sessions") or []
    return sum(int(session.get("turns") or 0) for session in sessions)


def run(args: argparse.Namespace) -> int:
    given = cli_parameters(args)
    out_root = args.out_root
    generate = resolve_notebook("generate")
    generate_values = taken_parameters(
        declared_parameters(generate), generate_parameters(given), command="smoke", step="generate"
    )
    check_parameters(generate, generate_values)
    generate_plan = plan_run(generate, generate_values, name=args.name, out_root=out_root)
    validate = resolve_notebook("validate")
    plan_run(
        validate, {}, name=args.name, out_root=out_root
    )  # a finished validate folder is refused up front

    code, said = _run(generate_plan, not args.no_html)
    need = guard_min_results(given)
    turns = answered_turns(generate_plan.run_dir)
    if code != ExitCode.OK:
        what = (
            "REFUSED before generating"
            if code == ExitCode.REFUSED
            else f"FAIL at generate ({turns:,} turns answered)"
        )
        print(f"draftgen smoke: {what}: {said}", file=sys.stderr)
        print(f"draftgen smoke: see {generate_plan.executed_path}", file=sys.stderr)
        return code
    if turns < need:
        print(
            f"draftgen smoke: FAIL: only {turns:,} turns were answered, fewer than guard_min_results {need}, so the "
            "garbage guard never armed: give a prompt file with more prompts",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    tokenizer = given.get("tokenizer") or _recorded(generate_plan.run_dir, "tokenizer")
    if not tokenizer:
        print(
            "draftgen smoke: FAIL: validate needs the target's tokenizer and generate ran without one: "
            "-p tokenizer /path/to/model-folder",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    values = taken_parameters(
        declared_parameters(validate),
        validate_parameters(given, generate_plan.run_dir, tokenizer),
        command="smoke",
        step="validate",
    )
    check_parameters(validate, values)
    validate_plan = plan_run(validate, values, name=args.name, out_root=out_root)
    code, said = _run(validate_plan, not args.no_html)
    if code != ExitCode.OK:
        print(f"draftgen smoke: FAIL at validate: {said}", file=sys.stderr)
        print(f"draftgen smoke: see {validate_plan.executed_path}", file=sys.stderr)
        return code
    print(
        f"draftgen smoke: PASS — {turns:,} turns answered with the garbage guard armed (from result {need}), "
        f"validate's gate passed: {generate_plan.run_dir}, {validate_plan.run_dir}"
    )
    return ExitCode.OK
