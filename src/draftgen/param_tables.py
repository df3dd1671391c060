"""The parameter tables of docs/, from the definitions: rendered where a table can be, checked where it is prose.

A page marks each table with a pair of comments naming its source::

    <!-- parameters: generate -->                  every parameter of a step, in its parameters cell's order
    <!-- parameters: tune "the search space" -->   one section of the step's parameters cell
    <!-- faults -->                                the simulator's --fault keys (draftgen.sim.faults)
    <!-- shared parameters -->                     the names one params file may set for every notebook
    <!-- files -->                                 what each step's run folder holds (draftgen.rundir.layout)
    <!-- files: generate -->                       one step's folder as a tree, each file with what it holds
    <!-- files: demo -->                           draftgen demo's folder as a tree
    <!-- exit codes -->                            every command's exit codes (draftgen.exit_codes)
    ...
    <!-- end parameters -->                        (end faults, end shared parameters)

Those are rendered here: a parameter's default is its notebook literal, its meaning the ``doc`` of its declaration
(``param(..., doc=...)``), else its help in that notebook. Around a command's hand-written flag table,
``<!-- options: sim -->`` ... ``<!-- end options -->`` asks for a check instead: every flag of ``draftgen sim`` is
in the table, and every number or name it defaults to stands in its row.

The pages are docs/*.md and the README.

    python -m draftgen.param_tables           # check every page: print what differs (exit 1 when anything does)
    python -m draftgen.param_tables --write   # rewrite the rendered tables
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from draftgen.exit_codes import markdown_table
from draftgen.notebook_params import notebook_literal, notebook_value
from draftgen.params import SHARED_PARAMETERS, Params
from draftgen.rundir import layout, write_text
from draftgen.rundir.layout import Entry
from draftgen.runner import REPO_ROOT
from draftgen.steps import STEPS, get_step

FIX_COMMAND = "python -m draftgen.param_tables --write"
DOCS = REPO_ROOT / "docs"
LONG_LITERAL = 60  # characters: a longer list default shows its first and last items
README = REPO_ROOT / "README.md"
_BLOCK = re.compile(
    r"<!-- (parameters|faults|shared parameters|files|exit codes)(?:: ([^>]*?))? -->\n(.*?)<!-- end \1 -->\n",
    re.S,
)
_OPTIONS = re.compile(r"<!-- options: ([\w-]+) -->\n(.*?)<!-- end options -->\n", re.S)
_SECTION = re.compile(r'^(\w+)(?: "([^"]*)")?$')


# Commands that take a config but are no notebook step (``draftgen loop``): "module:Class".
COMMAND_CONFIGS = {"loop": "draftgen.loop.config:LoopConfig"}


def _load_config(spec: str) -> type[Params]:
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_text(value: Any) -> str:
    literal = notebook_literal(value)
    if len(literal) > LONG_LITERAL and isinstance(value, list) and len(value) > 2:
        first, last = notebook_literal(value[0]), notebook_literal(value[-1])
        return f"`[{first}, …, {last}]` ({len(value)} items)"
    return f"`{literal}`"


def meaning(model: type[Params], name: str) -> str:
    """What a parameter's row says: the notebook's own words for it, else its declaration's doc, else its help."""
    cell = model.parameters_cell
    if cell is not None and name in cell.doc:
        return cell.doc[name]
    extra = model.model_fields[name].json_schema_extra
    if (cell is None or name not in cell.help) and isinstance(extra, dict) and extra.get("doc"):
        return str(extra["doc"])
    return model.parameter_help(name)


def parameters_table(spec: str) -> str:
    """``generate`` or ``tune "the search space"``: the rows of a step's parameters (or one cell section)."""
    match = _SECTION.match(spec.strip())
    if not match:
        raise ValueError(f'parameters table {spec!r}: write STEP or STEP "section title"')
    if match.group(1) in COMMAND_CONFIGS:  # a command's config, no notebook: its fields in declaration order
        model = _load_config(COMMAND_CONFIGS[match.group(1)])
        return parameter_rows(model, list(model.model_fields), example="for example")
    model = get_step(match.group(1)).config_class()
    cell = model.parameters_cell
    assert cell is not None, f"{model.__name__} has no parameters cell"
    if match.group(2) is None:
        names = cell.names
    else:
        sections = {title: names for title, names in cell.sections}
        if match.group(2) not in sections:
            raise ValueError(
                f"{model.__name__} has no cell section {match.group(2)!r}; it has {list(sections)}"
            )
        names = list(sections[match.group(2)])
    return parameter_rows(model, names)


