"""Relative path parameters resolve against the project root in every mode (draftgen.paths,
docs/design.md#paths).

The modes: the config built in-process from any working directory (how JupyterLab's kernel in notebooks/ builds
it), a papermill kernel started in notebooks/, and ``draftgen run`` started from a sub-folder. Each runs on a
throwaway project laid out like this checkout, so "the root" is one the test made, not wherever pytest runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import papermill
import pytest
from validate_helpers import clean_rows, write_generation

from draftgen.bench.config import BenchmarkConfig
from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.inputs import find_latest_benchmark
from draftgen.generate.config import GenerateConfig
from draftgen.params import ParameterError, build_config
from draftgen.paths import ROOT_ENV, project_root, resolve_path
from draftgen.prompts.synthetic import write_synthetic
from draftgen.training.local_tokenizer import build_tiny_tokenizer
from draftgen.validate.config import ValidateConfig

CHECKOUT = Path(__file__).resolve().parents[1]
FLEET = {"servers": ["http://127.0.0.1:1"], "model": "m"}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project root (pyproject.toml + notebooks/) with the kernel's working directory in notebooks/."""
    monkeypatch.delenv(ROOT_ENV, raising=False)
    root = tmp_path / "proj"
    (root / "notebooks").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.chdir(root / "notebooks")
    return root


# ----- the rule ---------------------------------------------------------------------------------------------
def test_root_is_found_from_the_root_notebooks_and_deeper_folders(project):
    deep = project / "outputs" / "generate" / "run"
    deep.mkdir(parents=True)
    for cwd in (project, project / "notebooks", deep):
        assert project_root(cwd, environ={}) == project


def test_params_folder_marks_a_root_without_pyproject(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "params").mkdir()
    assert project_root(tmp_path / "notebooks", environ={}) == tmp_path


def test_a_notebooks_folder_alone_is_not_a_root(tmp_path):
    # ~/notebooks above an unrelated project must not swallow its outputs
    (tmp_path / "notebooks").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    assert project_root(work, environ={}) == work  # no root found: the working directory


def test_environment_variable_wins(project, tmp_path):
    elsewhere = tmp_path / "data-project"
    assert project_root(project / "notebooks", environ={ROOT_ENV: str(elsewhere)}) == elsewhere
    assert project_root(project, environ={ROOT_ENV: ""}) == project  # empty: unset


def test_absolute_and_home_paths_are_used_as_given(project):
    assert resolve_path("/data/prompts.jsonl") == Path("/data/prompts.jsonl")
    assert resolve_path("~/x.jsonl") == Path.home() / "x.jsonl"
    assert resolve_path("outputs/../params/a.yaml") == project / "params" / "a.yaml"


# ----- every notebook config, built where JupyterLab's kernel runs (notebooks/) ------------------------------
def test_generate_config_paths(project):
    write_synthetic(project / "data" / "p.jsonl", 5, seed=1)
    (project / "outputs" / "estimate" / "e").mkdir(parents=True)
    (project / "outputs" / "estimate" / "e" / "estimate.json").write_text("{}")
    config = build_config(
        GenerateConfig,
        {
            **FLEET,
            "prompts": "data/p.jsonl",
            "out_dir": "outputs/generate/x",
            "estimate": "outputs/estimate/e/estimate.json",
        },
    )
    assert config.prompts == str(project / "data" / "p.jsonl")
    assert config.prompt_path == project / "data" / "p.jsonl"
    assert config.out_dir == str(project / "outputs" / "generate" / "x")
    assert config.estimate == str(project / "outputs" / "estimate" / "e" / "estimate.json")
    unset = build_config(GenerateConfig, {**FLEET, "prompts": "synthetic", "out_dir": "/abs/run"})
    assert (unset.prompts, unset.estimate, unset.out_dir) == ("synthetic", "", "/abs/run")


