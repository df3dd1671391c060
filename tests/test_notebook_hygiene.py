"""Every committed notebook follows the house rules (docs/design.md#rules-of-the-road-for-notebooks): checked
statically, no kernel needed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import papermill
import pytest

from draftgen.params import build_config
from draftgen.runner import config_class, declared_parameters

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