def parameter_rows(model: type[Params], names: Sequence[str], example: str = "the notebook") -> str:
    """The table of ``names`` of ``model``: each parameter's notebook literal and meaning."""
    rows = ["| parameter | default | meaning |", "|---|---|---|"]
    for name in names:
        field = model.model_fields[name]
        default = _default_text(notebook_value(name, field))
        if field.is_required():
            default = f"required ({example}: {default})"
        rows.append(f"| `{name}` | {_cell(default)} | {_cell(meaning(model, name))} |")
    return "\n".join(rows) + "\n"


def faults_table(spec: str = "") -> str:
    """The simulator's fault keys: what each takes, its default, what it does (draftgen.sim.faults.Faults)."""
    from draftgen.sim.faults import Faults

    rows = ["| key | values | default | effect |", "|---|---|---|---|"]
    for item in fields(Faults):
        if "effect" not in item.metadata:
            raise ValueError(
                f"Faults.{item.name} has no effect text: declare it with fault(default, values, effect)"
            )
        default = str(item.default).lower() if isinstance(item.default, bool) else item.default
        default_text = '`""`' if default == "" else f"`{default}`"
        rows.append(
            f"| `{item.name}` | {_cell(item.metadata['values'])} | {default_text} | {_cell(item.metadata['effect'])} |"
        )
    return "\n".join(rows) + "\n"


def shared_parameters_line(spec: str = "") -> str:
    """The shared names, wrapped at the docs' line width (no docs line over 120 characters outside tables)."""
    names = ", ".join(f"`{name}`" for name in sorted(SHARED_PARAMETERS)) + "."
    return textwrap.fill(names, width=116, break_long_words=False, break_on_hyphens=False) + "\n"


def _folders() -> list[tuple[str, tuple[Entry, ...]]]:
    """Every run folder's files by who writes them: every run, a notebook's run, serve, each step."""
    return [
        ("every run", layout.RUN_FILES),
        ("a notebook's run", layout.NOTEBOOK_FILES),
        ("serve", layout.SERVE_FILES),
        *((step.name, step.files) for step in STEPS),
    ]


def files_table(spec: str = "") -> str:
    """What each run folder holds, from ``draftgen.rundir.layout``: the files every finished run writes, and those
    written only when something applies (the condition in brackets). ``spec`` "demo": ``draftgen demo``'s folder."""
    if spec == "demo":
        return demo_tree()
    if spec:
        return step_tree(spec)
    rows = ["| run folder of | every finished run writes | and, where it applies |", "|---|---|---|"]
    for name, entries in _folders():
        always = ", ".join(f"`{e.path}`" for e in entries if not e.when) or "nothing"
        sometimes = "; ".join(f"`{e.path}` ({e.when})" for e in entries if e.when) or "–"
        rows.append(f"| {name} | {_cell(always)} | {_cell(sometimes)} |")
    return "\n".join(rows) + "\n"


def step_tree(name: str) -> str:
    """One step's run folder as a tree: each file (and every run's own) with what it holds and when."""
    entries = [*get_step(name).files, *layout.RUN_FILES]
    width = max(len(e.path) for e in entries) + 2
    lines = ["```", "out_dir/"]
    for e in entries:
        lines.append(f"  {e.path:<{width}} {e.what}" + (f" (when: {e.when})" if e.when else ""))
    return "\n".join([*lines, "```"]) + "\n"


def demo_tree() -> str:
    """``draftgen demo``'s folder as a tree: its own folders, then each step's files (conditions in brackets)."""
    from draftgen.commands.demo import STEPS as DEMO_STEPS

    width, indent = 110, 15
    lines = ["```", "outputs/demo/"]
    for entry in layout.DEMO_FILES:
        name = entry.path.removesuffix("*")
        lines.append(f"  {name:<{indent - 2}}{entry.what}")
    for name in DEMO_STEPS:
        files = ", ".join(f"{e.path} ({e.when})" if e.when else e.path for e in get_step(name).files)
        wrapped = textwrap.wrap(files, width - indent, break_on_hyphens=False, break_long_words=False)
        lines.append(f"  {name + '/':<{indent - 2}}{wrapped[0]}")
        lines += [" " * indent + more for more in wrapped[1:]]
    return "\n".join([*lines, "```"]) + "\n"


