"""generate.ipynb end to end: papermill (via ``draftgen run``) on the real notebook against simulated fleets — the
main job, a client SIGKILLed and resumed, a failed preflight, bad parameters — and the run's behaviour under faults
and bad input through generate's run(config), the function the notebook's cell calls, in the test's own process
(a kernel and draftgen run around it cost about 5 CPU-seconds a run, and show the same outcome).

Each run is small (instant profile where timing does not matter, a fast clock where it does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
from generate_helpers import generate_config, generate_here, run_command, wait_for_shards
from sim_helpers import post

from draftgen.display.headline import MARKER
from draftgen.generate.preflight import PreflightError
from draftgen.generate.step import run
from draftgen.generate.store import read_done_ids, read_manifest
from draftgen.prompts.rows import PromptRow, iter_prompts
from draftgen.prompts.synthetic import write_synthetic

RUN_TIMEOUT_S = 240


def draftgen_run(out_root: Path, name: str, params: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        run_command(out_root, name, params, *extra),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=os.environ.copy(),
    )


def start_run(out_root: Path, name: str, params: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        run_command(out_root, name, params, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def notebook_text(run_dir: Path) -> str:
    """Everything the executed notebook printed or raised."""
    nb = json.loads((run_dir / "generate.ipynb").read_text())
    parts = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", "")))
            parts.append(f"{output.get('ename', '')}: {output.get('evalue', '')}")
            parts.extend(
                "".join(v) if isinstance(v, list) else str(v) for v in output.get("data", {}).values()
            )
    return "\n".join(parts)


def valid_ids(path: Path) -> list[str]:
    return [r.id for r in iter_prompts(path) if isinstance(r, PromptRow)]


def assert_exactly_once(run_dir: Path, expected: list[str]) -> None:
    shards = sorted((run_dir / "shards").glob("part-*.parquet"))
    ids: list[str] = []
    for shard in shards:
        ids.extend(pl.read_parquet(shard)["id"].to_list())  # every shard whole and readable
    assert len(ids) == len(set(ids)), "an id was stored twice"
    assert set(ids) == set(expected), (
        f"missing {len(set(expected) - set(ids))}, extra {len(set(ids) - set(expected))}"
    )


def base_params(fleet, prompts: Path, **changes: object) -> dict:
    params = {
        "servers": fleet.urls,
        "prompts": str(prompts),
        "max_tokens": 256,
        "concurrency_per_server": 8,
        "batch_save_size": 100,
        "backoff_base_s": 0.05,
        "backoff_max_s": 1.0,
        "probe_interval_s": 0.2,
        "probe_max_interval_s": 1.0,
    }
    params.update(changes)
    return params


@pytest.fixture
def prompts_2000(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    write_synthetic(path, 2000, seed=7)
    return path


# ----- the main job -----------------------------------------------------------------------------------------
@pytest.mark.slow  # started first (tests/long_first.py)
def test_seven_servers_every_id_exactly_once_and_no_secret_leaks(sim_fleet, tmp_path, monkeypatch):
    prompts_1000 = tmp_path / "prompts.jsonl"
    write_synthetic(prompts_1000, 1000, seed=7)
    secret = "sk-draftgen-test-" + os.urandom(8).hex()
    monkeypatch.setenv("DRAFTGEN_TEST_API_KEY", secret)
    fleet = sim_fleet(servers=7, profile="instant")
    estimate = tmp_path / "estimate.json"
    estimate.write_text(
        json.dumps(
            {
                "aggregate_output_tok_s": 14000.0,
                "wall_time_s": 90000.0,
                "num_prompts": 900000,
                "servers": 7,
                "concurrency_per_server": 64,
                "max_tokens": 4096,
                "mean_completion_tokens": 1400.0,
            }
        )
    )
    params = base_params(
        fleet, prompts_1000, batch_save_size=125, api_key_env="DRAFTGEN_TEST_API_KEY", estimate=str(estimate)
    )
    result = draftgen_run(tmp_path / "out", "seven", params)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "out" / "generate" / "seven"
    valid = valid_ids(prompts_1000)  # the generator's long chats plant a few exact duplicates: skipped
    assert 990 <= len(valid) < 1000
    assert_exactly_once(run_dir, valid)
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "complete" and manifest["counts"] == {
        "done": len(valid),
        "failed": 0,
        "rejected": 1000 - len(valid),
    }
    rejected = pl.read_parquet(run_dir / "rejected.parquet")["reason"].to_list()
    assert all(reason.startswith("duplicate of ") for reason in rejected)
    assert len(manifest["shards"]) == 8
    frame = pl.read_parquet(run_dir / "shards" / "part-000001.parquet")
    assert frame["server"].n_unique() > 1
    # an answer is stored wherever one came: only a turn cut inside its reasoning has none
    assert frame.filter(pl.col("content").is_null())["finish_reason"].to_list() in (
        [],
        ["length"] * frame["content"].null_count(),
    )
    assert frame["response_id"].null_count() == 0 and frame["usage_reported"].all()
    servers = pl.scan_parquet(sorted((run_dir / "shards").glob("*.parquet"))).select("server").collect()
    assert servers["server"].n_unique() == 7  # every server took work
    for plot in (
        "throughput",
        "finish_reasons",
        "completion_lengths",
        "acceptance_by_category",
        "acceptance_by_length",
    ):
        assert (run_dir / "plots" / f"{plot}.png").stat().st_size > 1000
    assert "image/png" in (run_dir / "generate.ipynb").read_text()  # plots shown inline
    streams = [
        output
        for cell in json.loads((run_dir / "generate.ipynb").read_text())["cells"]
        for output in cell.get("outputs", [])
        if output["output_type"] == "stream"
    ]
    done = f"{len(valid)}/{len(valid)}"
    bars = [o["name"] for o in streams if done in "".join(o["text"])]
    assert bars and set(bars) == {"stdout"}  # the bar is output, not an error (JupyterLab paints stderr red)
    text = notebook_text(run_dir)
    # the report opens with the answer, and draftgen run printed the same block at the end
    report = (run_dir / "report.html").read_text()
    assert -1 < report.index(MARKER) < report.index("<h1")
    assert "generate: is every prompt answered exactly once" in result.stdout and "PASS" in result.stdout
    assert "shape: (" not in report and report.count(done) == 1  # the bar's final line only
    assert "wall time for the set (h)" in text and "900,000" in text  # planned vs actual, from the estimate
    assert "estimate assumed concurrency_per_server=64, this run used 8" in text
    # the key went to the servers but into no file: notebook, HTML, parameters, manifest, data, logs
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == []
    assert secret not in result.stdout + result.stderr
    assert "DRAFTGEN_TEST_API_KEY" in (run_dir / "manifest.json").read_text()  # the NAME is recorded


def test_server_killed_mid_run_and_restarted_loses_nothing(sim_fleet, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 300, seed=8)
    fleet = sim_fleet(servers=3, profile="b200-mtp", speed=5.0)  # slow enough to outlast the restart
    run_dir = tmp_path / "run"
    params = base_params(fleet, prompts, max_truncated_rate=1.0, server_down_after=2, request_timeout_s=30.0)

    async def scenario():
        session = asyncio.create_task(run(generate_config(run_dir, params), show=lambda shown: None))
        await asyncio.to_thread(wait_for_stored, run_dir, 1, session)
        await asyncio.to_thread(fleet.kill, 2)
        await asyncio.sleep(1.0)
        assert not session.done(), "the run must survive a server crash"
        await asyncio.to_thread(fleet.restart, 2)
        return await session

    generated = asyncio.run(scenario())
    assert generated.result.status == "complete"
    assert_exactly_once(run_dir, valid_ids(prompts))
    events = [what for _, server, what in generated.result.events if server == fleet.urls[2]]
    assert any("marked down" in what for what in events) and any("rejoined" in what for what in events)
    assert not (run_dir / "failed.parquet").exists()


def wait_for_stored(run_dir: Path, count: int, session: asyncio.Task, timeout: float = 120.0) -> None:
    """Until ``count`` shards are stored by the in-process ``session`` (fails if it ends first)."""
    deadline = time.monotonic() + timeout
    while len(list((run_dir / "shards").glob("part-*.parquet"))) < count:
        assert not session.done(), f"run ended before {count} shards"
        assert time.monotonic() < deadline, f"fewer than {count} shards after {timeout} s"
        time.sleep(0.05)


def _kernel_of(proc: subprocess.Popen) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            if "ipykernel" in " ".join(child.cmdline()):
                return child
        time.sleep(0.1)
    raise AssertionError("no kernel process found")


def sigkill_kernel_after_shards(out_root: Path, name: str, params: dict, shards: int) -> tuple[int, float]:
    """Start ``draftgen run generate``, SIGKILL its kernel (the client itself: no flush, no goodbye) once ``shards``
    shards are stored; the run's exit code and when the kernel was killed (time.time())."""
    proc = start_run(out_root, name, params, "--no-html")
    try:
        kernel = _kernel_of(proc)
        wait_for_shards(out_root / "generate" / name, shards, proc)
        kernel.send_signal(signal.SIGKILL)
        killed_at = time.time()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, killed_at


