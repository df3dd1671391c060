"""Every committed notebook follows the house rules (docs/design.md#rules-of-the-road-for-notebooks): checked
statically, no kernel needed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import papermill
import pytest

from draftgen.params import build_config
from draftgen.runner import config_class, declared_parameters, step_of

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
EXPECTED = {"generate", "benchmark", "estimate", "validate"}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell.get("source", ""))


def test_the_four_pipeline_notebooks_exist():
    assert {p.stem for p in NOTEBOOKS} >= EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_or_execution_counts(path):
    for cell in _cells(path):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name}: a code cell has outputs"
            assert cell.get("execution_count") is None, f"{path.name}: a code cell has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_is_typed_and_commented(path):
    cells = [c for c in _cells(path) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name}: exactly one cell must be tagged 'parameters'"
    source = _source(cells[0])
    tree = ast.parse(source)
    lines = source.splitlines()
    assert tree.body, f"{path.name}: empty parameters cell"
    for node in tree.body:
        assert isinstance(node, ast.AnnAssign), f"{path.name}: line {node.lineno} is not a typed assignment"
        ast.literal_eval(node.value)  # a literal, so papermill can override it
        assert "#" in lines[node.lineno - 1], (
            f"{path.name}: parameter on line {node.lineno} has no # help comment"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter_with_its_help(path):
    # papermill's own parser documents the cell (`papermill --help-notebook`); a line it cannot parse (an "=" in
    # the help text, say) prints "Unable to parse line" in every run and drops that parameter from the help.
    cell = next(c for c in _cells(path) if "parameters" in c.get("metadata", {}).get("tags", []))
    declared = [node.target.id for node in ast.parse(_source(cell)).body]
    inspected = papermill.inspect_notebook(str(path))
    assert list(inspected) == declared
    assert all(inspected[name]["help"] for name in declared), f"{path.name}: a parameter lost its help text"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_asyncio_run_no_global(path):
    for cell in _cells(path):
        if cell["cell_type"] != "code":
            continue
        source = _source(cell)
        assert "asyncio.run(" not in source, f"{path.name}: notebooks await at top level"
        assert not any(line.lstrip().startswith("global ") for line in source.splitlines()), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_defaults_validate_against_the_config_class(path):
    model = config_class(path)
    assert model is not None, f"{path.name}: metadata draftgen.step must name its step (draftgen.steps)"
    build_config(model, declared_parameters(path))
    assert set(declared_parameters(path)) == set(model.model_fields), (
        f"{path.name}: parameters cell and {model.__name__} must declare the same names"
    )


# ----- no cell writes a file: the step's run(config) writes its whole folder, the cells after it only show ---------
# What a cell's code could write with, read statically (tests/test_layout.py and test_tune.py audit the kernels
# themselves while the notebooks run, for what a library call writes that no name here shows).
WRITING_METHODS = {
    "write", "writelines", "write_text", "write_bytes", "write_parquet", "write_csv", "write_json",
    "write_ndjson", "write_ipc", "write_avro", "write_excel", "write_database", "sink_parquet", "sink_csv",
    "sink_ipc", "to_parquet", "to_csv", "to_json", "to_pickle", "savefig", "mkdir", "makedirs", "touch",
    "unlink", "rmdir", "rmtree", "rename", "symlink_to", "hardlink_to", "dump", "copy", "copyfile",
    "copytree", "move", "remove", "chmod", "truncate",
}  # fmt: skip
WRITING_PREFIXES = ("save", "write", "finalize", "publish", "replace_file", "open_run", "finish_run")
WRITING_MODULES = {"shutil", "tempfile"}


def _called_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _opens_for_writing(node: ast.Call) -> bool:
    """``open(path)`` reads; any other mode, or one not written as a literal, may write."""
    mode = (
        node.args[1]
        if len(node.args) > 1
        else next((k.value for k in node.keywords if k.arg == "mode"), None)
    )
    if mode is None:
        return False
    return not (
        isinstance(mode, ast.Constant) and isinstance(mode.value, str) and not set(mode.value) & set("wax+")
    )


def writes_in(source: str) -> list[str]:
    """What in a cell's code may write a file: calls by their names, and imports of modules that do."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if (name == "open" and _opens_for_writing(node)) or name in WRITING_METHODS:
                found.append(f"{name}(...)")
            elif name.startswith(WRITING_PREFIXES):
                found.append(f"{name}(...)")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {m}" for m in modules if m.split(".")[0] in WRITING_MODULES]
    return found


def test_the_write_scan_finds_writes_and_passes_reads():
    for source in (
        'open(path, "w").write("x")',
        "open(path, mode)",
        "df.write_parquet(path)",
        "frame.to_parquet(path)",
        "fig.savefig('x.png')",
        "report.save_figure(fig, out, 'x')",
        "export_dir = finalize_export(result)",
        "Path(p).write_text('x')",
        "import shutil",
        "from tempfile import mkdtemp",
    ):
        assert writes_in(source), source
    for source in ("open(path).read()", 'open(path, "rb")', "report.results_table(bench)", "print(x)"):
        assert writes_in(source) == [], source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_one_cell_runs_the_step_and_no_cell_writes_a_file(path):
    step = step_of(path)
    module, _, function = step.run.partition(":")
    code = [_source(c) for c in _cells(path) if c["cell_type"] == "code"]
    assert any(f"from {module} import" in source and function in source for source in code), (
        f"{path.name}: imports {step.run}, the step's one function"
    )
    runs = [
        source
        for source in code
        if any(isinstance(n, ast.Call) and _called_name(n) == function for n in ast.walk(ast.parse(source)))
    ]
    assert len(runs) == 1, f"{path.name}: exactly one cell calls {function}(config)"
    for source in code:
        assert writes_in(source) == [], f"{path.name}: a cell writes ({writes_in(source)}):\n{source}"
