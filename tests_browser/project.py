"""A throwaway project for JupyterLab: this checkout's notebooks with their parameters cells edited, as a user would.

The project is laid out like the checkout (``pyproject.toml`` + ``notebooks/``), so the kernel JupyterLab starts
in ``notebooks/`` finds it as the project root and writes run folders to ``<project>/outputs/``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]


def make_project(root: Path) -> Path:
    (root / "notebooks").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "lab-test-project"\n')
    return root


def set_parameters(source: str, values: Mapping[str, Any]) -> str:
    """The parameters cell ``source`` with each named parameter's literal replaced; comments stay.

    Fails on a name the cell does not declare, so a renamed parameter breaks this test loudly, not silently.
    """
    lines = source.splitlines()
    declared: dict[str, ast.AnnAssign] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            declared[node.target.id] = node
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise KeyError(f"the parameters cell declares no {', '.join(unknown)}")
    for name, value in values.items():
        node = declared[name]
        assert node.value is not None and node.value.lineno == node.value.end_lineno, name
        index = node.value.lineno - 1
        line = lines[index]
        literal = repr(value)
        lines[index] = line[: node.value.col_offset] + literal + line[node.value.end_col_offset :]
    edited = "\n".join(lines)
    ast.parse(edited)
    return edited


def copy_notebook(name: str, project: Path, values: Mapping[str, Any], *, as_name: str | None = None) -> Path:
    """notebooks/NAME.ipynb → project/notebooks/AS_NAME.ipynb with ``values`` typed into its parameters cell."""
    nb = json.loads((CHECKOUT / "notebooks" / f"{name}.ipynb").read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{name}.ipynb: one parameters cell expected"
    edited = set_parameters("".join(cells[0]["source"]), values)
    cells[0]["source"] = edited.splitlines(keepends=True)
    target = project / "notebooks" / f"{as_name or name}.ipynb"
    target.write_text(json.dumps(nb, indent=1))
    return target
