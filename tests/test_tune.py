"""draftgen tune on the simulator, where each candidate's tok/s per GPU is known from the profile (issue 13)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from layout_helpers import layout_shape
from write_audit import cell_writes, kernel_env

from draftgen.params import ParameterError, build_config
from draftgen.server_settings import ServerSettings, load_settings, save_settings, sglang_problems
from draftgen.sim.fleet import find_free_base_port, http_status
from draftgen.sim.profiles import get_profile
from draftgen.sim.speculative import SimSettings, StartupError, apply_settings
from draftgen.steps import get_step
from draftgen.tune import report
from draftgen.tune.config import TuneConfig
from draftgen.tune.run import run_tune

REPO = Path(__file__).resolve().parents[1]
SPEED = 2.0
CONCURRENCY = 8
MAX_TOKENS = 128


def truth_tok_s(settings: ServerSettings, concurrency: int) -> float | None:
    """The simulated GPU's steady tok/s at ``concurrency`` for these settings, or None if it cannot start."""
    flags = SimSettings(
        speculative_algorithm=settings.speculative_algorithm or "none",
        speculative_num_steps=settings.speculative_num_steps,
        speculative_eagle_topk=settings.speculative_eagle_topk,
        speculative_num_draft_tokens=settings.speculative_num_draft_tokens,
        max_running_requests=settings.max_running_requests,
        speculative_adaptive=settings.speculative_adaptive,
    )
    try:
        return apply_settings(get_profile("b200-mtp"), flags).tokens_per_second(concurrency)
    except StartupError:
        return None


def sim_config(tmp_path, **values: object) -> TuneConfig:
    base = {
        "engine": "sim",
        "model": "Qwen/Qwen3.6-27B",
        "gpus": "0-2",
        "base_port": find_free_base_port(3),
        "sim_speed": SPEED,
        "max_tokens": MAX_TOKENS,
        "sample_size": 64,
        "warmup_requests": 1,
        "out_dir": str(tmp_path / "tune"),
    }
    return build_config(TuneConfig, {**base, **values})


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One tune run on a space whose truth is known: 3 simulated GPUs, 10 candidates (adaptive speculation from
    3 among them), 3 of them out of memory."""
    tmp_path = tmp_path_factory.mktemp("tune")
    config = sim_config(
        tmp_path,
        spec_candidates=[[1, 1, 2], [3, 1, 4], [5, 1, 6]],
        adaptive_steps=[3],
        max_running_requests=[CONCURRENCY, 160],  # 160 does not fit with 3/1/4 or 5/1/6: they fail to start
        concurrency=CONCURRENCY,
        max_rounds=2,
    )
    lines: list[str] = []
    run = asyncio.run(run_tune(config, log=lines.append))
    return config, run, report.save_report(run), lines


@pytest.mark.timing
def test_tune_picks_the_best_or_names_it_tied_and_never_a_failed_start(tuned):
    _config, run, info, lines = tuned
    truths = {c.index: truth_tok_s(c.settings, c.concurrency) for c in run.candidates}
    best = max(t for t in truths.values() if t is not None)
    assert run.chosen is not None
    # The chosen one is the best (within 2%), or the best is among the finalists the report names as tied with it:
    # two candidates whose intervals overlap may come out in either order, and the report says so.
    near_best = {
        c.label for c in run.candidates if truths[c.index] is not None and truths[c.index] >= 0.98 * best
    }
    assert run.chosen.label in near_best or near_best & set(info["ties_with"]), (
        run.chosen.label,
        info["ties_with"],
        truths,
        lines,
    )
    failed = {j.candidate.index for j in run.jobs if j.start_failed}
    assert failed == {i for i, t in truths.items() if t is None}  # exactly the out-of-memory ones
    assert run.chosen.index not in failed
    # The failures are marked with their log tail, and the rest went on.
    table = report.candidate_table(run)
    marked = table.filter(table["status"] == "failed to start")
    assert marked.height == len(failed) == 3
    assert all("Not enough memory" in tail for tail in marked["log_tail"].to_list())
    assert any("Not enough memory" in line for line in lines)
    measured = table.filter(table["tok_s_per_gpu"].is_not_null())
    assert measured.height == len(run.candidates) - 3
    assert table.filter(table["adaptive"])["candidate"].to_list() == [
        f"MTP adaptive from 3/1/4, {CONCURRENCY} running",
        "MTP adaptive from 3/1/4, 160 running",
    ]
    assert (measured["tok_s_per_gpu_low"] <= measured["tok_s_per_gpu"]).all()
    assert (measured["tok_s_per_gpu"] <= measured["tok_s_per_gpu_high"]).all()
    # Acceptance follows the settings (1 + p for one draft position, 3.6 for the seeds' 3/1/4).
    by_label = dict(zip(measured["candidate"], measured["accept_length"], strict=True))
    assert by_label[f"MTP 3/1/4, {CONCURRENCY} running"] == pytest.approx(3.6, abs=0.15)
    assert by_label[f"MTP off, {CONCURRENCY} running"] == pytest.approx(1.0)
    # Successive halving: the losers of round 0 got one job, the finalists more.
    jobs = {c: table.filter(table["candidate"] == c)["jobs"][0] for c in measured["candidate"]}
    assert jobs[run.chosen.label] > min(jobs.values())
    assert info["tok_s_per_gpu"] > 0 and info["baseline_tok_s_per_gpu"] > 0


@pytest.mark.timing
def test_finalists_within_the_chosen_ones_interval_are_reported_as_ties(tuned):
    """The race still writes its best point figure to the settings file, but names the finalists whose interval
    overlaps the chosen one's: their order may be noise."""
    _config, run, info, _lines = tuned
    est = run.estimates[run.chosen.index]
    finalists = [c for c in run.candidates if c.index in run.estimates and c.index not in run.eliminated_in]
    expected = [
        c.label
        for c in finalists
        if c.index != run.chosen.index
        and run.estimates[c.index].tok_s_low <= est.tok_s_high
        and est.tok_s_low <= run.estimates[c.index].tok_s_high
    ]
    assert info["ties_with"] == expected
    other = next(c for c in finalists if c.index != run.chosen.index)
    overlapping = dataclasses.replace(
        run.estimates[other.index], tok_s_low=est.tok_s_low, tok_s_high=est.tok_s_high
    )
    apart = dataclasses.replace(
        run.estimates[other.index], tok_s_low=est.tok_s_high + 1, tok_s_high=est.tok_s_high + 2
    )
    for estimate, tied in ((overlapping, True), (apart, False)):
        swapped = dataclasses.replace(run, estimates={**run.estimates, other.index: estimate})
        assert (other.label in report.ties_with_chosen(swapped)) is tied