def test_a_missing_relative_file_names_the_root_it_was_looked_up_in(project):
    with pytest.raises(ParameterError) as error:
        build_config(GenerateConfig, {**FLEET, "prompts": "data/none.jsonl", "out_dir": "o"})
    message = str(error.value)
    assert "prompts" in message and str(project / "data" / "none.jsonl") in message
    assert f"relative paths are read from the project root {project}" in message


def test_benchmark_config_default_out_dir_is_under_the_root(project):
    config = build_config(BenchmarkConfig, FLEET)
    assert config.out_dir == str(project / "outputs" / "benchmark" / "interactive")


def test_estimate_config_paths_and_newest_benchmark(project):
    bench = project / "outputs" / "benchmark" / "b1"
    bench.mkdir(parents=True)
    (bench / "results.parquet").write_bytes(b"")
    config = build_config(
        EstimateConfig,
        {
            "benchmark_dir": "outputs/benchmark/b1",
            "scenarios": [{"name": "other", "gpus": 2, "benchmark_dir": "outputs/benchmark/b1"}],
        },
    )
    assert config.benchmark_dir == str(bench)
    assert config.scenarios[0].benchmark_dir == str(bench)
    assert config.out_dir == str(project / "outputs" / "estimate" / "interactive")
    assert find_latest_benchmark() == bench  # benchmark_dir "": the newest under the ROOT's outputs/


def test_validate_config_paths(project):
    config = build_config(
        ValidateConfig, {"generation_dir": "outputs/g", "tokenizer": "models/tok", "out_dir": "outputs/v"}
    )
    assert (config.generation_dir, config.tokenizer, config.out_dir) == (
        str(project / "outputs" / "g"),
        str(project / "models" / "tok"),
        str(project / "outputs" / "v"),
    )


# ----- a real kernel: papermill in notebooks/ (JupyterLab's cwd), and draftgen run from a sub-folder ---------
@pytest.fixture
def validate_project(project: Path) -> Path:
    shutil.copy(CHECKOUT / "notebooks" / "validate.ipynb", project / "notebooks" / "validate.ipynb")
    write_generation(project / "outputs" / "gen", clean_rows(12))
    build_tiny_tokenizer(project / "models" / "tok")
    return project


def test_papermill_kernel_in_notebooks_writes_under_the_root(validate_project):
    root = validate_project
    papermill.execute_notebook(
        str(root / "notebooks" / "validate.ipynb"),
        str(root / "executed.ipynb"),
        parameters={"generation_dir": "outputs/gen", "tokenizer": "models/tok", "out_dir": "outputs/val"},
        kernel_name="python3",
        progress_bar=False,
        cwd=str(root / "notebooks"),
    )
    assert (root / "outputs" / "val" / "export" / "train.jsonl").is_file()
    assert not (root / "notebooks" / "outputs").exists(), "a run folder landed under notebooks/"


def test_draftgen_run_from_a_subfolder_reads_and_writes_under_the_root(validate_project):
    root = validate_project
    env = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    (root / "params").mkdir()
    (root / "params" / "val.yaml").write_text("generation_dir: outputs/gen\n")
    command = [sys.executable, "-m", "draftgen", "run", "validate", "--name", "rel", "--no-html"]
    command += ["-f", "params/val.yaml", "-p", "tokenizer", "models/tok"]  # -f too: under the root
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=root / "outputs", env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = root / "outputs" / "validate" / "rel"
    assert (run_dir / ".complete").exists(), result.stdout
    assert json.loads((run_dir / "summary.json").read_text())["passed"] is True
    assert not (root / "outputs" / "outputs").exists()


# ----- every command: the same rule (docs/design.md#paths) -----------------------------------------------------
COMMAND_PATHS = [
    (["status", "outputs/generate/x"], {"run_dir": "outputs/generate/x"}),
    (["run", "validate", "-f", "params/a.yaml", "--out-root", "runs"], {"out_root": "runs"}),
    (["run", "validate"], {"out_root": "outputs"}),
    (["tune", "-f", "params/a.yaml"], {"out_root": "outputs"}),
    (["sim", "--work-dir", "w", "--tokenizer", "models/tok"], {"work_dir": "w", "tokenizer": "models/tok"}),
    (["prompts", "--n", "1", "--out", "data/p.jsonl"], {"out": "data/p.jsonl"}),
    (["tokenizer", "--out", "models/tok"], {"out": "models/tok"}),
    (["demo"], {"out": "outputs/demo"}),
    (["demo", "--out", "d"], {"out": "d"}),
]


