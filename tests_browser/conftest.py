"""Browser tier fixtures: one simulated fleet, one JupyterLab server over a throwaway project, one Chromium.

Session-wide, because the four notebooks are a pipeline (estimate reads the newest benchmark, validate reads
generate's run folder) and because starting Lab and Chromium is most of the tier's cost.
Screenshots go to ``outputs/browser/`` of this checkout, for a person to look at.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import CHROMIUM, CHROMIUM_FLAGS, LabServer
from project import CHECKOUT, make_project

from draftgen.sim import SimFleet
from draftgen.training.local_tokenizer import build_tiny_tokenizer

SCREENSHOTS = CHECKOUT / "outputs" / "browser"
SIM_SPEED = 20.0  # simulated clock: fast enough for a short tier, slow enough to watch generate's progress


@pytest.fixture(scope="session")
def screenshots() -> Path:
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    return SCREENSHOTS


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_project(tmp_path_factory.mktemp("lab") / "project")
    build_tiny_tokenizer(root / "models" / "tokenizer")
    return root


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(
        servers=2, profile="b200-mtp", speed=SIM_SPEED, work_dir=tmp_path_factory.mktemp("sim")
    ) as running:
        yield running


@pytest.fixture(scope="session")
def lab(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = LabServer(root=project, state=tmp_path_factory.mktemp("lab-state"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test-browser` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()
