"""The package's shape stays as the style asks: no class over 300 lines, no import cycle in src/draftgen.

Read from the source with ``ast`` (nothing is imported; about a second of CPU). Every import statement counts,
wherever it sits: at module level, under ``if TYPE_CHECKING:`` and inside a function. A function-local import
that keeps a heavy library off a command's start-up (``draftgen status`` without the HTTP stack) is fine, and it
is still an edge here, so it cannot hide a cycle. ``from package import name`` is an edge to the module
``package.name`` when there is one, else to the package; importing ``a.b`` runs ``a/__init__.py`` first, but that
implicit edge is not drawn (a package may import its own modules).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "draftgen"
MAX_CLASS_LINES = 300


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    where: str  # "module", "TYPE_CHECKING" or "function"


Trees = dict[str, tuple[Path, ast.Module]]  # module name -> its file and its syntax tree


def parse_package(src: Path, package: str) -> Trees:
    """Every module of ``package`` under ``src`` by dotted name (a package by its own name), parsed."""
    trees = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        trees[".".join(parts)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return trees


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(body: list[ast.stmt], where: str = "module") -> Iterator[tuple[ast.stmt, str]]:
    """Every statement, nested ones too, with where it runs (imports are statements: expressions are skipped)."""
    for statement in body:
        yield statement, where
        inner = "function" if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) else where
        if isinstance(statement, ast.If) and _is_type_checking(statement.test) and where == "module":
            yield from _statements(statement.body, "TYPE_CHECKING")
            yield from _statements(statement.orelse, where)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for block in getattr(statement, field, ()):
                if isinstance(block, ast.stmt):
                    yield from _statements([block], inner)
                else:  # an except handler or a match case: statements of its own
                    yield from _statements(block.body, inner)


def import_edges(trees: Trees) -> list[Edge]:
    """Each import of one of the package's own modules by another, with its line and where it sits."""
    edges = []
    for name, (path, tree) in trees.items():
        for statement, where in _statements(tree.body):
            if isinstance(statement, ast.Import):
                targets = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom):
                base = statement.module or ""
                if statement.level:
                    parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    parts = parts[: len(parts) - statement.level + 1]
                    base = ".".join([*parts, *([statement.module] if statement.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in trees else base
                    for alias in statement.names
                ]
            else:
                continue
            for target in targets:
                if target in trees and target != name:
                    edges.append(Edge(name, target, statement.lineno, where))
    return edges


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One import cycle (its edges in order) per group of modules that import each other; [] when acyclic."""
    graph: dict[str, list[Edge]] = {}
    for edge in sorted(edges, key=lambda e: (e.source, e.target, e.line)):
        graph.setdefault(edge.source, []).append(edge)
    cycles = []
    for group in sorted(_strongly_connected(graph)):
        if len(group) > 1:
            cycles.append(_cycle_in(graph, group))
    return cycles


def _strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph.get(root, [])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, out = work[-1]
            edge = next(out, None)
            if edge is not None:
                if edge.target not in index:
                    index[edge.target] = low[edge.target] = len(index)
                    stack.append(edge.target)
                    on_stack.add(edge.target)
                    work.append((edge.target, iter(graph.get(edge.target, []))))
                elif edge.target in on_stack:
                    low[module] = min(low[module], index[edge.target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                groups.append(sorted(group))
    return groups


def _cycle_in(graph: dict[str, list[Edge]], group: list[str]) -> list[Edge]:
    """The shortest way from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    came_by: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for edge in graph.get(module, []):
                if edge.target not in members or edge.target in came_by:
                    continue
                came_by[edge.target] = edge
                if edge.target == start:
                    cycle = [edge]
                    while cycle[0].source != start:
                        cycle.insert(0, came_by[cycle[0].source])
                    return cycle
                following.append(edge.target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {group}")


def describe(cycle: list[Edge]) -> str:
    return "\n".join(f"  {e.source} imports {e.target} (line {e.line}, {e.where})" for e in cycle)


def long_classes(trees: Trees, limit: int = MAX_CLASS_LINES) -> list[str]:
    """Every class (nested ones too) longer than ``limit`` lines, decorators included, as 'module.Class: N lines'."""
    found = []
    for name, (path, tree) in trees.items():
        for node, _ in _statements(tree.body):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > limit:
                    found.append(f"{name}.{node.name} ({path.name}:{first}): {lines} lines")
    return found


# ----- the package -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def package() -> Trees:
    trees = parse_package(SRC, PACKAGE)
    assert len(trees) > 100, f"only {len(trees)} modules under {SRC / PACKAGE}: is SRC right?"
    return trees


def test_no_import_cycle_in_src(package):
    cycles = find_cycles(import_edges(package))
    if cycles:
        pytest.fail(
            f"{len(cycles)} import cycle(s) in src/{PACKAGE} (every import counts, function-local ones too):\n"
            + "\n\n".join(describe(cycle) for cycle in cycles),
            pytrace=False,
        )


def test_no_class_over_300_lines(package):
    if found := long_classes(package):
        pytest.fail(
            f"classes over {MAX_CLASS_LINES} lines: fold or split them along their responsibilities:\n  "
            + "\n  ".join(found),
            pytrace=False,
        )


# ----- the checks themselves, on a package written here -------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> Trees:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return parse_package(root, "pkg")


CLEAN = {
    "__init__.py": "from pkg.a import A\n",  # a package importing its own module is no cycle
    "a.py": "import json\nfrom pkg import b\nA = 1\n",
    "b.py": "try:\n    from .sub import c\nexcept ImportError:\n    pass\n",
    "sub/__init__.py": "from . import d\n",
    "sub/c.py": "def f():\n    if True:\n        from pkg.sub import d\n",
    "sub/d.py": "",
}


def test_an_acyclic_package_passes(tmp_path):
    edges = import_edges(_package(tmp_path, CLEAN))
    assert {(e.source, e.target, e.where) for e in edges} == {
        ("pkg", "pkg.a", "module"),
        ("pkg.a", "pkg.b", "module"),
        ("pkg.b", "pkg.sub.c", "module"),
        ("pkg.sub", "pkg.sub.d", "module"),
        ("pkg.sub.c", "pkg.sub.d", "function"),
    }
    assert find_cycles(edges) == []


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    cycles = find_cycles(
        import_edges(_package(tmp_path, {**CLEAN, "sub/d.py": "def g():\n    from ..a import A\n"}))
    )
    assert [[(e.source, e.target, e.where) for e in cycle] for cycle in cycles] == [
        [
            ("pkg.a", "pkg.b", "module"),
            ("pkg.b", "pkg.sub.c", "module"),
            ("pkg.sub.c", "pkg.sub.d", "function"),
            ("pkg.sub.d", "pkg.a", "function"),
        ]
    ]
    assert "  pkg.sub.d imports pkg.a (line 2, function)" in describe(cycles[0]).splitlines()


def test_each_cycle_is_named_a_type_checking_import_included(tmp_path):
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    files = {
        **CLEAN,
        "b.py": typed,
        "sub/c.py": "import pkg.sub.d\n",
        "sub/d.py": "from pkg.sub.c import f\n",
    }
    cycles = find_cycles(import_edges(_package(tmp_path, files)))
    assert [[(e.source, e.target, e.where) for e in cycle] for cycle in cycles] == [
        [("pkg.a", "pkg.b", "module"), ("pkg.b", "pkg.a", "TYPE_CHECKING")],
        [("pkg.sub.c", "pkg.sub.d", "module"), ("pkg.sub.d", "pkg.sub.c", "module")],
    ]


def test_a_class_over_the_limit_is_named(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(299))
    files = {
        "__init__.py": "",
        "big.py": f"@decorated\nclass Big:\n{body}\n",
        "small.py": f"class Small:\n{body}\n",
    }
    nested = (
        f"def outer():\n    class Inner:\n{body.replace('    ', '        ')}\n        y = 1\n        z = 2\n"
    )
    assert long_classes(_package(tmp_path, {**files, "nested.py": nested})) == [
        "pkg.big.Big (big.py:1): 301 lines",
        "pkg.nested.Inner (nested.py:2): 302 lines",
    ]
