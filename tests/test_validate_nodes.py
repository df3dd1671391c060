"""Several client nodes: validate (and generate's report) read the ``shard: "i/n"`` folders of one prompt file.

Real generate runs on the simulator (shards 0/2 and 1/2 of one prompt file, shard 0/2 once more, runs with
other settings) and validation of them: coverage, a missing shard, an overlapping pair, folders that disagree.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.generate import report as generate_report
from draftgen.generate.store import read_manifest
from draftgen.params import ParameterError, build_config
from draftgen.prompts.rows import iter_prompts, shard_of
from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim import SimFleet
from draftgen.training.local_tokenizer import build_tiny_tokenizer
from draftgen.training.masks import load_tokenizer
from draftgen.validate import report
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import (
    ValidationGateError,
    finalize_export,
    gate_message,
    require_fit_to_train,
    validate_generation,
)
from draftgen.validate.reader import GenerationDataError

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = 240
# The module fixture `runs` generates five runs (about 4 CPU-seconds): its tests start first, together on one worker
# (tests/long_first.py), instead of each worker that takes one of them generating the five again.
pytestmark = pytest.mark.slow


def _generate(fleet: SimFleet, prompts: Path, out_dir: Path, **changes: object) -> Path:
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out_dir),
        "max_tokens": 2048,
        "concurrency_per_server": 8,
        "batch_save_size": 40,
        "canary": False,
        **changes,
    }
    config = build_config(GenerateConfig, values)

    async def run() -> None:
        plan = await preflight(config)
        result = await generate(config, plan, progress=False)
        assert result.status == "complete", result

    asyncio.run(run())
    return out_dir


@dataclass(frozen=True)
class Runs:
    prompts: Path
    ids: list[str]  # every valid prompt id, in file order
    shard0: Path
    shard1: Path
    shard0_again: Path  # shard 0/2 generated a second time, in a folder of its own
    shard1_hot: Path  # shard 1/2 at another temperature
    shard1_copy: Path  # shard 1/2 generated from a copy of the prompt file at another path
    tokenizer_dir: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    base = tmp_path_factory.mktemp("nodes")
    prompts = base / "prompts.jsonl"
    write_synthetic(prompts, PROMPTS, seed=21)
    copy = base / "elsewhere" / "prompts.jsonl"
    copy.parent.mkdir()
    shutil.copy(prompts, copy)
    fleet = SimFleet(servers=2, profile="instant", work_dir=base / "sim")
    fleet.start()
    try:
        folders = {
            "shard0": _generate(fleet, prompts, base / "node-a", shard="0/2"),
            "shard1": _generate(fleet, prompts, base / "node-b", shard="1/2"),
            "shard0_again": _generate(fleet, prompts, base / "node-c", shard="0/2"),
            "shard1_hot": _generate(fleet, prompts, base / "node-d", shard="1/2", temperature=0.9),
            "shard1_copy": _generate(fleet, copy, base / "node-e", shard="1/2"),
        }
    finally:
        fleet.cleanup()
    ids = [row.id for row in iter_prompts(prompts)]
    return Runs(prompts, ids, tokenizer_dir=build_tiny_tokenizer(base / "tokenizer"), **folders)


@pytest.fixture(scope="module")
def tokenizer(runs: Runs):
    return load_tokenizer(runs.tokenizer_dir)


def _config(runs: Runs, folders: list[Path] | Path, out: Path, **overrides: object) -> ValidateConfig:
    given = str(folders) if isinstance(folders, Path) else [str(f) for f in folders]
    values = {
        "generation_dir": given,
        "tokenizer": str(runs.tokenizer_dir),
        "out_dir": str(out),
        "holdout_share": 0.0,
        **overrides,
    }
    return build_config(ValidateConfig, values)


def _exported_ids(out: Path, folder: str = "export") -> list[str]:
    lines = (out / folder / "train.jsonl").read_text().splitlines()
    return [json.loads(line)["id"] for line in lines]


def test_two_shards_validate_as_one_corpus_and_export_once(runs, tokenizer, tmp_path):
    a, b = read_manifest(runs.shard0), read_manifest(runs.shard1)
    assert a["counts"]["done"] + b["counts"]["done"] == PROMPTS and a["counts"]["done"] > 0
    result = validate_generation(
        _config(runs, [runs.shard0, runs.shard1], tmp_path), tokenizer=tokenizer, progress=False
    )
    coverage = result.coverage
    assert coverage.checked and coverage.complete, coverage.line()
    assert (coverage.expected, coverage.stored, coverage.duplicated_ids) == (PROMPTS, PROMPTS, 0)
    assert coverage.missing_shards == () and coverage.unexpected == 0
    assert Path(coverage.prompt_file) == runs.prompts.resolve()
    assert result.records["prompt_id"].n_unique() == PROMPTS  # a training row per generated turn
    by_folder = dict(result.records.group_by("folder").agg(pl.col("prompt_id").n_unique()).iter_rows())
    assert by_folder == {str(runs.shard0): a["counts"]["done"], str(runs.shard1): b["counts"]["done"]}
    assert require_fit_to_train(result).startswith("PASS") and "none missing" in gate_message(result)
    exported = _exported_ids(tmp_path, "export.partial")
    assert {i.partition("#")[0] for i in exported} == set(runs.ids) and len(exported) == result.counts["out"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["generation_dir"] == [str(runs.shard0), str(runs.shard1)]
    assert saved["coverage"]["expected"] == PROMPTS and saved["coverage"]["missing"] == 0
    table = dict(report.coverage_table(result).iter_rows())
    assert table["missing"] == "0" and table["shards no folder holds"] == "none"
    assert report.folder_table(result)["shard"].to_list() == ["0/2", "1/2"]


def test_a_missing_shard_is_named_with_its_count_and_ids(runs, tokenizer, tmp_path):
    result = validate_generation(_config(runs, runs.shard0, tmp_path), tokenizer=tokenizer, progress=False)
    coverage = result.coverage
    in_shard1 = [i for i in runs.ids if shard_of(i, 2) == 1]
    assert coverage.checked and not coverage.complete
    assert coverage.missing_shards == ("1/2",)
    assert coverage.missing == len(in_shard1) and coverage.missing_by_shard == {"1/2": len(in_shard1)}
    assert list(coverage.missing_examples) == in_shard1[: len(coverage.missing_examples)]
    assert len(coverage.missing_examples) == 10 and coverage.missing_failed == 0
    message = gate_message(result)
    assert f"{PROMPTS - len(in_shard1)} of {PROMPTS} prompt ids present, {len(in_shard1)} missing" in message
    assert "no folder holds shard 1/2" in message and in_shard1[0] in message


def test_an_overlapping_pair_is_reported_by_id_and_folder_and_fails_the_gate(runs, tokenizer, tmp_path):
    folders = [runs.shard0, runs.shard0_again, runs.shard1]
    result = validate_generation(_config(runs, folders, tmp_path), tokenizer=tokenizer, progress=False)
    in_shard0 = {i for i in runs.ids if shard_of(i, 2) == 0}
    duplicates = result.coverage.duplicates
    assert set(duplicates["id"].to_list()) == in_shard0
    assert duplicates["folders"].to_list() == [[str(runs.shard0), str(runs.shard0_again)]] * len(in_shard0)
    assert (duplicates["copies"] == 2).all() and result.coverage.complete
    flagged = result.records.filter(pl.col("duplicate_id"))
    assert flagged["folder"].unique().to_list() == [str(runs.shard0_again)]
    assert set(flagged["prompt_id"].to_list()) == in_shard0  # every turn row of a repeated conversation
    assert result.counts["dropped_by_flag"]["duplicate_id"] == flagged.height
    assert result.counts["degenerate"] >= len(in_shard0), "an id stored twice is a defect, not a length limit"
    with pytest.raises(ValidationGateError, match=f"{len(in_shard0)} ids stored more than once"):
        require_fit_to_train(result)
    exported = _exported_ids(tmp_path, "export.partial")
    assert len(exported) == len(set(exported)), "the export holds each id once"
    shown = report.duplicate_table(result)
    assert shown["folders (first kept)"][0] == f"{runs.shard0}, {runs.shard0_again}"


def test_folders_with_other_settings_or_prompt_files_are_refused(runs, tokenizer, tmp_path):
    with pytest.raises(GenerationDataError) as error:
        validate_generation(
            _config(runs, [runs.shard0, runs.shard1_hot], tmp_path / "a"), tokenizer=tokenizer
        )
    text = str(error.value)
    assert "temperature" in text and f"{runs.shard0}: 0.6" in text and f"{runs.shard1_hot}: 0.9" in text
    assert not (tmp_path / "a").exists(), "nothing is written for folders that do not belong together"
    with pytest.raises(GenerationDataError, match="disagree on the prompt file") as error:
        validate_generation(
            _config(runs, [runs.shard0, runs.shard1_copy], tmp_path / "b"), tokenizer=tokenizer
        )
    assert "prompt_file=PATH" in str(error.value) and "elsewhere" in str(error.value)
    # told which file they cover, the two folders validate as one corpus
    config = _config(runs, [runs.shard0, runs.shard1_copy], tmp_path / "c", prompt_file=str(runs.prompts))
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    assert result.coverage.complete and result.coverage.expected == PROMPTS


def test_a_prompt_file_that_is_not_here_leaves_coverage_unchecked_but_names_missing_shards(
    runs, tokenizer, tmp_path
):
    config = _config(runs, runs.shard1, tmp_path, prompt_file=str(tmp_path / "gone.jsonl"))
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    assert not result.coverage.checked and result.coverage.missing_shards == ("0/2",)
    assert "gone.jsonl does not exist" in result.coverage.note and "prompt_file=PATH" in result.coverage.note
    assert "coverage not checked" in gate_message(result)


def test_generation_dir_lists_are_checked_like_one_folder(runs, tmp_path):
    with pytest.raises(ParameterError) as error:
        _config(runs, [], tmp_path)
    assert "at least one generation folder" in str(error.value)
    with pytest.raises(ParameterError, match="listed more than once"):
        build_config(
            ValidateConfig,
            {
                "generation_dir": [str(runs.shard0), str(runs.shard0) + "/"],
                "tokenizer": "tok",
                "out_dir": str(tmp_path),
            },
        )
    with pytest.raises(ParameterError, match="is inside generation_dir"):
        _config(runs, [runs.shard0, runs.shard1], runs.shard1 / "validate")


def test_draftgen_run_validates_a_list_of_folders(runs, tmp_path):
    command = [
        *(sys.executable, "-m", "draftgen", "run", "validate"),
        *("-p", "generation_dir", f"[{runs.shard0}, {runs.shard1}]"),
        *("-p", "tokenizer", str(runs.tokenizer_dir)),
        *("--name", "nodes", "--out-root", str(tmp_path / "runs")),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=os.environ.copy()
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / "runs" / "validate" / "nodes"
    exported = {i.partition("#")[0] for i in _exported_ids(run_dir)}  # training rows per turn: ID or ID#k
    holdout = run_dir / "export" / "holdout" / "prompts.jsonl"  # none when no id of these 240 falls in the 1%
    held = {json.loads(x)["id"] for x in holdout.read_text().splitlines()} if holdout.exists() else set()
    # the default 1% held out, never trained on
    assert exported | held == set(runs.ids) and not exported & held
    executed = (run_dir / "validate.ipynb").read_text()
    assert "240 of 240 prompt ids present, none missing" in executed


def test_generate_report_summarises_several_folders(runs, tmp_path):
    folders = [runs.shard0, runs.shard1]
    one = generate_report.summary(runs.shard0).row(0, named=True)
    both = generate_report.summary(folders).row(0, named=True)
    assert (both["rows"], both["unique_ids"], both["sessions"], both["folders"]) == (PROMPTS, PROMPTS, 2, 2)
    assert both["completion_tokens"] == sum(
        generate_report.summary(f).row(0, named=True)["completion_tokens"] for f in folders
    )
    assert "folders" not in generate_report.summary(runs.shard0).columns and one["rows"] < PROMPTS
    servers = generate_report.per_server(folders)
    assert set(servers["folder"].to_list()) == {str(f) for f in folders} and servers["rows"].sum() == PROMPTS
    overlapping = generate_report.summary([runs.shard0, runs.shard0_again]).row(0, named=True)
    assert overlapping["rows"] == 2 * overlapping["unique_ids"]
    with pytest.raises(ValueError, match="save_to"):
        generate_report.plot_throughput(folders)
    plot = generate_report.plot_throughput(folders, save_to=tmp_path)
    assert plot.path == tmp_path / "plots" / "throughput.png" and plot.path.stat().st_size > 0


def test_busy_seconds_counts_side_by_side_sessions_once():
    assert generate_report.busy_seconds([]) == 0
    assert generate_report.busy_seconds([(0, 10), (20, 25)]) == 15  # one folder's sessions, one after another
    assert generate_report.busy_seconds([(0, 10), (5, 12), (11, 13), (20, 21)]) == 14  # nodes side by side
    assert generate_report.busy_seconds([(0, 10), (2, 3)]) == 10


def test_a_manifest_from_before_turns_counts_as_turns_last(runs, tokenizer, tmp_path):
    old, new = tmp_path / "old-0", tmp_path / "new-1"
    shutil.copytree(runs.shard0, old)
    shutil.copytree(runs.shard1, new)

    def edit(folder: Path, change) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest["fingerprint_fields"])
        (folder / "manifest.json").write_text(json.dumps(manifest))

    edit(old, lambda fields: fields.pop("turns"))  # written before turns joined the fingerprint: turns last
    assert read_manifest(new)["fingerprint_fields"]["turns"] == "all"
    with pytest.raises(GenerationDataError, match=r"disagree on turns") as error:
        validate_generation(_config(runs, [old, new], tmp_path / "a"), tokenizer=tokenizer)
    assert f"{old}: 'last'" in str(error.value) and f"{new}: 'all'" in str(error.value)
    edit(new, lambda fields: fields.update(turns="last"))
    result = validate_generation(
        _config(runs, [old, new], tmp_path / "b"), tokenizer=tokenizer, progress=False
    )
    assert result.coverage.complete


def test_every_node_holds_out_the_same_ids_and_none_reaches_an_export(runs, tokenizer, tmp_path):
    def held_and_trained(folders, out):  # type: ignore[no-untyped-def]
        result = validate_generation(
            _config(runs, folders, out, holdout_share=0.2, max_degenerate_share=1.0),
            tokenizer=tokenizer,
            progress=False,
        )
        export = finalize_export(result)
        held = set(result.records.filter(pl.col("held_out"))["prompt_id"].to_list())
        trained = {
            json.loads(x)["id"].partition("#")[0] for x in (export / "train.jsonl").read_text().splitlines()
        }
        trained |= {
            json.loads(x)["id"].partition("#")[0] for x in (export / "prompts.jsonl").read_text().splitlines()
        }
        holdout = export / "holdout" / "prompts.jsonl"
        listed = (
            {json.loads(x)["id"] for x in holdout.read_text().splitlines()} if holdout.exists() else set()
        )
        assert listed == held and not trained & held
        return held

    both = held_and_trained([runs.shard0, runs.shard1], tmp_path / "both")
    alone = [held_and_trained(f, tmp_path / f"alone-{i}") for i, f in enumerate((runs.shard0, runs.shard1))]
    assert both and alone[0] | alone[1] == both and not alone[0] & alone[1], (
        "each node holds out its part of one split"
    )
