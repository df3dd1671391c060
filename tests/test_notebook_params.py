"""Each notebook parameter is declared once, in its config class; the notebooks' parameters cells are rendered.

The first test is the one that guards the committed notebooks: it fails when a cell differs from what its config
class renders, and prints the diff and the command that rewrites the cells.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from draftgen import notebook_params
from draftgen.notebook_params import (
    FIX_COMMAND,
    cell_diff,
    notebook_literal,
    notebook_type,
    render_parameters_cell,
)
from draftgen.params import NotebookCell, Params, PositiveInt, ProjectPath, load_params_files, param
from draftgen.runner import applicable_parameters, check_parameters, config_class, declared_parameters
from draftgen.training.trainers import Trainer

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_parameters_cell_is_the_rendering_of_its_config_class(path):
    diff = cell_diff(path)
    assert not diff, (
        f"{path.name}'s parameters cell differs from its config class (defaults and help live in the class):\n"
        f"{diff}\nfix: {FIX_COMMAND}"
    )


def test_every_notebook_is_rendered():
    assert notebook_params.committed_notebooks() == NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_literal_differs_from_the_config_default_only_where_it_must(path):
    # Required fields show a notebook default; a None default shows papermill's "not set" literal. Nothing else.
    model = config_class(path)
    for name, value in declared_parameters(path).items():
        field = model.model_fields[name]
        if field.is_required():
            continue
        default = field.get_default(call_default_factory=True)
        if default is None:
            assert value in ("", 0, 0.0), (name, value)
        else:
            assert value == getattr(default, "value", default), (name, value, default)


class _Example(Params):
    parameters_cell = NotebookCell(
        ("where", "url dirs"),
        ("how", "level mode trainer count ratio"),
        help={"count": "how many, in this notebook"},
    )

    url: str = param(..., "the server", notebook="http://127.0.0.1:30000")
    dirs: ProjectPath | list[ProjectPath] = param(..., "one folder or several", notebook="outputs/x")
    level: Literal["low", "high"] = param("low", "how hard")
    mode: PositiveInt | None = param(None, "0: not set")
    trainer: Trainer = param(Trainer.SPECFORGE_QWEN35, "whose mask")
    count: Annotated[int, Field(ge=0)] = param(3, "how many")
    ratio: float | None = param(None, "0: not set", ge=0)


def test_a_cell_renders_types_literals_help_and_sections():
    assert render_parameters_cell(_Example).splitlines() == [
        "# where",
        'url: str = "http://127.0.0.1:30000"  # the server',
        'dirs: str = "outputs/x"  # one folder or several',
        "# how",
        'level: str = "low"  # how hard',
        "mode: int = 0  # 0: not set",
        'trainer: str = "specforge-qwen3.5"  # whose mask',
        "count: int = 3  # how many, in this notebook",
        "ratio: float = 0.0  # 0: not set",
    ]


def test_types_and_literals_as_a_notebook_writes_them():
    assert notebook_type(list[PositiveInt]) == "list[int]"
    assert notebook_type(str | list[int]) == "str"
    assert notebook_type(list[Literal["a", "b"]]) == "list[str]"
    assert notebook_type(list) == "list"
    literal = notebook_literal([{"name": 'a "b"', "gpus": 4, "on": True}, 0.5])
    assert literal == '[{"name": "a \\"b\\"", "gpus": 4, "on": True}, 0.5]'
    assert ast.literal_eval(literal) == [{"name": 'a "b"', "gpus": 4, "on": True}, 0.5]


def test_a_parameter_without_help_or_with_a_notebook_literal_for_an_optional_field_is_refused():
    with pytest.raises(TypeError, match="help"):
        param(4096)
    with pytest.raises(TypeError, match="required"):
        param(4096, "longest completion", notebook=512)


def test_a_layout_that_misses_or_repeats_a_field_is_refused():
    class Missing(Params):
        parameters_cell = NotebookCell(("", "a a"))
        a: int = param(1, "a")
        b: int = param(2, "b")

    with pytest.raises(ValueError, match=r"repeated \['a'\], missing \['b'\]"):
        render_parameters_cell(Missing)


def test_help_papermill_could_not_parse_is_refused():
    class Equals(Params):
        parameters_cell = NotebookCell(("", "a"))
        a: int = param(1, "a = 1 means one")

    with pytest.raises(ValueError, match="cannot hold '='"):
        render_parameters_cell(Equals)


def test_a_required_field_names_its_notebook_literal():
    class Required(Params):
        parameters_cell = NotebookCell(("", "a"))
        a: str = param(..., "a thing")

    with pytest.raises(ValueError, match="notebook="):
        render_parameters_cell(Required)


def test_check_prints_the_diff_and_the_fix_and_write_fixes_it(tmp_path, capsys):
    path = tmp_path / "benchmark.ipynb"
    shutil.copy(NOTEBOOKS[0], path)
    notebook = json.loads(path.read_text())
    cell = next(c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = [line.replace("= 4096", "= 2048") for line in cell["source"]]
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")

    assert notebook_params.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "-max_tokens: int = 2048" in out and "+max_tokens: int = 4096" in out and FIX_COMMAND in out

    assert notebook_params.main(["--write", str(path)]) == 0
    assert path.read_text() == NOTEBOOKS[0].read_text()
    assert notebook_params.main([str(path)]) == 0


PARAMS = Path(__file__).resolve().parents[1] / "params"
PIPELINE = ("benchmark", "estimate", "generate", "validate")


@pytest.mark.parametrize(
    ("params_file", "notebook"),
    [(f, nb) for f in ("b200x7", "sim") for nb in PIPELINE] + [("tune", "tune")],
)
def test_params_files_pass_draftgen_runs_checks_over_the_rendered_defaults(params_file, notebook):
    path = next(p for p in NOTEBOOKS if p.stem == notebook)
    given, _ignored = applicable_parameters(
        declared_parameters(path), load_params_files([PARAMS / f"{params_file}.yaml"])
    )
    check_parameters(path, given)
