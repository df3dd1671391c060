"""An interrupted benchmark keeps its finished levels: a resumed run measures only what was lost.

Levels are saved the moment they finish; ``resume`` reuses one only when the server, the model, the sampling
and the exact prompts match, and a fresh run (``resume`` off) discards what an earlier one left.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bench_helpers import URL, facts, record

from draftgen.bench.checkpoint import LevelStore, level_identity
from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.records import LevelRun, RequestRecord, ServerFacts
from draftgen.bench.report import build_report
from draftgen.bench.run import run_benchmark
from draftgen.client.metrics import CounterWindow
from draftgen.prompts.rows import PromptRow
from draftgen.runner import plan_run

ROOT = Path(__file__).resolve().parents[1]


# ----- the store, without servers -------------------------------------------------------------------------------
def _facts(**changes: object) -> ServerFacts:
    return facts(index=1, **changes)


def _level(*, window: CounterWindow | None) -> LevelRun:
    ok = record(0, gpu=1, chunk_offsets=(0.5, 1.25, 2.0), response_id="r0", prompt_tokens=12)
    failed = RequestRecord(
        server=URL,
        gpu=1,
        concurrency=2,
        seq=1,
        prompt_id="p1",
        ok=False,
        error="HTTP 503",
        started_at=101.0,
        e2e_s=0.1,
        ttft_s=None,
        chunk_offsets=(),
    )
    return LevelRun(
        server=URL,
        gpu=1,
        concurrency=2,
        started_at=100.0,
        finished_at=103.0,
        requests=(ok, failed),
        metrics_window=window,
        metrics_note=None if window else "server has no /metrics",
        cumulative_accept_length=3.6,
        client_lag_ms=(0.1, 0.4),
    )


def _identity(**config_changes: object) -> dict:
    config = BenchmarkConfig(servers=[URL], model="m", **config_changes)  # type: ignore[arg-type]
    rows = [
        PromptRow(id=f"p{i}", messages=({"role": "user", "content": f"q{i}"},), row=i + 1) for i in range(2)
    ]
    return level_identity(_facts(), config, 2, rows)


def test_a_stored_level_reads_back_equal_and_marked_reused(tmp_path: Path) -> None:
    store = LevelStore(tmp_path / "levels")
    for window in (CounterWindow(seconds=3.0, deltas={"a_total": 5.0}, reset=("b_total",)), None):
        original = _level(window=window)
        store.save(_identity(), original)
        loaded, why = store.load(_identity(), gpu=1, concurrency=2)
        assert loaded is not None, why
        assert loaded.reused and not original.reused
        assert loaded == LevelRun(**{**original.__dict__, "reused": True})
    assert sorted(p.name for p in store.root.iterdir()) == ["gpu1-c2.json"]  # no partial file left behind


def test_a_level_measured_differently_is_not_reused_and_the_log_says_why(tmp_path: Path) -> None:
    store = LevelStore(tmp_path / "levels")
    store.save(_identity(), _level(window=None))
    loaded, why = store.load(_identity(temperature=0.7), gpu=1, concurrency=2)
    assert loaded is None and why == "gpu1-c2.json was measured with a different sampling"
    other_server = level_identity(
        _facts(version="0.5.9", max_running_requests=64),
        BenchmarkConfig(servers=[URL], model="m"),
        2,
        [
            PromptRow(id=f"p{i}", messages=({"role": "user", "content": f"q{i}"},), row=i + 1)
            for i in range(2)
        ],
    )
    loaded, why = store.load(other_server, gpu=1, concurrency=2)
    assert loaded is None
    assert why == "gpu1-c2.json was measured with a different server version, server max_running_requests"
    assert store.load(_identity(), gpu=1, concurrency=8) == (None, "not measured yet")
    store.path(1, 2).write_text('{"identity": {"format": 1')  # torn by hand: never by save()
    loaded, why = store.load(_identity(), gpu=1, concurrency=2)
    assert loaded is None and why.startswith("gpu1-c2.json is unreadable (JSONDecodeError")


def test_draftgen_run_resume_turns_on_resume_only_where_the_notebook_declares_it(tmp_path: Path) -> None:
    notebooks = ROOT / "notebooks"
    bench = plan_run(notebooks / "benchmark.ipynb", {}, name="r", out_root=tmp_path, resume=True)
    assert bench.parameters["resume"] is True
    fresh = plan_run(notebooks / "benchmark.ipynb", {}, name="r2", out_root=tmp_path)
    assert "resume" not in fresh.parameters
    generate = plan_run(notebooks / "generate.ipynb", {}, name="g", out_root=tmp_path, resume=True)
    assert "resume" not in generate.parameters


# ----- against a simulated server -------------------------------------------------------------------------------
async def _interrupted_after_first_level(config: BenchmarkConfig) -> None:
    """Run the benchmark and cancel it the moment its first level is on disk (as Ctrl-C or a crash would)."""
    levels = Path(config.out_dir) / "levels"
    task = asyncio.create_task(run_benchmark(config))
    while not task.done() and not list(levels.glob("*.json")):  # noqa: ASYNC110 (watching the disk)
        await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def _benchmark_rids(fleet) -> set[str]:  # type: ignore[no-untyped-def]
    """Streamed chats the simulator completed: benchmark requests (the one-token probe is not streamed; the
    interrupted run's cancelled requests end as aborts)."""
    return {
        r["rid"]
        for r in fleet.truth()
        if r.get("kind") == "chat" and r.get("stream") and r["outcome"] == "ok"
    }


def test_a_resumed_benchmark_measures_only_the_levels_it_lost(sim_fleet, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=20.0)
    settings = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "num_prompts": 6,
        "concurrencies": [2, 3],
        "max_tokens": 256,
        "warmup_requests": 0,
        "out_dir": str(tmp_path),
    }
    asyncio.run(_interrupted_after_first_level(BenchmarkConfig(**settings)))  # type: ignore[arg-type]
    saved = json.loads((tmp_path / "levels" / "gpu0-c2.json").read_text())
    assert not (tmp_path / "levels" / "gpu0-c3.json").exists()
    first_rids = {r["response_id"] for r in saved["level"]["requests"]}
    before = _benchmark_rids(fleet)
    capsys.readouterr()

    run = asyncio.run(run_benchmark(BenchmarkConfig(**settings, resume=True)))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    reused, measured = run.levels
    assert (reused.concurrency, reused.reused, measured.concurrency, measured.reused) == (2, True, 3, False)
    assert {r.response_id for r in reused.requests} == first_rids
    new = _benchmark_rids(fleet) - before
    assert new == {r.response_id for r in measured.requests} and len(new) == 6  # c=2 was not sent again
    assert "c=2: 6/6 ok" in out and "(reused: measured by an earlier run)" in out
    assert "c=3: measuring (not measured yet)" in out
    report = build_report(run)
    assert report.results["reused"].to_list() == [True, False]
    assert any("GPU 0 c=2" in w and "reused" in w for w in report.warnings)
    assert not any("c=3" in w and "reused" in w for w in report.warnings)

    # Different sampling: the stored levels no longer stand in, and the log names the difference.
    changed = asyncio.run(run_benchmark(BenchmarkConfig(**{**settings, "temperature": 0.7}, resume=True)))  # type: ignore[arg-type]
    assert [level.reused for level in changed.levels] == [False, False]
    assert "c=2: measuring (gpu0-c2.json was measured with a different sampling)" in capsys.readouterr().out

    # A fresh run (resume off) discards what an earlier run stored, then saves its own levels.
    stale = tmp_path / "levels" / "gpu0-c99.json"
    stale.write_text("{}")
    fresh = asyncio.run(run_benchmark(BenchmarkConfig(**settings)))  # type: ignore[arg-type]
    assert [level.reused for level in fresh.levels] == [False, False]
    assert "discarded (resume=False)" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "levels").iterdir()) == ["gpu0-c2.json", "gpu0-c3.json"]
