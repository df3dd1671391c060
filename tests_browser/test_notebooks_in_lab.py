"""The notebooks in JupyterLab, in a real (headless) browser: Run All against a simulated fleet.

Each test opens a copy of the committed notebook whose parameters cell points at the test fleet with small
settings (everything else as committed, including the relative default ``out_dir``), runs Run → Run All Cells
from the menu bar, and checks what a person would see: no error, every figure drawn as an image, the kernel
idle at the end, the run folder in the project's ``outputs/`` (not ``notebooks/outputs/``). The tests run in
file order, as the pipeline does: estimate reads the newest benchmark, validate reads generate's run folder.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
from lab import NotebookTab, saved_errors, saved_image_count
from project import copy_notebook

from draftgen.prompts.rows import PromptRow, iter_prompts
from draftgen.prompts.synthetic import BUNDLED_PROMPTS
from draftgen.sim.fleet import find_free_base_port

RUN_TIMEOUT_S = 240
GENERATE_CELL = "await run(config, show=display)"
PROGRESS = re.compile(r"(\d+)/(\d+) \[")  # tqdm's "n/total [elapsed<eta, ...]"


def run_all_cleanly(
    tab: NotebookTab,
    shots: Path,
    *,
    min_figures: int,
    while_running: Callable[[NotebookTab], None] | None = None,
) -> dict:
    """Run All, wait, and check the notebook as shown and as saved; returns the saved notebook."""
    stem = Path(tab.path).stem
    tab.run_all()
    tab.wait_started()
    if while_running is not None:
        while_running(tab)
    prompts = tab.wait_finished(RUN_TIMEOUT_S)
    tab.wait_kernel_idle(timeout=30)
    tab.screenshot(shots / f"{stem}.png")
    nb = tab.save()
    assert saved_errors(nb) == [], f"{stem}: error output {saved_errors(nb)}"
    assert "Traceback" not in tab.page.locator(".jp-NotebookPanel").inner_text()
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), f"{stem}: not every cell ran: {prompts}"
    images = tab.images()
    assert len(images) == saved_image_count(nb) >= min_figures, (
        f"{stem}: {len(images)} images shown, {saved_image_count(nb)} saved, {min_figures} expected at least"
    )
    assert all(i["complete"] and i["w"] > 100 and i["h"] > 100 for i in images), f"{stem}: {images}"
    tab.screenshot_images(shots, stem)
    assert tab.execution_indicator() == "idle"
    return nb


def assert_run_folder(project: Path, relative: str, *files: str) -> Path:
    folder = project / relative
    for name in files:
        assert (folder / name).exists(), f"{folder / name} missing"
    assert not (project / "notebooks" / "outputs").exists(), "a run folder landed under notebooks/"
    return folder


def stored_ids(run_dir: Path) -> list[str]:
    ids: list[str] = []
    for shard in sorted((run_dir / "shards").glob("part-*.parquet")):
        ids.extend(pl.read_parquet(shard, columns=["id"])["id"].to_list())
    return ids


def bundled_ids(limit: int) -> list[str]:
    rows = (r for r in iter_prompts(BUNDLED_PROMPTS) if isinstance(r, PromptRow))
    return [r.id for _, r in zip(range(limit), rows, strict=False)]


def fleet_params(fleet) -> dict:
    return {"servers": fleet.urls, "max_tokens": 4096}


# ----- the four notebooks ----------------------------------------------------------------------------------
def test_benchmark(page, lab, project, fleet, screenshots):
    copy_notebook(
        "benchmark",
        project,
        {**fleet_params(fleet), "concurrencies": [1, 4, 8], "num_prompts": 8, "warmup_requests": 1},
    )
    tab = NotebookTab(page, lab, "notebooks/benchmark.ipynb").open()
    run_all_cleanly(tab, screenshots, min_figures=5)
    assert_run_folder(project, "outputs/benchmark/interactive", "results.parquet", "benchmark.json")


def test_estimate(page, lab, project, screenshots):
    # benchmark_dir "" (as committed): the newest benchmark under the PROJECT's outputs/, found from notebooks/
    copy_notebook("estimate", project, {"concurrency_per_server": 8, "bootstrap": 40})
    tab = NotebookTab(page, lab, "notebooks/estimate.ipynb").open()
    run_all_cleanly(tab, screenshots, min_figures=5)
    assert_run_folder(project, "outputs/estimate/interactive", "estimate.json")


def watch_progress(readings: list[tuple[int, int]], shots: Path) -> Callable[[NotebookTab], None]:
    """Record the progress bar of the generate cell while it runs; screenshot it mid-run once."""

    def watch(tab: NotebookTab) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            prompt = tab.page.locator(".jp-CodeCell", has_text=GENERATE_CELL).locator(".jp-InputPrompt")
            text = tab.cell_output_text(GENERATE_CELL)
            found = PROGRESS.findall(text)
            if found:
                done, total = map(int, found[-1])
                if 0 < done < total and not any(0 < d < t for d, t in readings):
                    assert tab.show_cell_output(GENERATE_CELL), "the progress bar is not on screen"
                    tab.screenshot(shots / "generate-progress.png")
                readings.append((done, total))
            if re.fullmatch(r"\[\d+\]:", prompt.inner_text()):
                return
            time.sleep(0.2)

    return watch


def test_generate_shows_progress(page, lab, project, fleet, screenshots):
    limit = 200
    copy_notebook(
        "generate",
        project,
        {
            **fleet_params(fleet),
            "limit": limit,
            "concurrency_per_server": 16,
            "batch_save_size": 50,
            "progress_interval_s": 0.5,
            "estimate": "outputs/estimate/interactive/estimate.json",  # relative, as a user types it
        },
    )
    tab = NotebookTab(page, lab, "notebooks/generate.ipynb").open()
    readings: list[tuple[int, int]] = []
    run_all_cleanly(tab, screenshots, min_figures=3, while_running=watch_progress(readings, screenshots))
    mid_run = sorted({d for d, t in readings if 0 < d < t})
    assert len(mid_run) >= 2, f"progress not visible while generate ran: {readings}"
    assert all(t == limit for _, t in readings)
    run_dir = assert_run_folder(project, "outputs/generate/interactive", "manifest.json")
    ids = stored_ids(run_dir)
    assert len(ids) == len(set(ids)) == limit and set(ids) == set(bundled_ids(limit))


def test_validate(page, lab, project, screenshots):
    copy_notebook(
        "validate",
        project,
        # a tenth held out (default 1%): enough held-out prompts for tune's verdict below
        {
            "generation_dir": "outputs/generate/interactive",
            "tokenizer": "models/tokenizer",
            "holdout_share": 0.1,
        },
    )
    tab = NotebookTab(page, lab, "notebooks/validate.ipynb").open()
    run_all_cleanly(tab, screenshots, min_figures=2)
    folder = assert_run_folder(project, "outputs/validate/interactive", "export/train.jsonl")
    assert (folder / "export" / "train.jsonl").read_text().count("\n") > 0


def test_tune_verdict_on_the_held_out_prompts(page, lab, project, screenshots):
    """The verdict alone (race off): MTP and a DFlash drafter profile at 1 and 16 in flight on the prompts
    validate held out, on two simulated GPUs tune starts itself."""
    holdout = "outputs/validate/interactive/export/holdout/prompts.jsonl"
    assert (project / holdout).read_text().count("\n") >= 5, "validate held out too few prompts"
    copy_notebook(
        "tune",
        project,
        {
            "engine": "sim",
            "gpus": "0-1",
            "base_port": find_free_base_port(2),
            "sim_speed": 2.0,
            "prompts": str(project / holdout),  # the kernel runs in notebooks/
            "max_tokens": 96,
            "sample_size": 32,
            "warmup_requests": 1,
            "race": False,
            "verdict_levels": [1, 16],
            "dataset_size": 10_000,
            "drafters": [
                {
                    "speculative_algorithm": "DFLASH",
                    "speculative_draft_model_path": "sim:dflash",
                    "block_sizes": [8],
                }
            ],
        },
    )
    tab = NotebookTab(page, lab, "notebooks/tune.ipynb").open()
    run_all_cleanly(tab, screenshots, min_figures=2)
    folder = assert_run_folder(project, "outputs/tune/interactive", "verdict.parquet", "verdict.json")
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["production_concurrency"] == 16 and verdict["prompts"].endswith("holdout/prompts.jsonl")
    assert {row["candidate"].split(",")[0] for row in verdict["money"]} == {"MTP 3/1/4", "DFLASH block 8"}
    assert (folder / "verdict_tok_s_per_gpu.png").is_file()
    # race off: the verdict's winner is the settings file; a tie (intervals overlapping) names none and writes none
    assert (verdict["winner"] is None) == (len(verdict["tie"]) >= 2), verdict["headline"]
    assert (folder / "settings.yaml").is_file() == (verdict["winner"] is not None), verdict["headline"]


# ----- interrupt from the toolbar, then Run All again ------------------------------------------------------
def test_generate_interrupted_from_the_toolbar_resumes_on_run_all(page, lab, project, fleet, screenshots):
    limit, shard_rows = 600, 25
    path = copy_notebook(
        "generate",
        project,
        {
            **fleet_params(fleet),
            "limit": limit,
            "concurrency_per_server": 8,
            "batch_save_size": shard_rows,
            "out_dir": "outputs/generate/interrupted",
        },
        as_name="generate-interrupt",
    )
    run_dir = project / "outputs" / "generate" / "interrupted"
    tab = NotebookTab(page, lab, f"notebooks/{path.name}").open()
    tab.run_all()
    tab.wait_started()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while len(list((run_dir / "shards").glob("part-*.parquet"))) < 2:
        assert time.monotonic() < deadline, "no two shards written"
        time.sleep(0.1)
    tab.interrupt()
    tab.wait_finished(60)
    tab.wait_kernel_idle(timeout=30)
    tab.show_cell_output(GENERATE_CELL)
    tab.screenshot(screenshots / "generate-interrupted.png")
    nb = tab.save()
    assert [e.split(":")[0] for e in saved_errors(nb)] == ["KeyboardInterrupt"], saved_errors(nb)
    kept = stored_ids(run_dir)
    assert len(kept) >= 2 * shard_rows and len(kept) < limit, "the interrupt came too late to test anything"
    assert len(kept) == len(set(kept))
    assert "Run again with the same out_dir" in tab.cell_output_text(GENERATE_CELL)

    run_all_cleanly(tab, screenshots, min_figures=3)  # screenshots under the notebook's own name
    ids = stored_ids(run_dir)
    assert len(ids) == len(set(ids)) == limit, f"{len(ids)} stored, {len(set(ids))} distinct, {limit} wanted"
    assert set(ids) == set(bundled_ids(limit)) and set(kept) <= set(ids)