@pytest.mark.slow  # started first (tests/long_first.py)
def test_client_sigkilled_mid_run_then_resumed(sim_fleet, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 200, seed=9)
    fleet = sim_fleet(servers=3, profile="b200-mtp", speed=20.0)
    params = base_params(fleet, prompts, max_truncated_rate=1.0, batch_save_size=50)  # killed at 100 of 200
    run_dir = tmp_path / "out" / "generate" / "crash"
    returncode, _ = sigkill_kernel_after_shards(tmp_path / "out", "crash", params, 2)
    assert returncode != 0
    stored_before = read_done_ids(run_dir)
    assert 0 < len(stored_before) < 200 and stored_before.n_unique() == len(stored_before)
    result = draftgen_run(tmp_path / "out", "crash", params, "--resume", "--no-html")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_exactly_once(run_dir, valid_ids(prompts))
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "complete"
    assert manifest["sessions"][-1]["completed"] == 200 - len(stored_before)  # only the rest was generated
    assert "already stored" in notebook_text(run_dir)


class OtherClient:
    """Another client on the same servers (a second shard's run, a benchmark): keeps ``per_server`` long requests
    in flight on each server until stopped, so generate's requests queue there beyond the batch cap (which
    preflight made sure is not below generate's own concurrency) and meet the servers' 429s. Its requests' ids
    start with ``other-``."""

    def __init__(self, urls: list[str], per_server: int):
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(url, f"other-{i}-{k}"), daemon=True)
            for i, url in enumerate(urls)
            for k in range(per_server)
        ]

    def _loop(self, url: str, name: str) -> None:
        sent = 0
        while not self.stop.is_set():
            body = {
                "model": "Qwen/Qwen3.6-27B",
                "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 4096,
                "rid": f"{name}-{sent}",
            }
            sent += 1
            with contextlib.suppress(OSError):  # its own 500s, 429s and hangs (timed out) are not this test's
                post(f"{url}/v1/chat/completions", body, timeout=5.0)

    def __enter__(self) -> OtherClient:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10.0)