@pytest.mark.timing
def test_the_settings_file_launches_with_draftgen_serve(tuned, tmp_path):
    config, run, _info, _ = tuned
    settings = load_settings(config.settings_path)
    assert settings == run.chosen.settings
    recorded = yaml.safe_load(config.settings_path.read_text())["tuned"]
    assert recorded["chosen_label"] == run.chosen.label
    port = find_free_base_port(1)
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "draftgen",
            "serve",
            "--engine",
            "sim",
            "--gpus",
            "0",
            "--base-port",
            str(port),
            "--settings",
            str(config.settings_path),
            "--plain",
            "--out",
            str(tmp_path),
            "--run",
            "s",
            "--poll-interval",
            "0.2",
            "--grace",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}/health") != 200:
            assert serve.poll() is None and time.monotonic() < deadline, (
                serve.stdout.read() if serve.stdout else ""
            )
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as response:
            served = json.load(response)
        assert served["max_running_requests"] == settings.max_running_requests
        assert served["speculative_num_steps"] == settings.speculative_num_steps
        assert served["speculative_num_draft_tokens"] == settings.speculative_num_draft_tokens
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def test_invalid_candidates_are_refused_before_anything_starts(tmp_path):
    port = find_free_base_port(3)
    with pytest.raises(ParameterError) as caught:
        sim_config(
            tmp_path,
            base_port=port,
            spec_candidates=[[3, 1, 4], [3, 1, 6], [2, 4, 8]],
            attention_backend="trtllm_mha",
        )
    text = str(caught.value)
    assert re.search(
        r"spec_candidates\[1\] \[3, 1, 6\]: with eagle_topk 1 SGLang changes num_draft_tokens 6", text
    )
    assert "spec_candidates[2] [2, 4, 8]: eagle_topk 4 > 1: SGLang's trtllm_mha attention backend" in text
    assert "spec_candidates[0]" not in text
    assert not (tmp_path / "tune").exists()  # nothing ran, nothing written
    assert sglang_problems(
        ServerSettings(speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=8),
        spec_v2=True,
    )
    with pytest.raises(ParameterError, match="spec_candidates"):
        sim_config(tmp_path, spec_candidates=[[3, 1]])


def test_adaptive_candidates_are_refused_where_sglang_0_5_23_would(tmp_path):
    with pytest.raises(ParameterError) as caught:
        sim_config(
            tmp_path,
            adaptive_steps=[3, 4],
            extra_args=["--enable-two-batch-overlap", "--enable-lora"],
        )
    text = str(caught.value)
    assert (
        "adaptive_steps[1] 4: SGLang: --speculative-num-steps=4 is not in the adaptive config candidate_steps "
        "[0, 1, 3, 5, 7]. Pass one of those values." in text
    )
    assert (
        "adaptive_steps[0] 3: --enable-two-batch-overlap: SGLang: speculative_adaptive disabled: "
        "enable_two_batch_overlap=True is not supported" in text
    )
    assert "adaptive_steps[0] 3: --enable-lora: SGLang refuses to start: LoRA does not support" in text
    assert not (tmp_path / "tune").exists()
    adaptive = ServerSettings(
        speculative_num_steps=3,
        speculative_eagle_topk=2,
        speculative_num_draft_tokens=6,
        speculative_adaptive=True,
    )
    assert any("only topk=1 is supported" in p for p in sglang_problems(adaptive))
    off = ServerSettings(
        speculative_algorithm=None,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        speculative_adaptive=True,
    )
    assert any("only EAGLE/EAGLE3 are supported" in p for p in sglang_problems(off))
    config = sim_config(tmp_path, adaptive_steps=[1, 3], spec_candidates=[], mtp_off=False)
    (first, *_), last = config.candidates(), config.candidates()[-1]
    assert first.settings.sglang_args()[-3:] == ["--speculative-adaptive", "--max-running-requests", "48"]
    assert last.slug.startswith(f"c{last.index:02d}-adapt3-1-4-")
    assert sglang_problems(last.settings) == []


