"""``draftgen tune`` and tune.ipynb run one function (draftgen.tune.step.run), not two copies.

The end-to-end runs of both are in test_tune.py (the two faces side by side: the same folder but for the notebook
and its report) and test_tune_verdict.py (the command, its race saved before its verdict); here: that both reach
the function, and what the command does with what it returns, on fakes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftgen.commands import tune as tune_command
from draftgen.tune import step as tune_step
from draftgen.tune.step import TuneReport

ROOT = Path(__file__).resolve().parents[1]


def test_the_notebook_calls_the_function_and_repeats_none_of_it():
    notebook = json.loads((ROOT / "notebooks" / "tune.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    assert "await run(config)" in code and "from draftgen.tune.step import headline, run" in code
    for repeated in ("run_tune(", "save_report(", "save(", "candidate_table(", "verdict_of("):
        assert repeated not in code, (
            f"tune.ipynb does {repeated} itself: it belongs in draftgen.tune.step.run"
        )


def _fake_report(*, race: bool, chosen: bool, tie: bool = False) -> TuneReport:
    run = SimpleNamespace(chosen=object() if chosen else None)
    best = object() if chosen or tie else None
    verdict = (
        None
        if race
        else SimpleNamespace(winner=object() if chosen else None, ranking=SimpleNamespace(best=best))
    )
    table = None
    if race:
        import polars as pl

        table = pl.DataFrame(schema={"candidate": pl.String})
    return TuneReport(run, {}, table, verdict, {})  # type: ignore[arg-type]


@pytest.mark.parametrize(("race", "chosen"), [(True, True), (True, False), (False, True), (False, False)])
def test_a_settings_file_is_written_when_the_race_or_the_verdict_alone_chose(race, chosen):
    tuned = _fake_report(race=race, chosen=chosen)
    assert tuned.chosen is chosen and tuned.answered is chosen


def test_a_verdict_alone_that_ties_answers_without_a_settings_file():
    tuned = _fake_report(race=False, chosen=False, tie=True)
    assert tuned.answered and not tuned.chosen


def test_the_command_runs_the_function_with_its_parameters_and_says_no_candidate_when_none(
    tmp_path, monkeypatch, capsys
):
    seen = []

    async def fake(config):  # type: ignore[no-untyped-def]
        seen.append(config)
        return _fake_report(race=True, chosen=False)

    monkeypatch.setattr(tune_step, "run", fake)
    monkeypatch.setattr(tune_command.report, "format_table", lambda table: "TABLE")
    monkeypatch.setattr(tune_command.report, "startup_view", lambda run: "STARTUP")
    args = argparse.Namespace(
        parameters_file=[],
        parameter=[["engine", "sim"], ["model", "m"], ["max_tokens", "64"], ["servers", "[http://x:1]"]],
        name="t",
        out_root=tmp_path,
        resume=False,
    )
    assert tune_command.run(args) == 1
    [config] = seen
    assert (config.engine, config.model, config.max_tokens, config.out_dir) == (
        "sim",
        "m",
        64,
        str(tmp_path / "tune" / "t"),  # the runner's run folder, as draftgen run tune names it
    )
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "draftgen tune: tune does not use shared parameter(s) servers: ignored",
        f"draftgen tune: → {tmp_path / 'tune' / 't'}",
        "STARTUP",
        "TABLE",
        "draftgen tune: no candidate could be measured; see the failures above",
    ]