@pytest.mark.slow  # started first (tests/long_first.py)
def test_errors_hangs_and_429s_all_complete(sim_fleet, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_synthetic(prompts, 300, seed=10)
    fleet = sim_fleet(
        servers=3,
        profile="b200-mtp",
        speed=50.0,
        max_running_requests=12,
        faults=["error_rate=0.05", "hang_rate=0.03", "overload=5"],
    )
    params = base_params(
        fleet,
        prompts,
        max_truncated_rate=1.0,
        concurrency_per_server=12,
        request_timeout_s=3.0,
        # ~35% of attempts fail here (429s mostly, more on a loaded machine): at 8 attempts one of 800 prompts ran out
        # about one run in six; at 30, none should in a million runs even if half of all attempts failed
        max_attempts=30,
        canary=False,
    )
    run_dir = tmp_path / "run"
    with OtherClient(
        fleet.urls, per_server=8
    ):  # 8 of each server's 12 slots taken: generate's 12 queue there
        assert generate_here(run_dir, params).result.status == "complete"
    assert_exactly_once(run_dir, valid_ids(prompts))
    assert not (run_dir / "failed.parquet").exists()
    outcomes = {r["outcome"] for r in fleet.truth() if not r["rid"].startswith("other-")}
    assert {
        "error_500",
        "hung",
        "overloaded",
    } <= outcomes  # every fault really happened to generate's requests
    attempts = pl.scan_parquet(sorted((run_dir / "shards").glob("*.parquet"))).select("attempts").collect()
    assert attempts["attempts"].max() > 1


def test_guard_halts_within_the_first_batch_when_answers_are_empty(sim_fleet, tmp_path, prompts_2000):
    fleet = sim_fleet(servers=3, profile="instant", faults=["empty_answer_rate=0.9"])
    params = base_params(fleet, prompts_2000, batch_save_size=500, canary=False)
    result = draftgen_run(tmp_path / "out", "garbage", params)
    run_dir = tmp_path / "out" / "generate" / "garbage"
    assert result.returncode == 1  # the run ran and came out wrong (draftgen.exit_codes)
    text = notebook_text(run_dir)
    assert "GuardTripped" in text and "empty reasoning" in text
    assert "syn-7-" in text  # example ids named
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "halted"
    done = manifest["counts"]["done"]
    assert 0 < done < 500  # halted inside the first batch, and what finished was kept
    assert len(read_done_ids(run_dir)) == done


def test_canary_catches_empty_answers_before_the_run(sim_fleet, tmp_path, prompts_2000):
    fleet = sim_fleet(servers=2, profile="instant", faults=["empty_answer_rate=1.0"])
    result = draftgen_run(tmp_path / "out", "canary", base_params(fleet, prompts_2000), "--no-html")
    run_dir = tmp_path / "out" / "generate" / "canary"
    assert result.returncode == 3 and "refused before any work" in result.stderr  # preflight: nothing sent
    assert (run_dir / ".refused").exists()  # the name stays free
    text = notebook_text(run_dir)
    assert "PreflightError" in text and "canary" in text and "empty reasoning" in text
    assert not list((run_dir / "shards").glob("*.parquet"))


# ----- bad input ------------------------------------------------------------------------------------------
MALFORMED = [
    b"{not json",  # invalid JSON
    b'["a", "list"]',  # not an object
    b'{"id": "m-nofield", "text": "hi"}',  # no messages/conversations/prompt
    b'{"id": "m-notlist", "messages": "hello"}',  # messages not a list
    b'{"id": "m-notobj", "messages": ["hello"]}',  # message not an object
    b'{"id": "m-role", "messages": [{"role": "wizard", "content": "hi"}]}',  # unknown role
    b'{"id": "m-content", "messages": [{"role": "user", "content": 42}]}',  # content not a string
    b'{"id": "m-onlyasst", "messages": [{"role": "assistant", "content": "hi"}]}',  # nothing to answer
    b'{"id": "m-system", "messages": [{"role": "system", "content": "be nice"}]}',  # ends with a system turn
    b'{"id": "m-blank", "messages": [{"role": "user", "content": "   "}]}',  # empty last user message
    b'{"id": "m-nul", "prompt": "a\\u0000b"}',  # NUL characters
    b'{"id": "m-utf8", "prompt": "caf\xe9"}',  # not UTF-8
    b'{"id": true, "prompt": "hi"}',  # id of the wrong type
    b'{"id": "", "prompt": "hi"}',  # empty id
    b'{"id": "syn-7-0000003", "prompt": "again"}',  # duplicate id
    b'{"id": "m-sharegpt", "conversations": [{"from": "alien", "value": "hi"}]}',  # unknown ShareGPT speaker
]


@pytest.fixture
def mixed_prompts(tmp_path: Path) -> Path:
    good = tmp_path / "good.jsonl"
    write_synthetic(good, 120, seed=7)
    lines = good.read_bytes().splitlines()
    path = tmp_path / "mixed.jsonl"
    body = []
    for index, line in enumerate(lines):
        body.append(line)
        if index % 7 == 6 and index // 7 < len(MALFORMED):
            body.append(MALFORMED[index // 7])  # after good rows 7, 14, ...: file rows 8, 16, ...
    path.write_bytes(b"\n".join(body) + b"\n")
    return path


def test_malformed_rows_abort_before_any_request_naming_rows(instant_fleet, tmp_path, mixed_prompts):
    fleet = instant_fleet(2)
    run_dir = tmp_path / "run"
    with pytest.raises(PreflightError) as failed:
        generate_here(run_dir, base_params(fleet, mixed_prompts))
    text = str(failed.value)
    assert "malformed rows" in text and "max_rejected_rate" in text
    assert "row 8: invalid JSON" in text
    rejected = pl.read_parquet(run_dir / "rejected.parquet")
    assert rejected.height == len(MALFORMED)
    assert not list((run_dir / "shards").glob("*.parquet"))
    chats = [truth for truth in fleet.truth() if truth["kind"] == "chat"]
    assert len(chats) <= 2 * 2  # only preflight's probe and canary per server: no prompt was sent


def test_malformed_rows_set_aside_and_the_rest_generated(instant_fleet, tmp_path, mixed_prompts):
    fleet = instant_fleet(2)
    run_dir = tmp_path / "run"
    assert (
        generate_here(run_dir, base_params(fleet, mixed_prompts, max_rejected_rate=0.5)).result.status
        == "complete"
    )
    assert_exactly_once(run_dir, valid_ids(mixed_prompts))
    assert len(valid_ids(mixed_prompts)) == 120
    rejected = pl.read_parquet(run_dir / "rejected.parquet")
    assert rejected.height == len(MALFORMED)
    reasons = " | ".join(rejected["reason"].to_list())
    for fragment in (
        "invalid JSON",
        "not an object",
        "no 'messages'",
        "must be a list",
        "is not an object",
        "unknown role",
        "must be a string",
        "empty conversation",
        "system turn",
        "last user message is empty",
        "NUL",
        "UTF-8",
        "'id' must be",
        "'id' is empty",
        "duplicate id",
        "unknown speaker",
    ):
        assert fragment in reasons, fragment
    assert rejected["row"].null_count() == 0 and rejected["raw"].null_count() == 0


def test_bad_parameters_are_all_named_before_a_kernel_starts(tmp_path):
    result = draftgen_run(
        tmp_path / "out",
        "params",
        {
            "servers": [],
            "concurrency_per_server": 0,
            "temperature": "hot",
            "maxtokens": 5,
            "shard": "5/2",
            "prompts": str(tmp_path / "nope.jsonl"),
        },
    )
    assert result.returncode == 2
    for name in ("servers", "concurrency_per_server", "temperature", "maxtokens", "shard", "prompts"):
        assert name in result.stderr
    assert "did you mean 'max_tokens'" in result.stderr
    assert not (tmp_path / "out" / "generate" / "params").exists()
