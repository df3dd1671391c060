"""Server parameters declared once: serve's command line is built from ``ServeConfig``, tune takes the same
``ServerParams`` declarations, every problem is reported at once, the endpoints are the client's, and SGLang's
algorithm names come from ``sglang_rules`` only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from draftgen.cli import build_parser, main
from draftgen.flags import EXTRA
from draftgen.params import ParameterError, build_config
from draftgen.serve import preflight as serve_preflight
from draftgen.serve.config import ROUTER_PIN, SERVE_FLAGS, ServeConfig, ServerParams
from draftgen.sglang_rules.speculation import SPECULATIVE_ALGORITHMS
from draftgen.tune.config import TuneConfig
from draftgen.tune.launch import launch_spec

SRC = Path(__file__).resolve().parents[1] / "src" / "draftgen"


def _serve_parser():  # type: ignore[no-untyped-def]
    parser = build_parser(["serve"])
    return next(a for a in parser._actions if a.choices and "serve" in a.choices).choices["serve"]


def test_every_serve_setting_is_one_flag_whose_default_and_help_are_the_fields():
    actions = {action.dest: action for action in _serve_parser()._actions}
    internal = {"log_tail_lines"}  # not a user's choice
    assert {flag.field for flag in SERVE_FLAGS} == set(ServeConfig.model_fields) - internal
    for flag in SERVE_FLAGS:
        field, action = ServeConfig.model_fields[flag.field], actions[flag.field]
        assert flag.negates or (field.description and field.description in action.help), flag
        if not field.is_required() and not flag.required:
            assert action.default == field.get_default(call_default_factory=True), flag
        if flag.flag != EXTRA:
            assert flag.flag in action.option_strings, flag
    # the names users' scripts already use
    assert {"--timeout", "--grace", "--out", "--run", "--no-mtp", "--router-worker", "--sim-fault"} <= {
        flag.flag for flag in SERVE_FLAGS
    }


def test_tune_takes_the_server_parameters_serve_takes_declared_once():
    for name, field in ServerParams.model_fields.items():
        assert repr(TuneConfig.model_fields[name]) == repr(field), name
        assert repr(ServeConfig.model_fields[name]) == repr(field), name
    assert ServerParams.model_fields["startup_timeout_s"].default == 1800.0
    actions = {action.dest: action for action in _serve_parser()._actions}
    assert actions["startup_timeout_s"].default == TuneConfig.model_fields["startup_timeout_s"].default


def test_a_candidate_runs_the_command_serve_would_run_for_the_same_values(tmp_path, capsys):
    config = build_config(
        TuneConfig,
        {"model": "/m", "gpus": "2-5", "tp": 2, "base_port": 31000, "out_dir": str(tmp_path / "t")},
    )
    candidate = config.candidates()[1]
    spec = launch_spec(config, candidate, 1, run_name="x")
    settings = tmp_path / "s.yaml"
    from draftgen.server_settings import save_settings

    save_settings(settings, candidate.settings, {})
    assert main(["serve", "--dry-run", "--model", "/m", "--gpus", "4,5", "--tp", "2", "--base-port", "31001",
                 "--settings", str(settings)]) == 0  # fmt: skip
    printed = capsys.readouterr().out.strip()
    from draftgen.serve.launch import shell_line

    assert shell_line(spec) == printed


def test_every_problem_on_the_command_line_is_said_at_once_by_flag(capsys):
    code = main(
        [
            "serve",
            "--dry-run",
            "--gpus",
            "0-1",
            "--mem-fraction",
            "1.5",
            "--max-restarts",
            "-1",
            "--grace",
            "0",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("draftgen serve: error: 4 problems:\n"), err
    for said in (
        "--model is required",
        "--mem-fraction 1.5: ",
        "--max-restarts -1: ",
        "--grace 0.0: ",
    ):
        assert said in err, (said, err)


def test_checks_of_several_settings_together_are_all_reported(capsys):
    code = main(
        ["serve", "--dry-run", "--model", "m", "--gpus", "0-1", "--router-worker", "http://n2:30000",
         "--no-mtp", "--settings", str(Path(__file__).with_name("missing.yaml")), "--sim-profile", "instant"]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--settings" in err and "does not exist" in err  # one field's own problem stops the joint checks
    code = main(
        ["serve", "--dry-run", "--model", "m", "--gpus", "0-6", "--tp", "2", "--router-worker", "http://n2:30000",
         "--sim-profile", "instant"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "3 problems" in err, err
    assert "--tp 2 does not divide the 7 GPUs of --gpus" in err
    assert "--router-worker needs --router" in err
    assert "--sim-profile and --sim-fault only apply with --engine sim" in err


def test_tune_names_the_same_problems_by_its_parameter_names():
    with pytest.raises(ParameterError) as caught:
        build_config(TuneConfig, {"model": "m", "gpus": "0-6", "tp": 2, "sim_profile": "nope"})
    assert (
        "sim_profile",
        "unknown profile 'nope'; choose one of: b200-mtp, rtx-pro-6000, instant (got 'nope')",
    ) in (caught.value.problems)
    with pytest.raises(ParameterError) as caught:
        build_config(TuneConfig, {"model": "m", "gpus": "0-6", "tp": 2})
    assert caught.value.problems == [
        (
            "tp",
            "tp 2 does not divide the 7 GPUs of gpus into whole servers; list a multiple of 2 GPUs or change tp",
        )
    ]


def test_router_preflight_names_the_install_command_when_smg_is_missing(tmp_path, capsys, monkeypatch):
    """SMG runs in draftgen's own environment (the router extra installs it there): one without it is named, with
    the command that installs it, before anything starts. Here draftgen's interpreter is stood in for by a venv
    without SMG; ``--python`` (SGLang's, or the simulator's) plays no part."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True, timeout=120
    )
    bare = str(tmp_path / "env" / "bin" / "python")
    monkeypatch.setattr(serve_preflight, "ROUTER_PYTHON", bare)
    code = main(["serve", "--engine", "sim", "--gpus", "0", "--router", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1, err  # refused before anything started
    assert f"{bare} has no SMG (smg)" in err[0]
    assert f"{bare} -m pip install '{ROUTER_PIN}'" in err[0] and "requirements.txt holds it" in err[0]
    assert not (tmp_path / "o").exists()  # nothing started, nothing written
    monkeypatch.undo()
    assert (
        main(["serve", "--engine", "sim", "--gpus", "0", "--router", "--python", str(bare), "--dry-run"]) == 0
    )


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_endpoint_paths_and_algorithm_names_are_written_in_one_place_each():
    endpoints = {"/metrics", "/sim/info", "/workers"}
    written = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        for line, text in _literals(path):
            if text in endpoints and not relative.startswith(("client/server.py", "sim/")):
                written.append(f"{relative}:{line} {text}")
            if text in SPECULATIVE_ALGORITHMS and not relative.startswith("sglang_rules/"):
                written.append(f"{relative}:{line} {text}")
    assert written == []
