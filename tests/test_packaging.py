"""Packaging: environment.yml mirrors pyproject.toml, the console script works, the bundled prompts are ours."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from draftgen.cli import build_parser
from draftgen.prompts.synthetic import BUNDLED_COUNT, BUNDLED_PROMPTS, BUNDLED_SEED, synthetic_rows

ROOT = Path(__file__).resolve().parents[1]
PIP_EDITABLE = "-e ."
# What environment.yml's editable install must include: the gateway `draftgen serve --router` runs, and the tests'.
PIP_EXTRAS = {"router", "dev"}


def _requirement(spec: str, where: str) -> Requirement:
    try:
        return Requirement(spec)
    except InvalidRequirement as exc:
        raise AssertionError(f"{where}: cannot parse dependency {spec!r}: {exc}") from None


def dependency_drift(pyproject: dict, environment: dict) -> list[str]:
    """Every way environment.yml fails to mirror pyproject.toml (empty when they agree)."""
    problems: list[str] = []
    wanted = {}
    for spec in pyproject["project"]["dependencies"]:
        requirement = _requirement(spec, "pyproject.toml")
        wanted[canonicalize_name(requirement.name)] = requirement
    have = {}
    pip_sections: list[list[str]] = []
    python_spec = None
    for entry in environment.get("dependencies", []):
        if isinstance(entry, dict):
            pip_sections.append(list(entry.get("pip", [])))
            continue
        requirement = _requirement(str(entry), "environment.yml")
        name = canonicalize_name(requirement.name)
        if name == "python":
            python_spec = requirement.specifier
        elif name != "pip":
            have[name] = requirement
    for name in sorted(wanted.keys() - have.keys()):
        problems.append(f"{name} is in pyproject.toml but not in environment.yml")
    for name in sorted(have.keys() - wanted.keys()):
        problems.append(f"{name} is in environment.yml but not in pyproject.toml")
    for name in sorted(wanted.keys() & have.keys()):
        if wanted[name].specifier != have[name].specifier:
            problems.append(
                f"{name}: pyproject.toml pins {wanted[name].specifier or 'nothing'}, "
                f"environment.yml pins {have[name].specifier or 'nothing'}"
            )
    requires_python = pyproject["project"].get("requires-python", "")
    if python_spec is None:
        problems.append("environment.yml does not list python")
    elif str(python_spec) != str(Requirement(f"python{requires_python}").specifier):
        problems.append(
            f"python: pyproject.toml requires {requires_python}, environment.yml has {python_spec}"
        )
    editable = [line.split("#")[0].strip() for section in pip_sections for line in section]
    editable = [line for line in editable if line.startswith(PIP_EDITABLE)]
    if not editable:
        problems.append(f"environment.yml has no 'pip: [{PIP_EDITABLE}[...]]' entry installing the package")
    else:
        extras = set(editable[0].removeprefix(PIP_EDITABLE).strip("[]").split(",")) - {""}
        declared = set(pyproject["project"].get("optional-dependencies", {}))
        for extra in sorted(PIP_EXTRAS - extras):
            problems.append(f"environment.yml's {editable[0]} leaves out the {extra!r} extra")
        for extra in sorted(extras - declared):
            problems.append(
                f"environment.yml installs the extra {extra!r}, which pyproject.toml does not declare"
            )
    return problems


def _load() -> tuple[dict, dict]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    return pyproject, environment


def test_environment_yml_mirrors_pyproject():
    pyproject, environment = _load()
    assert dependency_drift(pyproject, environment) == []


def _pin_changed(env: dict) -> str:
    deps = env["dependencies"]
    index = next(i for i, d in enumerate(deps) if isinstance(d, str) and d.startswith("openai"))
    deps[index] = "openai>=1.0"
    return "openai"


def _package_dropped(env: dict) -> str:
    env["dependencies"] = [
        d for d in env["dependencies"] if not (isinstance(d, str) and d.startswith("polars"))
    ]
    return "polars"


def _package_added(env: dict) -> str:
    env["dependencies"].insert(2, "torch>=2.4")
    return "torch"


def _python_changed(env: dict) -> str:
    env["dependencies"] = ["python>=3.10" if d == "python>=3.11" else d for d in env["dependencies"]]
    return "python"


def _pip_line_dropped(env: dict) -> str:
    env["dependencies"] = [d for d in env["dependencies"] if not isinstance(d, dict)]
    return PIP_EDITABLE


def _router_extra_dropped(env: dict) -> str:
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))
    pip["pip"] = ["-e .[dev]"]
    return "'router' extra"


@pytest.mark.parametrize(
    "doctor",
    [
        _pin_changed,
        _package_dropped,
        _package_added,
        _python_changed,
        _pip_line_dropped,
        _router_extra_dropped,
    ],
)
def test_drift_check_catches_a_doctored_environment_yml(doctor):
    pyproject, environment = _load()
    culprit = doctor(environment)
    problems = dependency_drift(pyproject, environment)
    assert problems, f"{doctor.__name__} went unnoticed"
    assert any(culprit in problem for problem in problems), problems


def test_drift_check_catches_a_doctored_pyproject():
    pyproject, environment = _load()
    pyproject["project"]["dependencies"] = [
        "pydantic>=1.10" if d.startswith("pydantic") else d for d in pyproject["project"]["dependencies"]
    ]
    assert any(p.startswith("pydantic:") for p in dependency_drift(pyproject, environment))


def _subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def _draftgen_script() -> str:
    script = Path(sys.executable).with_name("draftgen")
    assert script.exists(), f"console script missing at {script}: run `pip install -e .[dev]`"
    return str(script)


@pytest.mark.parametrize(
    "command", [[None, "--help"], [sys.executable, "-m", "draftgen", "--help"]], ids=["script", "module"]
)
def test_help_lists_every_subcommand(command):
    if command[0] is None:
        command = [_draftgen_script(), *command[1:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    names = _subcommands()
    assert {"sim", "prompts"} <= set(names)
    for name in names:
        assert f"    {name} " in result.stdout or f"    {name}\n" in result.stdout, (name, result.stdout)


def test_bundled_prompts_are_the_seeded_synthetic_set():
    rows = [json.loads(line) for line in BUNDLED_PROMPTS.read_text().splitlines() if line.strip()]
    assert len(rows) == BUNDLED_COUNT
    assert rows == list(synthetic_rows(BUNDLED_COUNT, BUNDLED_SEED))


def test_a_process_reading_notebooks_skips_the_iri_grammars_and_still_validates_them():
    """draftgen marks rfc3987-syntax absent (2-3 s of CPU per `draftgen run` otherwise): papermill and nbconvert
    still import, and nbformat still validates every notebook of the project against its schema."""
    probe = (
        "import draftgen, sys, papermill, nbconvert, nbformat, glob\n"
        "assert sys.modules['rfc3987_syntax'] is None, 'the iri grammars were built'\n"
        "for path in sorted(glob.glob('notebooks/*.ipynb')):\n"
        "    nbformat.validate(nbformat.read(path, as_version=4))\n"
        "bad = nbformat.v4.new_notebook(); bad.cells = [{'cell_type': 'code', 'source': 'x'}]\n"
        "try:\n"
        "    nbformat.validate(bad)\n"
        "except nbformat.ValidationError:\n"
        "    print('invalid caught')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "invalid caught"


def test_reading_a_run_does_not_import_the_openai_sdk():
    """The SDK costs 2 s of CPU to import: the reports, monitor and status read runs without it (it is imported
    when a client is built), and a notebook kernel that only reports starts that much sooner."""
    readers = (
        "draftgen.generate.report",
        "draftgen.bench.report",
        "draftgen.estimate.report",
        "draftgen.validate.report",
        "draftgen.watch.monitor",
        "draftgen.commands.status",
    )
    probe = f"import sys\nfor name in {readers!r}:\n    __import__(name)\nprint('openai' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    built = (
        "from draftgen.client.server import ServerClient\nimport sys\nServerClient('http://127.0.0.1:9')\n"
    )
    built += "print('openai' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", built], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr


def test_the_gateway_is_the_router_extra_which_the_tests_and_environment_install():
    """A user's install with the `router` extra (README, environment.yml) has SMG; the pin is serve's own."""
    from draftgen.serve.config import ROUTER_PIN

    pyproject, _ = _load()
    extras = pyproject["project"]["optional-dependencies"]
    assert extras["router"] == [ROUTER_PIN]
    assert "draftgen[router]" in extras["dev"]
    assert not any(
        canonicalize_name(Requirement(d).name) == "smg" for d in pyproject["project"]["dependencies"]
    )
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[router]'" in readme
