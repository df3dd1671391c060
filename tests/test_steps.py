"""The step registry (draftgen.steps): the one place generic code learns what a step takes, runs, writes and does
on --resume; ``draftgen run``, ``draftgen tune`` and the demo read it instead of a notebook's name. And the one
door: a step's run(config) opens and finishes its folder (draftgen.rundir.run_folder) whichever face runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draftgen.commands import run as run_command
from draftgen.params import Params, param
from draftgen.rundir import RunFolderError, finish_run, is_finished, open_run
from draftgen.rundir.layout import Entry
from draftgen.runner import RunPlan, config_class, plan_run, run_here, step_of
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


# ----- one door per step: run(config), its folder opened and finished one way, whichever face runs it ----------
class FakeConfig(Params):
    """The parameters of the fake steps below."""

    out_dir: str = param("", "where the fake step writes")


CALLS: list[FakeConfig] = []


def fake_run(config: FakeConfig) -> str:
    """A step as every real one is written: open its folder, write, finish it."""
    out = open_run(config.out_dir, config.public_dict())
    (out / "data.txt").write_text("x")
    finish_run(out)
    CALLS.append(config)
    return "ran"


async def fake_async_run(config: FakeConfig) -> str:
    return fake_run(config)


def _fake_step(run: str) -> Step:
    entries = (Entry("data.txt", "the fake's data"),)
    return Step("fake", f"{__name__}:FakeConfig", f"{__name__}:{run}", entries)


def test_every_step_names_its_run_and_it_takes_its_config():
    import inspect
    import typing

    for step in STEPS:
        function = step.run_function()
        first = next(iter(inspect.signature(function).parameters))
        hints = typing.get_type_hints(function)
        assert hints[first] is step.config_class(), step.name
        assert step.writes == (
            ", ".join(f"{e.path} ({e.when})" if e.when else e.path for e in step.files)
            or "nothing of its own"
        )


def test_open_run_refuses_a_finished_folder_clears_leftovers_and_records_the_parameters(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    leftover = folder / ".results.parquet.tmp"
    leftover.write_text("half")
    assert open_run(folder, {"b": 2, "a": [1]}) == folder
    assert not leftover.exists() and (folder / ".lock").exists()
    assert yaml.safe_load((folder / "parameters.yaml").read_text()) == {"a": [1], "b": 2}
    assert not is_finished(folder)
    finish_run(folder)
    assert is_finished(folder)
    with pytest.raises(RunFolderError, match=f"run {folder} already finished; set another out_dir"):
        open_run(folder, {"a": 3})
    assert yaml.safe_load((folder / "parameters.yaml").read_text()) == {"a": [1], "b": 2}  # nothing rewritten


@pytest.mark.parametrize("run", ["fake_run", "fake_async_run"])
def test_a_command_runs_the_step_into_the_runners_folder(tmp_path, run):
    step = _fake_step(run)
    CALLS.clear()
    plan = plan_run(None, {}, step=step, name="r", out_root=tmp_path)
    assert plan.run_dir == tmp_path / "fake" / "r" and plan.step_owns_folder
    assert run_here(plan) == "ran"
    assert CALLS[0].out_dir == str(plan.run_dir)  # the step's output parameter is the run folder
    assert sorted(p.name for p in plan.run_dir.iterdir()) == [
        ".complete",
        ".lock",
        "data.txt",
        "parameters.yaml",
    ]
    with pytest.raises(ValueError, match="already finished"):
        plan_run(None, {}, step=step, name="r", out_root=tmp_path, resume=True)


def test_a_run_folder_the_step_does_not_write_is_opened_and_finished_by_the_runner(tmp_path):
    step = _fake_step("fake_run")
    elsewhere = tmp_path / "elsewhere"
    plan = plan_run(None, {"out_dir": str(elsewhere)}, step=step, name="r", out_root=tmp_path)
    assert not plan.step_owns_folder
    run_here(plan)
    assert sorted(p.name for p in plan.run_dir.iterdir()) == [".complete", ".lock", "parameters.yaml"]
    assert yaml.safe_load((plan.run_dir / "parameters.yaml").read_text()) == {"out_dir": str(elsewhere)}
    assert sorted(p.name for p in elsewhere.iterdir()) == [
        ".complete",
        ".lock",
        "data.txt",
        "parameters.yaml",
    ]
    monitor = plan_run(None, {"run_dir": "x"}, step=get_step("monitor"), name="m", out_root=tmp_path)
    assert not monitor.step_owns_folder  # read-only: its folder is the runner's


def test_an_unfinished_folder_needs_resume_and_a_step_resumes_in_it(tmp_path):
    step = _fake_step("fake_run")
    (tmp_path / "fake" / "r").mkdir(parents=True)
    (tmp_path / "fake" / "r" / "data.txt").write_text("half")
    with pytest.raises(ValueError, match="exists but did not finish; pass --resume"):
        plan_run(None, {}, step=step, name="r", out_root=tmp_path)
    run_here(plan_run(None, {}, step=step, name="r", out_root=tmp_path, resume=True))
    assert is_finished(tmp_path / "fake" / "r")


def test_no_code_branches_on_a_steps_name():
    """What a step needs is a row of the registry (or its layout), so nothing compares a name with a step's."""
    import re

    names = "|".join(step.name for step in STEPS)
    compared = re.compile(rf"""==\s*["']({names})["']|["']({names})["']\s*==""")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "src" / "draftgen").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []
