"""``draftgen smoke``: generate on enough prompts to arm the garbage guard, production settings, then validate.

The seeds' run came back 87% empty answers; a smoke run at their settings, long enough for the guard to look, halts
on the same fault within its first few hundred answers (the passing path is the README runbook's smoke line,
tests/test_runbook.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftgen.commands.smoke import GUARD_ROUNDS, generate_parameters, validate_parameters
from draftgen.generate.config import GenerateConfig
from draftgen.prompts.synthetic import write_synthetic

REPO = Path(__file__).resolve().parents[1]


def test_the_smoke_run_takes_enough_prompts_to_arm_the_guard_and_refuses_fewer() -> None:
    guard = GenerateConfig.model_fields["guard_min_results"].default
    assert generate_parameters({"prompts": "p"})["limit"] == GUARD_ROUNDS * guard
    assert generate_parameters({"guard_min_results": 40})["limit"] == GUARD_ROUNDS * 40
    assert generate_parameters({"limit": guard})["limit"] == guard
    with pytest.raises(ValueError, match=f"limit 50 is below guard_min_results {guard}"):
        generate_parameters({"limit": 50})
    # validate gets the folder, the tokenizer and the shared names only (generate's own would be unknown to it)
    values = validate_parameters(
        {"servers": ["http://x"], "train_max_length": 2048, "max_empty_answer_rate": 0.1},
        Path("outputs/generate/smoke"),
        "/models/q",
    )
    assert values == {
        "servers": ["http://x"],
        "train_max_length": 2048,
        "generation_dir": "outputs/generate/smoke",
        "tokenizer": "/models/q",
    }


def test_smoke_halts_on_the_seeds_empty_answers_before_validate_runs(
    sim_fleet, sim_tokenizer_dir, tmp_path
) -> None:
    """87% of answers the short failure (``</think>`` then "OK.", as the seeds' data): the guard, armed by the
    smoke run's prompt count, halts generate; smoke exits 1 saying so, and validate never starts. The canary is off
    so that the guard alone is what is shown (on, it refuses such servers too, whenever its draw is defective)."""
    fleet = sim_fleet(
        servers=2,
        profile="b200-mtp",
        speed=100.0,
        max_running_requests=64,  # as draftgen serve starts SGLang
        model=str(sim_tokenizer_dir),
        server_args=("--model-path", str(sim_tokenizer_dir)),
        tokenizer=sim_tokenizer_dir,
        faults=["empty_answer_rate=0.87"],
    )
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 240, seed=87)
    started = time.perf_counter()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "draftgen", "smoke", "-f", str(REPO / "params" / "b200x7.yaml")),
            *("-p", "servers", repr(fleet.urls).replace("'", '"')),
            *("-p", "prompts", str(prompts), "-p", "canary", "false", "--out-root", str(tmp_path / "out")),
            "--no-html",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    took = time.perf_counter() - started
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "draftgen smoke: FAIL at generate" in done.stderr, done.stderr[-3000:]
    assert "empty" in done.stderr.split("FAIL at generate", 1)[1]  # the guard says which defect
    assert not (tmp_path / "out" / "validate" / "smoke").exists()
    assert (tmp_path / "out" / "generate" / "smoke" / "manifest.json").exists()
    print(f"smoke halted in {took:.0f} s")
