"""validate.ipynb end to end with papermill: the gate stops a garbage corpus and lets a clean one through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import papermill
import pytest
from validate_helpers import clean_rows, row, write_generation

from draftgen.training.local_tokenizer import build_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "validate.ipynb"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tiny")


def test_gate_fails_the_notebook_on_garbage(tmp_path, tokenizer_dir):
    # the user's last run in miniature: most answers an empty think block and "OK."
    rows = clean_rows(10) + [row(f"ok-{i}", reasoning="", content="OK.") for i in range(70)]
    write_generation(tmp_path / "gen", rows)
    out = tmp_path / "out"
    with pytest.raises(papermill.PapermillExecutionError) as error:
        papermill.execute_notebook(
            str(NOTEBOOK),
            str(tmp_path / "executed.ipynb"),
            parameters={
                "generation_dir": str(tmp_path / "gen"),
                "tokenizer": str(tokenizer_dir),
                "out_dir": str(out),
            },
            kernel_name="python3",
            progress_bar=False,
            cwd=str(tmp_path),
        )
    assert error.value.ename == "ValidationGateError"
    assert "FAIL: 70 of 82 samples degenerate" in error.value.evalue  # 10 clean prompts: 12 turn rows
    assert not (out / "export").exists(), "a failed gate must not publish the export"
    executed = (tmp_path / "executed.ipynb").read_text()
    assert "mask sum" in executed and "image/png" in executed  # the histogram was drawn before the gate


def test_draftgen_run_passes_a_clean_corpus_and_publishes_the_export(tmp_path, tokenizer_dir):
    write_generation(tmp_path / "gen", clean_rows(30))
    command = [
        sys.executable,
        "-m",
        "draftgen",
        "run",
        "validate",
        "-f",
        str(ROOT / "params" / "sim.yaml"),  # a pipeline-wide file: the fleet settings are ignored here
        "-p",
        "generation_dir",
        str(tmp_path / "gen"),
        "-p",
        "tokenizer",
        str(tokenizer_dir),
        "-p",
        "export_tokens",
        "true",
        "-p",
        "holdout_share",
        "0",
        "--name",
        "clean",
        "--out-root",
        str(tmp_path / "runs"),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=os.environ.copy()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / "validate" / "clean"
    assert (run_dir / ".complete").exists() and (run_dir / "report.html").exists()
    lines = (run_dir / "export" / "train.jsonl").read_text().splitlines()
    # 30 clean prompts, seven of them two-turn conversations: a training row per generated turn
    assert len(lines) == 37 and json.loads(lines[0])["conversations"][-1]["role"] == "assistant"
    assert list((run_dir / "export" / "tokens").glob("*.parquet"))
    assert len((run_dir / "export" / "prompts.jsonl").read_text().splitlines()) == 37
    info = json.loads((run_dir / "export" / "dataset_info.json").read_text())
    assert info["counts"]["exported"] == 37 and info["trainer"]["last_turn_only"] is True
    assert (run_dir / "export" / "README.md").read_text().startswith("---\nconfigs:")
    assert json.loads((run_dir / "summary.json").read_text())["passed"] is True
