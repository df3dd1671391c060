"""The parameter tables of docs/ against the definitions (draftgen.param_tables): a rendered table that differs from
its rendering, or a hand-written flag table that misses a flag or a default, fails here."""

from __future__ import annotations

import argparse

import pytest

from draftgen import param_tables
from draftgen.params import NotebookCell, Params, param

PAGES = param_tables.pages()


def test_the_pages_with_tables_are_the_reference_pages():
    names = {path.name for path in PAGES}
    assert {
        "generate.md",
        "validate.md",
        "simulator.md",
        "serve.md",
        "tune.md",
        "benchmark.md",
        "design.md",
    } <= names


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_table_of_the_page_is_what_the_definitions_say(page):
    problems = param_tables.page_problems(page)
    assert problems == [], f"{page.name}:\n" + "\n".join(problems) + f"\nfix: {param_tables.FIX_COMMAND}"


class _Fake(Params):
    parameters_cell = NotebookCell(
        ("first", "size urls"),
        ("second", "mode"),
        help={"mode": "this notebook's words"},
        doc={"urls": "the page's own words"},
    )

    size: int = param(4, "how many", doc="how many, at length | with a pipe")
    urls: list[str] = param(default_factory=lambda: [f"http://host-{i}:1" for i in range(5)], help="where")
    mode: str = param("a", "which", doc="a doc the notebook's own help overrides")


def test_a_row_shows_the_notebook_literal_and_the_longest_meaning_it_has():
    rows = param_tables.parameter_rows(_Fake, ["size", "urls", "mode"]).splitlines()
    assert rows[:2] == ["| parameter | default | meaning |", "|---|---|---|"]
    assert rows[2] == "| `size` | `4` | how many, at length \\| with a pipe |"  # the doc, its pipe escaped
    assert (
        rows[3]
        == '| `urls` | `["http://host-0:1", …, "http://host-4:1"]` (5 items) | the page\'s own words |'
    )
    assert (
        rows[4] == '| `mode` | `"a"` | this notebook\'s words |'
    )  # the notebook's help beats the shared doc


def test_a_step_table_names_an_existing_section():
    assert "| `attention_backend` |" in param_tables.parameters_table('tune "what SGLang allows"')
    with pytest.raises(ValueError, match="has no cell section 'nope'"):
        param_tables.parameters_table('tune "nope"')
    with pytest.raises(KeyError, match="no step named"):
        param_tables.parameters_table("nostep")


def test_rendering_replaces_only_what_the_markers_enclose():
    page = "intro\n<!-- parameters: monitor -->\nstale\n<!-- end parameters -->\nafter\n"
    rendered = param_tables.render_page(page)
    assert rendered.startswith("intro\n<!-- parameters: monitor -->\n| parameter | default | meaning |")
    assert "| `bins` | `120` |" in rendered and "stale" not in rendered
    assert rendered.endswith("<!-- end parameters -->\nafter\n")
    assert param_tables.render_page(rendered) == rendered


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--speed", type=float, default=2.0)
    parser.add_argument("--name", default=None)
    parser.add_argument("--flag-a", action="store_true")
    parser.add_argument("--flag-b", default="x")
    return parser


def test_a_flag_table_must_list_every_flag_with_its_default():
    good = (
        "| `--port P` | 30000 | m |\n| `--speed X` | 2 | m |\n| `--name N` | none | m |\n"
        "| `--flag-*` | off, `x` | m |\n"
    )
    assert param_tables.options_problems(good, _parser()) == []
    drifted = (
        "| `--port P` | 30001 | m |\n| `--speed X` | 2 | m |\n| `--gone` | | m |\n| `--flag-*` | off | m |\n"
    )
    assert param_tables.options_problems(drifted, _parser()) == [
        "--port: its default 30000 is not in its row's default column ('30001')",
        "--name is not in the table",
        "--flag-b: its default x is not in its row's default column ('off')",
        "--gone is in the table but not a flag of the command",
    ]
