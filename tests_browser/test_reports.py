"""The saved reports in Chromium, read as a new user reads them: the answer first, nothing raw, nothing sideways.

The four ``draftgen demo`` reports (benchmark, estimate, generate, validate: a short demo run by this tier, or the
folder ``DRAFTGEN_DEMO_REPORTS`` names, e.g. outputs/demo after ``make demo``) and the reports of the notebooks the
Lab tests ran and saved (tune among them; this file runs after test_notebooks_in_lab.py), each opened at 1,300 px:

- the headline block is the first thing on the page;
- no raw DataFrame repr (``shape: (``), no dtype row (``i64 f64 str`` under a header), no Python list repr;
- no progress bar redrawn line after line (a bar keeps its final line);
- nothing wider than the window, and nothing scrolling sideways inside it.

Screenshots of each report (its first screen and the whole page) go to outputs/browser/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import SCREENSHOTS
from project import CHECKOUT

from draftgen.display.headline import MARKER
from draftgen.runner import write_html

DEMO_STEPS = ("benchmark", "estimate", "generate", "validate")
LAB_NOTEBOOKS = ("benchmark", "estimate", "generate", "validate", "tune")
WIDTH = 1300
DTYPES = {
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "u16",
    "u32",
    "u64",
    "f32",
    "f64",
    "str",
    "bool",
    "list[str]",
    "null",
}
BAR = re.compile(r"^\s*([\w -]+):\s+\d+%\|")  # tqdm's "desc:  42%|███"


@pytest.fixture(scope="session")
def demo_reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo's run folders: the one DRAFTGEN_DEMO_REPORTS names, else a short demo run here (two simulated
    GPUs, 100 prompts, the clock 10× faster)."""
    given = os.environ.get("DRAFTGEN_DEMO_REPORTS")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("demo") / "demo"
    command = [
        str(Path(sys.executable).with_name("draftgen")),
        "demo",
        "--out",
        str(out),
        "--servers",
        "2",
        "--limit",
        "100",
        "--speed",
        "10",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=CHECKOUT)
    assert done.returncode == 0, f"draftgen demo failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


def check_report(page, html: Path, name: str) -> None:
    """Open ``html`` at 1,300 px and check it as the module says; screenshots under ``name``."""
    page.set_viewport_size({"width": WIDTH, "height": 900})
    page.goto(html.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=str(SCREENSHOTS / f"report-{name}.png"))
    page.screenshot(path=str(SCREENSHOTS / f"report-{name}-full.png"), full_page=True)

    first = page.evaluate(
        """marker => {
            const block = document.querySelector(`[${marker}]`);
            if (!block) return null;
            const visible = [...document.querySelectorAll('.jp-Cell')].filter(c => c.innerText.trim());
            return {inFirstCell: visible.length > 0 && visible[0].contains(block),
                    top: block.getBoundingClientRect().top};
        }""",
        MARKER,
    )
    assert first is not None, f"{name}: no headline block"
    assert first["inFirstCell"] and first["top"] < 200, (
        f"{name}: the headline is not the first thing: {first}"
    )

    text = page.inner_text("body")
    assert "shape: (" not in text, f"{name}: a raw DataFrame repr"
    assert not re.search(r"^\s*\[\s*'", text, re.M), f"{name}: a Python list repr"
    header_rows = page.evaluate(
        "() => [...document.querySelectorAll('tr')].map(r => [...r.children].map(c => c.innerText.trim()))"
    )
    dtype_rows = [
        row for row in header_rows if len(row) > 1 and set(row) & DTYPES and set(row) <= DTYPES | {""}
    ]
    assert not dtype_rows, f"{name}: dtype rows {dtype_rows[:2]}"
    bars = Counter(m.group(1) for line in text.splitlines() if (m := BAR.match(line)))
    assert all(n == 1 for n in bars.values()), f"{name}: progress redrawn line after line: {bars}"

    wide = page.evaluate(
        """width => [...document.querySelectorAll('body *')].flatMap(el => {
            const box = el.getBoundingClientRect();
            const style = getComputedStyle(el);
            const scrolls = ['auto', 'scroll'].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1;
            if (box.width === 0 || (box.right <= width + 1 && !scrolls)) return [];
            return [`${el.tagName}.${el.className} right=${Math.round(box.right)} scroll=${el.scrollWidth}/${el.clientWidth}`];
        })""",
        WIDTH,
    )
    assert not wide, f"{name}: wider than the window or scrolling sideways: {wide[:5]}"
    assert page.evaluate("() => document.documentElement.scrollWidth") <= WIDTH


@pytest.mark.parametrize("step", DEMO_STEPS)
def test_demo_report(page, screenshots, demo_reports, step):
    html = demo_reports / step / "report.html"
    assert html.is_file(), f"{html} missing"
    check_report(page, html, step)


@pytest.mark.parametrize("name", LAB_NOTEBOOKS)
def test_report_of_a_notebook_run_in_lab(page, screenshots, project, name):
    """The notebooks the Lab tests ran and saved, rendered as draftgen run renders them (tune's among them)."""
    executed = project / "notebooks" / f"{name}.ipynb"
    assert executed.is_file(), f"{executed} missing: test_notebooks_in_lab.py runs first and saves it"
    html = project / "outputs" / "reports" / f"{name}.html"
    html.parent.mkdir(parents=True, exist_ok=True)
    write_html(executed, html)
    check_report(page, html, f"lab-{name}")
