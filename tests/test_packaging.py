"""Packaging: uv.lock is what every environment installs, its floors are tested, the conda files mirror it, the
console script works, the bundled prompts are ours."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from draftgen.cli import build_parser
from draftgen.prompts.synthetic import BUNDLED_COUNT, BUNDLED_PROMPTS, BUNDLED_SEED, synthetic_rows

ROOT = Path(__file__).resolve().parents[1]
PIP_EDITABLE = "-e ."
# What each conda file installs: its pyproject groups (the core dependencies, or an extra), and the extras of its
# editable install (the gateway `draftgen serve --router` runs and JupyterLab for users; the tests' for developers).
ENVIRONMENTS = {
    "environment.yml": (("dependencies", "lab"), {"router", "lab"}),
    "environment-dev.yml": (("dev",), {"dev"}),
}
# The Python the conda environment pins: the one the suite runs on (uv.lock's versions are this Python's).
CONDA_PYTHON = ">=3.11,<3.12"
# Jupyter's server stack: what a headless install (draftgen run, papermill, the GPU node) must not need.
LAB_STACK = {"jupyterlab", "jupyter-server", "jupyterlab-server", "notebook", "jupyter-lsp", "notebook-shim"}


def _requirement(spec: str, where: str) -> Requirement:
    try:
        return Requirement(spec)
    except InvalidRequirement as exc:
        raise AssertionError(f"{where}: cannot parse dependency {spec!r}: {exc}") from None


def group_requirements(pyproject: dict, group: str) -> list[Requirement]:
    """A pyproject group's requirements: "dependencies" (the core) or an extra's name; draftgen's own extras left out."""
    project = pyproject["project"]
    specs = project["dependencies"] if group == "dependencies" else project["optional-dependencies"][group]
    found = [_requirement(spec, f"pyproject.toml [{group}]") for spec in specs]
    return [r for r in found if canonicalize_name(r.name) != "draftgen"]


class Lock:
    """uv.lock, read: each package's version for this interpreter (the one ``make`` installs here) and the graph."""

    def __init__(self, data: dict):
        self.packages: dict[str, list[dict]] = {}
        for package in data["package"]:
            self.packages.setdefault(canonicalize_name(package["name"]), []).append(package)

    def version(self, name: str) -> Version | None:
        """The locked version this interpreter gets (a package may be locked at several, one per Python fork)."""
        entries = self.packages.get(canonicalize_name(name), [])
        for entry in entries:
            markers = entry.get("resolution-markers")
            if len(entries) == 1 or any(Marker(m).evaluate() for m in markers or ()):
                return Version(entry["version"])
        return None

    def reachable(self, name: str, extras: set[str]) -> set[str]:
        """Every package installing ``name[extras]`` from the lock brings, on any platform (extras followed)."""
        seen: set[tuple[str, str]] = set()
        todo = [(canonicalize_name(name), extra) for extra in {"", *extras}]
        while todo:
            item = todo.pop()
            if item in seen:
                continue
            seen.add(item)
            package, extra = item
            for entry in self.packages.get(package, []):
                deps = entry.get("dependencies", []) if not extra else entry.get("optional-dependencies", {})
                for dep in deps if not extra else deps.get(extra, []):
                    dep_name = canonicalize_name(dep["name"])
                    todo += [(dep_name, e) for e in {"", *dep.get("extra", [])}]
        return {package for package, _ in seen}


def _lock() -> Lock:
    return Lock(tomllib.loads((ROOT / "uv.lock").read_text()))