RENDERERS: dict[str, Callable[[str], str]] = {
    "parameters": parameters_table,
    "faults": faults_table,
    "shared parameters": shared_parameters_line,
    "files": files_table,
    "exit codes": markdown_table,
}


def render_page(text: str) -> str:
    """``text`` with every marked table rendered from the definitions."""

    def rendered(match: re.Match[str]) -> str:
        kind, spec = match.group(1), match.group(2) or ""
        head = f"<!-- {kind}: {spec} -->" if spec else f"<!-- {kind} -->"
        return f"{head}\n{RENDERERS[kind](spec)}<!-- end {kind} -->\n"

    return _BLOCK.sub(rendered, text)


# ----- hand-written flag tables, checked -----------------------------------------------------------------------
def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``draftgen NAME``."""
    from draftgen.cli import build_parser

    parser = build_parser([name])
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def _default_words(action: argparse.Action) -> list[str]:
    """The words a flag's default must show in its row ([] when it has none worth showing)."""
    default = action.default
    if default is None or isinstance(default, bool) or default in ([], "") or action.required:
        return []
    if default == sys.executable:
        return ["this interpreter"]
    if isinstance(default, float):
        return [f"{default:g}"]
    return [str(default)]


def options_problems(table: str, parser: argparse.ArgumentParser) -> list[str]:
    """Where a hand-written flag table and the parser differ: flags missing or unknown, defaults not shown."""
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = {}
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        for flag in re.findall(r"`(--[\w*-]+)", cells[0]):
            documented[flag] = cells[1] if len(cells) > 1 else ""
    problems = []
    # --help and --debug are every command's, documented once (docs/design.md, "The command line")
    actions = [
        a for a in parser._actions if a.option_strings and not {"--help", "--debug"} & set(a.option_strings)
    ]
    for action in actions:
        flag = max(action.option_strings, key=len)
        row_default = next(
            (cell for documented_flag, cell in documented.items() if _covers(documented_flag, flag)), None
        )
        if row_default is None:
            problems.append(f"{flag} is not in the table")
            continue
        for word in _default_words(action):
            if not re.search(rf"(?<![\w.]){re.escape(word)}(?![\w.])", row_default):
                problems.append(
                    f"{flag}: its default {word} is not in its row's default column ({row_default!r})"
                )
    known = {max(a.option_strings, key=len) for a in actions} | {s for a in actions for s in a.option_strings}
    for documented_flag in documented:
        if not any(_covers(documented_flag, flag) for flag in known):
            problems.append(f"{documented_flag} is in the table but not a flag of the command")
    return problems


def _covers(documented: str, flag: str) -> bool:
    return flag.startswith(documented[:-1]) if documented.endswith("*") else documented == flag


# ----- pages ----------------------------------------------------------------------------------------------------
def pages() -> list[Path]:
    """The docs pages (and the README) that hold a marked table."""
    return [
        p
        for p in [*sorted(DOCS.glob("*.md")), README]
        if _BLOCK.search(p.read_text()) or _OPTIONS.search(p.read_text())
    ]


def page_problems(path: Path) -> list[str]:
    """Everything that differs on one page: rendered tables as diffs, checked flag tables as sentences."""
    text = path.read_text()
    problems = []
    rendered = render_page(text)
    if rendered != text:
        diff = difflib.unified_diff(
            text.splitlines(),
            rendered.splitlines(),
            f"{path.name} (committed)",
            f"{path.name} (rendered)",
            lineterm="",
        )
        problems.append("\n".join(diff))
    for match in _OPTIONS.finditer(text):
        problems += [
            f"{path.name}, draftgen {match.group(1)}: {p}"
            for p in options_problems(match.group(2), command_parser(match.group(1)))
        ]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m draftgen.param_tables",
        description="Render the docs' parameter tables from the definitions: check (default) or --write.",
    )
    parser.add_argument("--write", action="store_true", help="rewrite the rendered tables that differ")
    args = parser.parse_args(argv)
    if args.write:
        for path in pages():
            text = path.read_text()
            if (rendered := render_page(text)) != text:
                write_text(path, rendered)
                print(f"rewrote the tables of {path}")
    problems = [problem for path in pages() for problem in page_problems(path)]
    for problem in problems:
        print(problem)
    if problems:
        print(
            f"{len(problems)} table problem(s); rendered tables: {FIX_COMMAND}; flag tables: edit them by hand"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
