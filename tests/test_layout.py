"""Every file a step writes is declared once (draftgen.rundir.layout) and the docs' tables say the same, checked on
what a short ``draftgen demo`` writes (two simulated GPUs, 20 prompts, a quarter benchmark round: the four notebooks as
``make demo`` runs them), with every kernel audited so that no cell but the step's ``run(config)`` writes a file
(tests/write_audit.py). The same notebook run by plain papermill, as JupyterLab runs it top to bottom, leaves the
same folder; monitor writes nothing, in the run it watches or anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import papermill
import pytest
import yaml
from layout_helpers import files_in, layout_shape, missing
from write_audit import cell_writes, events, kernel_env

from draftgen import param_tables
from draftgen.commands.demo import STEPS as DEMO_STEPS
from draftgen.estimate import step as estimate_step
from draftgen.estimate.config import EstimateConfig
from draftgen.params import build_config
from draftgen.rundir import RunFolderError, layout
from draftgen.steps import get_step

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Demo:
    tmp: Path
    out: Path
    log: Path  # the kernels' writes (write_audit)
    stdout: str


@pytest.mark.runbook  # a whole documented command end to end: make test-runbook, beside the README's block
def test_a_demo_writes_the_declared_layout_and_no_cell_but_the_steps_run_writes(tmp_path):
    """One test, so one demo: a module fixture would run it again on every worker that takes one of the module's
    tests."""
    demo = run_demo(tmp_path)
    benchmark = yaml.safe_load((demo.out / "benchmark" / "parameters.yaml").read_text())
    assert benchmark["rounds"] == 0.25  # --rounds
    every_file_is_declared_and_every_file_always_written_is_there(demo)
    the_docs_tables_list_what_the_demo_wrote(demo)
    no_cell_but_the_steps_run_writes_a_file(demo)
    a_notebook_run_top_to_bottom_without_draftgen_run_leaves_the_same_folder(demo)
    monitor_writes_nothing_in_the_run_it_watches_or_anywhere(demo)


def test_a_demo_with_no_benchmark_rounds_is_refused_before_anything_starts(tmp_path):
    command = [sys.executable, "-m", "draftgen", "demo", "--out", str(tmp_path / "demo"), "--rounds", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--rounds must be > 0, got 0" in done.stderr
    assert not (tmp_path / "demo").exists()


def run_demo(tmp: Path) -> Demo:
    """``draftgen demo`` into ``tmp/demo``, every kernel's writes logged (write_audit)."""
    out = tmp / "demo"
    env, log = kernel_env(tmp / "audit", out, dict(os.environ))
    command = [
        *(sys.executable, "-m", "draftgen", "demo", "--out", str(out)),
        # every step, each as short as it goes: the benchmark's levels send 8, 8, 12 and 16 requests (its fewest
        # is 8), which write the same files as a full round (136 requests) at a third of its work
        *("--servers", "2", "--limit", "20", "--rounds", "0.25"),
    ]
    command += ["--speed", "10"]  # the files, not the figures, are under test: a faster clock waits less
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"draftgen demo failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return Demo(tmp, out, log, done.stdout)


def every_file_is_declared_and_every_file_always_written_is_there(demo: Demo) -> None:
    """The demo's folder holds its own folders and its steps', each step's only declared files, all it always writes."""
    assert sorted(p.name for p in demo.out.iterdir()) == sorted(
        [*(entry.path.removesuffix("/*") for entry in layout.DEMO_FILES), *DEMO_STEPS]
    )
    for name in DEMO_STEPS:
        step = get_step(name)
        folder = demo.out / name
        assert missing(folder, step, notebook=True) == [], name  # layout_shape inside: no undeclared file
    # what the demo's settings make the conditional entries write: /metrics on the simulator, a gate that passed
    assert "acceptance.parquet" in layout_shape(demo.out / "generate", get_step("generate"))
    validated = layout_shape(demo.out / "validate", get_step("validate"))
    assert {
        f"export/{name}" for name in ("train.jsonl", "prompts.jsonl", "counts.json", "README.md")
    } <= validated
    assert "export.partial/*" not in validated