@pytest.mark.parametrize(
    "argv, paths", COMMAND_PATHS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_every_commands_relative_paths_are_under_the_root(project, argv, paths):
    from draftgen.cli import build_parser

    args = build_parser(argv).parse_args(argv)  # parsed in notebooks/, a folder below the root
    for dest, given in paths.items():
        assert getattr(args, dest) == project / given, dest
    if argv[0] in ("run", "tune") and "-f" in argv:
        assert args.parameters_file == [project / "params" / "a.yaml"]


def test_serve_paths_are_under_the_root(project):
    from draftgen.cli import build_parser
    from draftgen.commands.serve import build_config as serve_config

    argv = ["serve", "--engine", "sim", "--gpus", "0"]
    assert serve_config(build_parser(argv).parse_args(argv)).out_dir == project / "outputs" / "serve"
    argv += ["--out", "runs/serve", "--settings", "runs/s.yaml"]
    assert build_parser(argv).parse_args(argv).settings == project / "runs" / "s.yaml"
    assert (
        serve_config(build_parser(argv[:-2]).parse_args(argv[:-2])).run_dir.parent
        == project / "runs" / "serve"
    )


def test_no_command_reads_a_path_from_the_working_directory():
    """A flag typed ``pathlib.Path`` would be read from the shell's folder: every path flag is ``resolve_path``."""
    import argparse

    from draftgen.cli import build_parser

    def parsers(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for inner in action.choices.values():
                    yield from parsers(inner)

    typed = [
        (parser.prog, action.dest, action.type)
        for parser in parsers(build_parser())
        for action in parser._actions
        if action.type is not None
    ]
    assert [t for t in typed if t[2] is Path] == []
    assert {(prog, dest) for prog, dest, kind in typed if kind is resolve_path} >= {
        ("draftgen status", "run_dir"),
        ("draftgen run", "parameters_file"),
        ("draftgen serve", "out_dir"),
        ("draftgen serve", "settings"),
        ("draftgen sim", "work_dir"),
    }


def test_serve_starts_servers_and_checks_interpreters_in_the_root(project):
    """A relative --python (or --model) means the file under the root, in serve's checks and its servers alike."""
    import asyncio

    from draftgen.serve.environment import probe
    from draftgen.serve.launch import LaunchSpec
    from draftgen.serve.process import spawn

    (project / "env" / "bin").mkdir(parents=True)
    (project / "env" / "bin" / "python").symlink_to(sys.executable)
    assert probe("env/bin/python", "json").importable[
        "json"
    ]  # found from notebooks/, a folder below the root
    argv = ("env/bin/python", "-c", "import os; print('cwd', os.getcwd())")
    spec = LaunchSpec("server-1", "server", 1, "http://127.0.0.1:1", (0,), argv, (), "/health")

    async def started() -> int:
        return await (await spawn(spec, project / "server.log")).wait()

    assert asyncio.run(started()) == 0
    assert f"cwd {project}" in (project / "server.log").read_text()


def test_status_from_a_subfolder_reads_the_run_under_the_root(project):
    from draftgen.watch import progress_file

    run = project / "outputs" / "generate" / "r"
    run.mkdir(parents=True)
    progress_file.write_progress(run, {"state": "finished", "detail": "complete", "heartbeat_at": 1.0})
    env = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    command = [sys.executable, "-m", "draftgen", "status", "outputs/generate/r"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=project / "notebooks", env=env
    )
    assert done.returncode == 0 and "FINISHED" in done.stdout, done.stdout + done.stderr