def tier_versions(path: Path) -> dict[str, Version]:
    """A tier's complete --no-deps lock (``name==version`` lines): its versions by name."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = _requirement(line, str(path))
            [pin] = list(requirement.specifier)
            assert pin.operator == "==", f"{path}: {line!r} is not an exact pin"
            pins[canonicalize_name(requirement.name)] = Version(pin.version)
    return pins


def dependency_drift(
    pyproject: dict, environment: dict, lock: Lock, file: str = "environment.yml"
) -> list[str]:
    """Every way a conda file fails to mirror pyproject.toml and uv.lock (empty when they agree): the same names as
    its pyproject groups, each pinned to the lock's version, Python pinned to the suite's, the editable install with
    its extras."""
    groups, pip_extras = ENVIRONMENTS[file]
    problems: list[str] = []
    wanted = {canonicalize_name(r.name): r for group in groups for r in group_requirements(pyproject, group)}
    have = {}
    pip_lines: list[str] = []
    python_spec = None
    for entry in environment.get("dependencies", []):
        if isinstance(entry, dict):
            pip_lines += [line.split("#")[0].strip() for line in entry.get("pip", [])]
            continue
        requirement = _requirement(str(entry), file)
        name = canonicalize_name(requirement.name)
        if name == "python":
            python_spec = requirement.specifier
        elif name != "pip":
            have[name] = requirement
    for line in pip_lines:
        if not line.startswith(PIP_EDITABLE):
            requirement = _requirement(line, f"{file} pip")
            have[canonicalize_name(requirement.name)] = requirement
    for name in sorted(wanted.keys() - have.keys()):
        problems.append(f"{name} is in pyproject.toml {list(groups)} but not in {file}")
    for name in sorted(have.keys() - wanted.keys()):
        problems.append(f"{name} is in {file} but not in pyproject.toml {list(groups)}")
    for name in sorted(wanted.keys() & have.keys()):
        locked = lock.version(name)
        if str(have[name].specifier) != f"=={locked}":
            problems.append(
                f"{name}: {file} pins {have[name].specifier or 'nothing'}, uv.lock holds {locked}"
            )
        if locked is None or locked not in wanted[name].specifier:
            problems.append(
                f"{name}: uv.lock's {locked} is outside pyproject.toml's {wanted[name].specifier}"
            )
    if "dependencies" in groups:
        requires_python = pyproject["project"].get("requires-python", "")
        if python_spec is None:
            problems.append(f"{file} does not list python")
        elif str(python_spec) != str(Requirement(f"python{CONDA_PYTHON}").specifier):
            problems.append(f"python: {file} has {python_spec}, the suite runs {CONDA_PYTHON}")
        elif not Requirement(f"python{requires_python}").specifier.contains("3.11"):
            problems.append(f"python: pyproject.toml requires {requires_python}, which leaves out 3.11")
    editable = [line for line in pip_lines if line.startswith(PIP_EDITABLE)]
    if not editable:
        problems.append(f"{file} has no 'pip: [{PIP_EDITABLE}[...]]' entry installing the package")
    else:
        extras = set(editable[0].removeprefix(PIP_EDITABLE).strip("[]").split(",")) - {""}
        declared = set(pyproject["project"].get("optional-dependencies", {}))
        for extra in sorted(pip_extras - extras):
            problems.append(f"{file}'s {editable[0]} leaves out the {extra!r} extra")
        for extra in sorted(extras - pip_extras):
            problems.append(f"{file}'s {editable[0]} installs the {extra!r} extra, which belongs elsewhere")
        for extra in sorted(extras - declared):
            problems.append(f"{file} installs the extra {extra!r}, which pyproject.toml does not declare")
    return problems


def _load(file: str = "environment.yml") -> tuple[dict, dict]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    environment = yaml.safe_load((ROOT / file).read_text())
    return pyproject, environment


@pytest.mark.parametrize("file", sorted(ENVIRONMENTS))
def test_conda_environments_mirror_pyproject_and_the_lock(file):
    """conda is not installable here (no conda channel is reachable, and PyPI has no working conda or micromamba):
    the files are parsed and every spec is checked against pyproject.toml and uv.lock, not resolved."""
    pyproject, environment = _load(file)
    assert dependency_drift(pyproject, environment, _lock(), file) == []


def _pin_changed(env: dict) -> str:
    deps = env["dependencies"]
    index = next(i for i, d in enumerate(deps) if isinstance(d, str) and d.startswith("openai"))
    deps[index] = "openai==3.62.0"
    return "openai"


def _package_dropped(env: dict) -> str:
    env["dependencies"] = [
        d for d in env["dependencies"] if not (isinstance(d, str) and d.startswith("polars"))
    ]
    return "polars"


def _package_added(env: dict) -> str:
    env["dependencies"].insert(2, "torch>=2.4")
    return "torch"


def _dev_tool_added(env: dict) -> str:
    env["dependencies"].insert(2, "pytest==9.2.0")  # dev tools stay in environment-dev.yml
    return "pytest"


def _python_changed(env: dict) -> str:
    env["dependencies"] = ["python>=3.11" if str(d).startswith("python") else d for d in env["dependencies"]]
    return "python"


def _pip_line_dropped(env: dict) -> str:
    env["dependencies"] = [d for d in env["dependencies"] if not isinstance(d, dict)]
    return PIP_EDITABLE


def _router_extra_dropped(env: dict) -> str:
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))
    pip["pip"] = ["-e .[lab]"]
    return "'router' extra"


def _dev_extra_added(env: dict) -> str:
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))
    pip["pip"] = ["-e .[router,lab,dev]"]
    return "'dev' extra"


@pytest.mark.parametrize(
    "doctor",
    [
        _pin_changed,
        _package_dropped,
        _package_added,
        _dev_tool_added,
        _python_changed,
        _pip_line_dropped,
        _router_extra_dropped,
        _dev_extra_added,
    ],
)
def test_drift_check_catches_a_doctored_environment_yml(doctor):
    pyproject, environment = _load()
    culprit = doctor(environment)
    problems = dependency_drift(pyproject, environment, _lock())
    assert problems, f"{doctor.__name__} went unnoticed"
    assert any(culprit in problem for problem in problems), problems


def test_drift_check_catches_a_doctored_pyproject_and_lock():
    pyproject, environment = _load()
    pyproject["project"]["dependencies"] = [
        "pydantic>=2.15" if d.startswith("pydantic") else d for d in pyproject["project"]["dependencies"]
    ]
    assert any(p.startswith("pydantic:") for p in dependency_drift(pyproject, environment, _lock()))
    pyproject, environment = _load()
    lock = _lock()
    [polars] = lock.packages["polars"]
    polars["version"] = "2.1.1"  # the lock moved on, the environment did not
    assert any(p.startswith("polars:") for p in dependency_drift(pyproject, environment, lock))
    pyproject, dev = _load("environment-dev.yml")
    dev["dependencies"] = [d for d in dev["dependencies"] if not str(d).startswith("ruff")]
    assert any("ruff" in p for p in dependency_drift(pyproject, dev, _lock(), "environment-dev.yml"))


# ----- the lock ---------------------------------------------------------------------------------------------
def next_breaking(version: Version) -> Version:
    """The first release that may break what ``version`` does: the next major, or below 1.0 the next minor."""
    return Version(f"{version.major + 1}" if version.major else f"0.{version.minor + 1}")


def floor_problems(pyproject: dict, lock: Lock, tiers: dict[str, dict[str, Version]]) -> list[str]:
    """Every requirement whose floor is not the lowest version a test tier runs (``make test``: the lock's; a tier
    with a complete lock: its own), or whose cap is not the next release that may break, or that leaves out a
    version a tier runs. Exact pins (``==``) need no cap."""
    problems = []
    groups = ["dependencies", *pyproject["project"]["optional-dependencies"]]
    for requirement in (r for group in groups for r in group_requirements(pyproject, group)):
        name = canonicalize_name(requirement.name)
        runs = {"uv.lock": lock.version(name)} | {t: v[name] for t, v in tiers.items() if name in v}
        runs = {where: version for where, version in runs.items() if version is not None}
        floors = [s for s in requirement.specifier if s.operator in (">=", "==")]
        caps = [s for s in requirement.specifier if s.operator == "<"]
        if not runs:
            problems.append(f"{name}: no tier runs it")
            continue
        lowest = min(runs.values())
        if len(floors) != 1 or Version(floors[0].version) != lowest:
            problems.append(
                f"{name}: floor {requirement.specifier} is not the lowest version a tier runs ({runs})"
            )
        elif floors[0].operator == ">=" and (
            len(caps) != 1 or Version(caps[0].version) != next_breaking(lowest)
        ):
            problems.append(f"{name}: {requirement.specifier} is not capped at {next_breaking(lowest)}")
        problems += [
            f"{name}: {where} runs {version}, outside {requirement.specifier}"
            for where, version in runs.items()
            if version not in requirement.specifier
        ]
    return problems


def _tiers() -> dict[str, dict[str, Version]]:
    return {"tests_real": tier_versions(ROOT / "tests_real" / "requirements.txt")}


def test_every_floor_is_a_version_a_tier_runs():
    pyproject, _ = _load()
    assert floor_problems(pyproject, _lock(), _tiers()) == []


def test_floor_check_catches_an_untested_floor_and_a_missing_cap():
    pyproject, _ = _load()
    dependencies = pyproject["project"]["dependencies"]
    pyproject["project"]["dependencies"] = [
        "polars>=1.20" if d.startswith("polars") else "tqdm>=4.70.1" if d.startswith("tqdm") else d
        for d in dependencies
    ]
    problems = floor_problems(pyproject, _lock(), _tiers())
    assert any(p.startswith("polars: floor") for p in problems), problems
    assert any(p.startswith("tqdm:") and "capped at 5" in p for p in problems), problems
    tiers = _tiers()
    tiers["tests_real"]["numpy"] = Version("2.2.0")  # the vLLM tier moved below the floor
    assert any(p.startswith("numpy:") for p in floor_problems(_load()[0], _lock(), tiers))


def test_this_environment_is_the_locks():
    """``make`` installs .venv from uv.lock's export: every dependency here is at the lock's version."""
    pyproject, _ = _load()
    installed = [
        r for group in ("dependencies", "dev", "router") for r in group_requirements(pyproject, group)
    ]
    lock = _lock()
    wrong = {r.name: (version(r.name), str(lock.version(r.name))) for r in installed}
    assert {n: v for n, v in wrong.items() if v[0] != v[1]} == {}, (
        "reinstall .venv from the lock: rm -r .venv; make"
    )


def test_the_vllm_tier_lock_holds_every_dependency_at_an_allowed_version_and_cpu_torch_only():
    pyproject, _ = _load()
    pins = tier_versions(ROOT / "tests_real" / "requirements.txt")
    for requirement in (
        r for group in ("dependencies", "dev", "router") for r in group_requirements(pyproject, group)
    ):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"tests_real/requirements.txt lacks {name}: redo it (its header says how)"
        assert pins[name] in requirement.specifier, (name, str(pins[name]), str(requirement.specifier))
    assert pins["torch"].local == "cpu" and not [name for name in pins if name.startswith("nvidia")]


def test_the_headless_install_has_no_jupyter_server_stack_and_the_browser_tier_has_the_lab():
    lock = _lock()
    headless = lock.reachable("draftgen", {"router", "dev"})
    assert {"papermill", "ipykernel", "nbconvert", "smg", "pytest"} <= headless
    assert headless & LAB_STACK == set()
    assert {"jupyterlab", "jupyter-server", "playwright"} <= lock.reachable("draftgen", {"browser"})
    imported = set()
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {(alias.name.split(".")[0], path.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add((node.module.split(".")[0], path.name))
    lab_modules = {name.replace("-", "_") for name in LAB_STACK}
    assert [(m, f) for m, f in imported if m in lab_modules] == []


def _make_lock_check(folder: Path) -> subprocess.CompletedProcess:
    uv = Path(sys.executable).with_name("uv")
    command = ["make", "-s", "-f", str(ROOT / "Makefile"), "-C", str(folder), "lock-check", f"UV={uv}"]
    return subprocess.run([*command, "PIP_FIND_LINKS="], capture_output=True, text=True, timeout=120)


def test_lock_check_fails_when_the_lock_and_pyproject_or_requirements_disagree(tmp_path):
    for name in ("pyproject.toml", "uv.lock", "requirements.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    agreed = _make_lock_check(tmp_path)
    assert agreed.returncode == 0, agreed.stderr
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"tqdm>=4.70.1,<5"', '"tqdm>=4.70.1,<6"'))
    stale = _make_lock_check(tmp_path)
    assert stale.returncode != 0 and "uv.lock does not match pyproject.toml: run make lock" in stale.stderr
    pyproject.write_text((ROOT / "pyproject.toml").read_text())
    node = tmp_path / "requirements.txt"
    node.write_text(node.read_text().replace("polars==2.1.0", "polars==2.0.0"))
    edited = _make_lock_check(tmp_path)
    assert edited.returncode != 0 and "requirements.txt is not uv.lock's export" in edited.stderr


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
    """A user's install (README's requirements.txt, environment.yml) has SMG, the router extra; the pin is serve's."""
    from draftgen.serve.config import ROUTER_PIN

    pyproject, _ = _load()
    extras = pyproject["project"]["optional-dependencies"]
    assert extras["router"] == [ROUTER_PIN]
    assert "draftgen[router]" in extras["dev"]
    assert not any(
        canonicalize_name(Requirement(d).name) == "smg" for d in pyproject["project"]["dependencies"]
    )
    readme = (ROOT / "README.md").read_text()
    assert "pip install -r requirements.txt && pip install --no-deps -e ." in readme
    assert "smg==1.13.0" in (ROOT / "requirements.txt").read_text()