def test_draftgen_tune_command_refuses_a_bad_space(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftgen",
            "tune",
            "-p",
            "engine",
            "sim",
            "-p",
            "model",
            "m",
            "-p",
            "spec_candidates",
            "[[2, 1, 5]]",
            "--out-root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "num_draft_tokens 5 to num_steps + 1 = 3" in done.stderr
    assert not (tmp_path / "tune").exists()  # refused before a run folder was made


def test_benchmark_and_estimate_record_the_settings_file(tmp_path):
    from draftgen.bench.config import BenchmarkConfig
    from draftgen.estimate.config import EstimateConfig
    from draftgen.server_settings import save_settings, settings_record

    path = save_settings(tmp_path / "s.yaml", ServerSettings(max_running_requests=96), {"chosen_label": "x"})
    bench = build_config(
        BenchmarkConfig, {"servers": ["http://127.0.0.1:1"], "model": "m", "settings": str(path)}
    )
    record = settings_record(bench.settings)
    assert record["settings"]["max_running_requests"] == 96
    assert "--speculative-num-draft-tokens" in record["sglang_args"]
    (tmp_path / "bad.yaml").write_text("settings: {speculative_num_steps: 0}\n")
    with pytest.raises(ParameterError, match="settings"):
        build_config(EstimateConfig, {"settings": str(tmp_path / "bad.yaml")})


def test_serve_dry_run_puts_the_settings_on_every_server(tmp_path):
    from draftgen.server_settings import save_settings

    off = save_settings(
        tmp_path / "off.yaml",
        ServerSettings(
            speculative_algorithm=None,
            speculative_num_steps=None,
            speculative_eagle_topk=None,
            speculative_num_draft_tokens=None,
            max_running_requests=128,
        ),
        {},
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftgen",
            "serve",
            "--model",
            "m",
            "--gpus",
            "0-1",
            "--settings",
            str(off),
            "--dry-run",
            "--python",
            sys.executable,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr
    assert all("--max-running-requests 128" in line and "--speculative" not in line for line in lines)


def _tune_run(face: list[str], name: str, root: Path, env: dict[str, str]) -> Path:
    """``draftgen run tune`` or ``draftgen tune`` with params/tune.yaml and two small simulated candidates."""
    overrides = {
        "engine": "sim",
        "gpus": "0-1",
        "base_port": find_free_base_port(2),
        "sim_speed": 4.0,
        "max_tokens": 64,
        "sample_size": 32,
        "spec_candidates": [[1, 1, 2], [3, 1, 4]],
        "adaptive_steps": [],  # params/tune.yaml's adaptive candidate is measured by the `tuned` fixture
        "max_running_requests": [4],
        "mtp_off": False,
        "max_rounds": 1,
        "warmup_requests": 0,
        "baseline": False,
    }
    command = [sys.executable, "-m", "draftgen", *face, "-f", "params/tune.yaml", "--name", name]
    command += ["--out-root", str(root)]
    for key, value in overrides.items():
        command += ["-p", key, value if isinstance(value, str) else json.dumps(value)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return root / "tune" / name


@pytest.mark.slow  # started first (tests/long_first.py)
def test_draftgen_tune_and_draftgen_run_tune_leave_the_same_folder(tmp_path):
    """One runner, one function: the command's folder is the notebook's but for the executed notebook and its
    report; the notebook's cells write nothing but through run(config)."""
    env, log = kernel_env(tmp_path, tmp_path / "runs", dict(os.environ))
    notebook = _tune_run(["run", "tune"], "nb", tmp_path / "runs", env)
    command = _tune_run(["tune"], "cmd", tmp_path / "runs", env)

    info = json.loads((notebook / "tune.json").read_text())
    assert info["chosen_label"] == "MTP 3/1/4, 4 running"  # 1.5x the tok/s of 1/1/2 at batch 4
    assert load_settings(notebook / "settings.yaml").speculative_num_steps == 3
    assert json.loads((command / "tune.json").read_text())["chosen_label"] == info["chosen_label"]
    step = get_step("tune")
    shape = {
        name: layout_shape(folder, step) for name, folder in (("notebook", notebook), ("command", command))
    }
    assert shape["notebook"] - shape["command"] == {"<step>.ipynb", "report.html"}, shape
    assert shape["command"] - shape["notebook"] == set(), shape
    assert {"parameters.yaml", ".complete", "tune.json", "settings.yaml", "tok_s_per_gpu.png"} <= shape[
        "command"
    ]
    recorded = {
        name: yaml.safe_load((folder / "parameters.yaml").read_text())
        for name, folder in (("notebook", notebook), ("command", command))
    }
    # the validated config, the same but for where it ran and the interpreter (the notebook's literal "" and the
    # command's default are both this one)
    where = {"out_dir", "base_port", "python"}
    assert {k: v for k, v in recorded["notebook"].items() if k not in where} == {
        k: v for k, v in recorded["command"].items() if k not in where
    }
    assert recorded["command"]["out_dir"] == str(command) and recorded["notebook"]["out_dir"] == str(notebook)
    written = cell_writes(log, notebook / "tune.ipynb")
    assert [source for source in written if "await run(config)" not in source] == [], written
    assert written, "the audit saw run(config) write nothing: it is not looking"
    # Whether every candidate started, grouped: one row per check over the two candidates, none failed.
    shown = [
        "".join(output.get("data", {}).get("text/plain", ""))
        for cell in json.loads((notebook / "tune.ipynb").read_text())["cells"]
        for output in cell.get("outputs", [])
    ]
    (startup,) = [text for text in shown if text.startswith("Start-up and measurement, per candidate")]
    assert re.search(r"ok +started +2/2 candidates +/health_generate answered 200", startup), startup
    assert re.search(r"ok +measured +2/2 candidates", startup) and "FAIL" not in startup, startup
    # A finished folder is never run into again, by either face.
    rerun = [sys.executable, "-m", "draftgen", "tune", "-f", "params/tune.yaml", "--name", "cmd", "--resume"]
    again = subprocess.run(
        [*rerun, "--out-root", str(tmp_path / "runs"), "-p", "engine", "sim"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert again.returncode == 2 and "already finished" in again.stderr, again.stderr


def test_ngram_and_standalone_candidates_expand_to_sglangs_own_flags(tmp_path):
    config = build_config(
        TuneConfig,
        {
            "model": "/models/target",
            "gpus": "0-1",
            "speculative_algorithm": "STANDALONE",
            "speculative_draft_model_path": "/models/draft",
            "spec_candidates": [[3, 1, 4]],
            "ngram_draft_tokens": [2, 4],
            "max_running_requests": [4],
            "out_dir": str(tmp_path / "tune"),
        },
    )
    by_label = {c.label: c for c in config.candidates()}
    assert list(by_label) == [
        "MTP off, 4 running",
        "STANDALONE 3/1/4, 4 running",
        "NGRAM 2 drafts, 4 running",
        "NGRAM 4 drafts, 4 running",
    ]
    standalone = by_label["STANDALONE 3/1/4, 4 running"].settings
    assert standalone.sglang_args() == [
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
        "--speculative-draft-model-path",
        "/models/draft",
        "--max-running-requests",
        "4",
    ]
    ngram = by_label["NGRAM 4 drafts, 4 running"]
    # NGRAM has no steps or top-k of its own: SGLang derives them, so none is sent
    assert ngram.settings.sglang_args() == [
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        "4",
        "--max-running-requests",
        "4",
    ]
    assert ngram.slug == "c03-ngram4-mrr4" and by_label["STANDALONE 3/1/4, 4 running"].slug.startswith(
        "c01-standalone3-1-4"
    )
    assert all(not sglang_problems(c.settings) for c in config.candidates())
    # a settings file of each round-trips, and an NGRAM file written by hand needs no nulls
    for candidate in config.candidates():
        path = save_settings(tmp_path / f"{candidate.slug}.yaml", candidate.settings, {})
        assert load_settings(path) == candidate.settings
    (tmp_path / "hand.yaml").write_text(
        "settings: {speculative_algorithm: NGRAM, speculative_num_draft_tokens: 8}\n"
    )
    assert load_settings(tmp_path / "hand.yaml").sglang_args()[:4] == [
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        "8",
    ]


def test_what_sglang_would_not_run_as_given_for_ngram_and_standalone(tmp_path):
    assert "NGRAM takes only speculative_num_draft_tokens" in " ".join(
        sglang_problems(
            ServerSettings(
                speculative_algorithm="NGRAM", speculative_num_steps=2, speculative_num_draft_tokens=4
            )
        )
    )
    assert sglang_problems(
        ServerSettings(speculative_algorithm="NGRAM", speculative_num_draft_tokens=None)
    ) == ["NGRAM needs speculative_num_draft_tokens (tokens verified per request and step)"]
    with pytest.raises(ParameterError) as caught:
        build_config(
            TuneConfig,
            {"model": "m", "speculative_algorithm": "STANDALONE", "spec_candidates": [[3, 1, 4], [3, 1, 6]]},
        )
    text = str(caught.value)
    assert "spec_candidates[0] [3, 1, 4]: STANDALONE needs speculative_draft_model_path" in text
    assert "spec_candidates[1] [3, 1, 6]: STANDALONE needs" in text
    with pytest.raises(ParameterError) as caught:
        sim_config(tmp_path, ngram_draft_tokens=[4])
    assert "ngram_draft_tokens: the simulator does not model NGRAM" in str(caught.value)
    with pytest.raises(ParameterError, match="ngram_draft_tokens"):
        sim_config(tmp_path, engine="sglang", ngram_draft_tokens=[1])


def test_serve_refuses_settings_the_simulator_cannot_model_and_runs_them_on_sglang(tmp_path):
    path = save_settings(
        tmp_path / "ngram.yaml",
        ServerSettings(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4),
        {},
    )
    base = [sys.executable, "-m", "draftgen", "serve", "--model", "m", "--gpus", "0", "--settings", str(path)]
    sim = subprocess.run([*base, "--engine", "sim", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert sim.returncode == 2 and "--engine sim models MTP (NEXTN, EAGLE), drafters" in sim.stderr
    real = subprocess.run(
        [*base, "--dry-run", "--python", sys.executable], capture_output=True, text=True, timeout=60
    )
    assert real.returncode == 0, real.stderr
    assert "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4" in real.stdout
    assert "--speculative-num-steps" not in real.stdout


def test_a_candidate_whose_port_another_process_took_is_not_started(tmp_path):
    """tune's preflight saw the port free; a process that took it since must not pass for the candidate."""
    import socket

    from draftgen.tune.launch import FailedStart, launch_spec, start

    config = sim_config(tmp_path)
    spec = launch_spec(config, config.candidates()[0], 0, run_name="taken")
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", spec.port))
        taken.listen()
        log = tmp_path / "server.log"
        result = asyncio.run(start(spec, log, timeout_s=30))
    assert isinstance(result, FailedStart)
    assert f"port {spec.port} on 127.0.0.1 already in use by another process" in result.reason
    assert not log.exists()  # nothing was spawned
