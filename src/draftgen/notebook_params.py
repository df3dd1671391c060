"""Each notebook's parameters cell, rendered from its config class, where every parameter is declared once.

The config class (``draftgen.config`` in the notebook's metadata) gives each field's default and help through
``param()``, and the cell's sections and order through its ``parameters_cell``. A field renders as one typed
literal with its help, the way papermill documents it (``papermill --help-notebook``)::

    max_tokens: int = 4096  # longest completion, tokens

The type is the field's as a notebook literal has it (``str`` for a Literal, an enum or ``str | list[str]``,
``dict`` for a nested model); the literal is the field's default, a required field's ``notebook=`` literal, or,
for a None default, the literal that means "not set" ("", 0, 0.0: papermill cannot pass None).

    python -m draftgen.notebook_params           # check: print each committed cell that differs, as a diff
    python -m draftgen.notebook_params --write   # rewrite the committed cells from the config classes
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import math
import sys
import types
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from draftgen.params import Params
from draftgen.rundir import write_text
from draftgen.runner import REPO_ROOT, config_class

FIX_COMMAND = "python -m draftgen.notebook_params --write"
# The literal that means "not set" for an optional parameter whose config default is None (params._unset_if_empty).
UNSET_LITERALS: dict[str, Any] = {"str": "", "int": 0, "float": 0.0}


def notebook_type(annotation: Any) -> str:
    """The annotation a notebook literal of this field carries: ``PositiveInt | None`` → ``int``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return notebook_type(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        # papermill passes one form: the first that is not None ("str" of `str | list[str]`).
        return notebook_type(next(a for a in get_args(annotation) if a is not type(None)))
    if origin is Literal:
        return type(get_args(annotation)[0]).__name__
    if origin is list:
        args = get_args(annotation)
        return f"list[{notebook_type(args[0])}]" if args else "list"
    if origin is dict or annotation is dict:
        return "dict"
    if annotation is list:
        return "list"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "dict"
        if issubclass(annotation, Enum):
            return type(next(iter(annotation)).value).__name__
        if annotation in (str, int, float, bool):
            return annotation.__name__
    raise TypeError(f"no notebook literal type for {annotation!r}")


def notebook_literal(value: Any) -> str:
    """``value`` as Python source a parameters cell holds (double-quoted strings, like the rest of the code)."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} has no literal")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(notebook_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{notebook_literal(k)}: {notebook_literal(v)}" for k, v in value.items()) + "}"
        )
    raise TypeError(f"no notebook literal for {value!r}")


def notebook_value(name: str, field: FieldInfo) -> Any:
    """The value the notebook's cell shows for one field."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "notebook" in extra:
        return extra["notebook"]
    if field.is_required():
        raise ValueError(
            f"{name}: a required field names the literal its notebook shows (param(..., notebook=))"
        )
    value = field.get_default(call_default_factory=True)
    if value is None:
        kind = notebook_type(field.annotation)
        if kind not in UNSET_LITERALS:
            raise ValueError(f"{name}: a None default of type {kind} has no 'not set' literal")
        return UNSET_LITERALS[kind]
    return value


def parameter_line(model: type[Params], name: str) -> str:
    """``name: type = literal  # help``, checked to read back as it was meant (by Python and by papermill)."""
    field = model.model_fields[name]
    value = notebook_value(name, field)
    literal = notebook_literal(value)
    help_text = model.parameter_help(name)
    if not help_text:
        raise ValueError(f"{model.__name__}.{name} has no help text: declare it with param(default, help)")
    # papermill's parser (papermill --help-notebook) drops a line with a second "=" and cuts at the first "#".
    for part, text in (("default", literal), ("help", help_text)):
        if "=" in text or "\n" in text or (part == "default" and "#" in text):
            raise ValueError(
                f"{model.__name__}.{name}: the {part} {text!r} cannot hold '=', '#' or a newline"
            )
    if ast.literal_eval(literal) != (value.value if isinstance(value, Enum) else value):
        raise ValueError(f"{model.__name__}.{name}: {literal} does not read back as {value!r}")
    return f"{name}: {notebook_type(field.annotation)} = {literal}  # {help_text}"


def render_parameters_cell(model: type[Params]) -> str:
    """The parameters cell of ``model``'s notebook: ``# section`` lines over its fields, in the layout's order."""
    cell = model.parameters_cell
    if cell is None:
        raise ValueError(f"{model.__name__} has no parameters_cell layout")
    names = cell.names
    repeated = sorted({n for n in names if names.count(n) > 1})
    missing = [n for n in model.model_fields if n not in names]
    unknown = [n for n in names if n not in model.model_fields]
    if repeated or missing or unknown:
        raise ValueError(
            f"{model.__name__}.parameters_cell must name every field once: "
            f"repeated {repeated}, missing {missing}, unknown {unknown}"
        )
    lines = []
    for title, section in cell.sections:
        if title:
            lines.append(f"# {title}")
        lines.extend(parameter_line(model, name) for name in section)
    return "\n".join(lines)


def _parameters_cell(notebook: dict, path: Path) -> dict:
    cells = [c for c in notebook["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path}: exactly one cell must be tagged 'parameters'")
    return cells[0]


def cell_diff(path: Path) -> str:
    """The unified diff from ``path``'s committed parameters cell to its rendering ("" when they agree)."""
    model = config_class(path)
    if model is None:
        raise ValueError(f"{path}: metadata draftgen.config must name the config class")
    committed = "".join(_parameters_cell(json.loads(path.read_text()), path)["source"])
    rendered = render_parameters_cell(model)
    if committed == rendered:
        return ""
    return "\n".join(
        difflib.unified_diff(
            committed.splitlines(),
            rendered.splitlines(),
            f"{path.name} (committed)",
            f"{path.name} (rendered from {model.__module__}.{model.__name__})",
            lineterm="",
        )
    )


def write_parameters_cell(path: Path) -> bool:
    """Replace ``path``'s parameters cell with its rendering; True when the file changed."""
    model = config_class(path)
    if model is None:
        raise ValueError(f"{path}: metadata draftgen.config must name the config class")
    text = path.read_text()
    notebook = json.loads(text)
    _parameters_cell(notebook, path)["source"] = render_parameters_cell(model).splitlines(keepends=True)
    new = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"  # as Jupyter writes it
    if new == text:
        return False
    write_text(path, new)
    return True


def committed_notebooks() -> list[Path]:
    """The repository's notebooks that name a config class."""
    return [p for p in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")) if config_class(p) is not None]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m draftgen.notebook_params",
        description="Render each notebook's parameters cell from its config class: check (default) or --write.",
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--write", action="store_true", help="rewrite the cells that differ")
    args = parser.parse_args(argv)
    paths = args.notebooks or committed_notebooks()
    if args.write:
        for path in paths:
            if write_parameters_cell(path):
                print(f"rewrote the parameters cell of {path}")
        return 0
    drifted = 0
    for path in paths:
        diff = cell_diff(path)
        if diff:
            drifted += 1
            print(diff)
    if drifted:
        print(f"{drifted} parameters cell(s) differ from their config classes; fix: {FIX_COMMAND}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