def the_docs_tables_list_what_the_demo_wrote(demo: Demo) -> None:
    """design.md's and the README's tables are the layout's rendering, and name every file the demo wrote."""
    design, readme = ROOT / "docs" / "design.md", ROOT / "README.md"
    assert param_tables.page_problems(design) == [] and param_tables.page_problems(readme) == []
    rows = {
        line.split("|")[1].strip(): line for line in design.read_text().splitlines() if line.startswith("| ")
    }
    tree = readme.read_text()
    for name in DEMO_STEPS:
        for path in layout_shape(demo.out / name, get_step(name)) - {e.path for e in layout.NOTEBOOK_FILES}:
            owner = name if any(e.path == path for e in get_step(name).files) else "every run"
            assert f"`{path}`" in rows[owner], (name, path)  # design.md's "What each step writes"
            if owner == name:
                assert path in tree, (name, path)  # the README's tree of the demo's folder


def no_cell_but_the_steps_run_writes_a_file(demo: Demo) -> None:
    """In each notebook, the one cell calling the step's run(config) wrote, and no other cell did."""
    for name in DEMO_STEPS:
        written = cell_writes(demo.log, demo.out / name / f"{name}.ipynb")
        writers = [source for source in written if "run(config" in source]
        assert len(writers) == 1, (name, list(written))  # the audit sees the step's own writes: it is looking
        assert [source for source in written if source not in writers] == [], (name, written)


def a_notebook_run_top_to_bottom_without_draftgen_run_leaves_the_same_folder(demo: Demo) -> None:
    """JupyterLab's way (plain papermill, the executed notebook kept elsewhere): the step's run(config) writes the
    same folder draftgen run's did, parameters.yaml and .complete included; run again (the step's run(config), which
    the notebook's cell calls), the finished folder is refused."""
    step = get_step("estimate")
    folder = demo.tmp / "interactive" / "estimate"
    parameters = {"benchmark_dir": str(demo.out / "benchmark"), "limit": 20, "out_dir": str(folder)}
    executed = demo.tmp / "estimate-executed.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "estimate.ipynb"), str(executed), parameters=parameters, progress_bar=False
    )
    notebook_files = {entry.path for entry in layout.NOTEBOOK_FILES}
    assert layout_shape(folder, step) == layout_shape(demo.out / "estimate", step) - notebook_files
    assert missing(folder, step, notebook=False) == []
    with pytest.raises(RunFolderError, match="already finished"):
        estimate_step.run(build_config(EstimateConfig, parameters))


def monitor_writes_nothing_in_the_run_it_watches_or_anywhere(demo: Demo) -> None:
    watched = demo.out / "generate"
    before = {path: (path.stat().st_size, path.stat().st_mtime_ns) for path in watched.rglob("*")}
    env, log = kernel_env(demo.tmp / "monitor-audit", demo.tmp, dict(os.environ))
    runs = demo.tmp / "runs"
    command = [
        sys.executable,
        "-m",
        "draftgen",
        "run",
        "monitor",
        "-p",
        "run_dir",
        str(watched),
        "--name",
        "m",
    ]
    done = subprocess.run(
        [*command, "--out-root", str(runs), "--no-html"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert events(log) == []  # the kernel wrote nothing at all under the test's folder
    assert {path: (path.stat().st_size, path.stat().st_mtime_ns) for path in watched.rglob("*")} == before
    monitor = get_step("monitor")
    assert layout_shape(runs / "monitor" / "m", monitor) == {
        "parameters.yaml",
        ".complete",
        ".lock",
        "<step>.ipynb",
    }
    shown = json.loads((runs / "monitor" / "m" / "monitor.ipynb").read_text())
    assert any(
        output.get("data", {}).get("image/png")
        for cell in shown["cells"]
        for output in cell.get("outputs", [])
    )
    assert files_in(runs / "monitor" / "m") == [".complete", ".lock", "monitor.ipynb", "parameters.yaml"]
