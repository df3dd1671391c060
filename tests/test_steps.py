"""The step registry (draftgen.steps): the one place generic code learns what a notebook step takes, writes and
does on --resume; ``draftgen run`` and the demo read it instead of a notebook's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftgen.commands import run as run_command
from draftgen.runner import RunPlan, config_class, plan_run, step_of
from draftgen.steps import STEPS, Step, get_step

ROOT = Path(__file__).resolve().parents[1]
RECORDED: list[tuple[Path, Path, str]] = []


def record(folder: Path, executed: Path, detail: str) -> None:
    """A fake disk-full recorder, named by a fake step below."""
    RECORDED.append((folder, executed, detail))


def _notebook(
    tmp_path: Path, step: str | None, cell: str = "out_dir: str = ''\nresume: bool = False\n"
) -> Path:
    metadata = {"draftgen": {"step": step}} if step else {}
    path = tmp_path / "any-name.ipynb"
    cells = [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": cell, "outputs": []}]
    path.write_text(json.dumps({"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_every_notebook_names_its_step_and_every_step_has_its_notebook():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert [step_of(path).name for path in notebooks] == [path.stem for path in notebooks]  # type: ignore[union-attr]
    assert sorted(step.name for step in STEPS) == [path.stem for path in notebooks]
    assert config_class(ROOT / "notebooks" / "generate.ipynb") is get_step("generate").config_class()


def test_the_parameters_a_step_sets_are_parameters_of_its_config():
    for step in STEPS:
        fields = step.config_class().model_fields
        for name in (step.output_parameter, step.resume_parameter):
            assert name is None or name in fields, (step.name, name)
        if step.resume_parameter is not None:
            assert fields[step.resume_parameter].annotation is bool
            assert step.resume, f"{step.name}: say what --resume does"


def test_run_parameters_come_from_the_step_and_given_values_win(tmp_path):
    fake = Step("fake", "draftgen.bench.config:BenchmarkConfig", "m:run", (), output_parameter="folder")
    assert fake.run_parameters(tmp_path, resume=True) == {"folder": str(tmp_path)}
    resuming = Step("fake", "m:C", "m:run", (), resume="continues", resume_parameter="again")
    assert resuming.run_parameters(tmp_path, resume=True) == {"out_dir": str(tmp_path), "again": True}
    assert resuming.run_parameters(tmp_path, resume=False) == {"out_dir": str(tmp_path)}
    assert Step("fake", "m:C", "m:run", (), output_parameter=None).run_parameters(tmp_path, resume=True) == {}

    bench = plan_run(
        _notebook(tmp_path, "benchmark"), {"out_dir": "/elsewhere"}, name="r", out_root=tmp_path, resume=True
    )
    assert bench.step is get_step("benchmark")
    assert bench.parameters == {"out_dir": "/elsewhere", "resume": True}
    generate = plan_run(_notebook(tmp_path, "generate"), {}, name="g", out_root=tmp_path, resume=True)
    assert generate.parameters == {
        "out_dir": str(tmp_path / "any-name" / "g")
    }  # generate resumes in its folder


def test_a_notebook_of_no_step_gets_nothing_set_and_an_unknown_step_is_named(tmp_path):
    plain = plan_run(_notebook(tmp_path, None), {}, name="p", out_root=tmp_path, resume=True)
    assert plain.step is None and plain.parameters == {}
    with pytest.raises(ValueError, match="no step named 'genrate'; the steps are generate, benchmark"):
        step_of(_notebook(tmp_path, "genrate"))
    with pytest.raises(KeyError, match="the steps are"):
        get_step("nope")


def test_a_full_disk_is_recorded_by_the_steps_own_recorder_in_its_output_folder(tmp_path):
    fake = Step(
        "fake",
        "m:C",
        "m:run",
        (),
        on_disk_full=f"{__name__}:record",
        kept_on_disk_full="the parts are kept",
    )
    plan = RunPlan(tmp_path / "fake.ipynb", tmp_path / "run", {"out_dir": str(tmp_path / "out")}, "run", fake)
    RECORDED.clear()
    run_command._record_disk_full(plan, OSError(28, "No space left on device"))
    assert RECORDED == [
        (tmp_path / "out", tmp_path / "run" / "fake.ipynb", "OSError: [Errno 28] No space left on device")
    ]
    assert "— the parts are kept; free space and rerun" in run_command._disk_full_line(
        plan, OSError(28, "full")
    )
    RECORDED.clear()
    silent = RunPlan(tmp_path / "x.ipynb", tmp_path / "run", {}, "run", Step("x", "m:C", "m:run", ()))
    run_command._record_disk_full(silent, OSError(28, "full"))
    assert RECORDED == [] and get_step("generate").disk_full_recorder() is not None


def test_draftgen_run_help_names_every_step_and_what_resume_does():
    import argparse

    parser = argparse.ArgumentParser()
    run_command.add_command(parser.add_subparsers())
    text = " ".join(parser._subparsers._group_actions[0].choices["run"].format_help().split())  # type: ignore[union-attr]
    for step in STEPS:
        assert f"{step.name}: {step.writes}" in text
    assert "generate skips the prompts already stored, benchmark reuses the levels already measured" in text
