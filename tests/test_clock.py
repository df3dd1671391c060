"""The hardware clock: against ``draftgen sim --speed X`` reports state the simulated GPU's times and rates,
converted exactly once; raw wall-clock figures stay in the data files; real servers are left as they are."""

from __future__ import annotations

import asyncio
import json

import polars as pl
import pytest
from aiohttp import web
from bench_helpers import URL, clock_kept, facts, lag_share, record, sim_clocks, truth_by_level
from sim_helpers import serve

from draftgen.bench.config import BenchmarkConfig
from draftgen.bench.records import BenchmarkRun, LevelRun
from draftgen.bench.report import build_report, save_report
from draftgen.bench.run import run_benchmark
from draftgen.client.clock import WALL, HardwareClock, clock_from_sim_info, fleet_clock, on_clock, read_clock
from draftgen.client.server import ServerClient
from draftgen.estimate.config import EstimateConfig
from draftgen.estimate.inputs import load_benchmark
from draftgen.estimate.plan import run_estimate
from draftgen.estimate.report import estimate_json

STEP_S = 0.1  # records below: one chunk of 4 tokens every 0.1 wall-clock seconds
SLOW, FAST = 2.0, 8.0  # two simulator speeds, 4× apart


# ----- the clock itself ------------------------------------------------------------------------------------------
def test_sim_info_names_the_hardware_and_anything_else_is_the_wall_clock():
    clock = clock_from_sim_info({"profile": {"name": "b200-mtp"}, "speed": 5.0})
    assert (clock.factor, clock.hardware, clock.simulated) == (5.0, "B200", True)
    assert clock.seconds(2.0) == 10.0 and clock.rate(1000.0) == 200.0
    assert clock.per_gpu == "per simulated B200"
    assert "×5" in clock.note and "÷5" in clock.note
    assert clock_from_sim_info({"profile": {"name": "rtx-pro-6000"}, "speed": 2}).hardware == "RTX PRO 6000"
    instant = {"profile": {"name": "instant", "instant": True}, "speed": 5.0}  # no hardware simulated
    for not_sim in (None, {"detail": "Not Found"}, {"profile": {"name": "x"}, "speed": 0}, [1, 2], instant):
        assert clock_from_sim_info(not_sim) == WALL
    assert WALL.note == "" and WALL.per_gpu == "per GPU" and not WALL.simulated
    assert HardwareClock.from_dict(clock.as_dict()) == clock
    assert HardwareClock.from_dict(None) == WALL  # files written before clocks were recorded
    with pytest.raises(ValueError, match="positive"):
        HardwareClock.from_dict({"factor": -1})


def test_a_fleet_on_mixed_clocks_stays_on_the_wall_clock_and_says_why():
    b200 = clock_from_sim_info({"profile": {"name": "b200-mtp"}, "speed": 5.0})
    assert fleet_clock([b200, b200]) == (b200, "")
    clock, warning = fleet_clock([b200, WALL])
    assert clock == WALL and "different clocks" in warning
    assert fleet_clock([]) == (WALL, "")


def test_on_clock_scales_durations_and_rates_and_nothing_else():
    frame = pl.DataFrame(
        {
            "output_tok_s": [1000.0],
            "per_server_tok_s_mean": [500.0],
            "requests_per_s": [2.0],
            "window_s": [10.0],
            "ttft_s_p50": [0.1],
            "itl_s_p90": [0.02],
            "median_latency_s": [4.0],
            "output_tokens": [10_000],
            "accept_length": [3.6],
            "client_lag_ms_p99": [3.0],
            "started_at": [1e9],
            "wall_clock_s": [10.0],
        }
    )
    clock = HardwareClock(4.0, "B200")
    row = on_clock(frame, clock).row(0, named=True)
    assert row == {
        "output_tok_s": 250.0,
        "per_server_tok_s_mean": 125.0,
        "requests_per_s": 0.5,
        "window_s": 40.0,
        "ttft_s_p50": 0.4,
        "itl_s_p90": 0.08,
        "median_latency_s": 16.0,
        "output_tokens": 10_000,
        "accept_length": 3.6,
        "client_lag_ms_p99": 3.0,  # the client's own lateness is a wall-clock fact
        "started_at": 1e9,
        "wall_clock_s": 10.0,
    }
    assert on_clock(frame, WALL) is frame


# ----- benchmark → estimate, without servers: the factor is applied once ------------------------------------
def _level(concurrency: int, chunks: int) -> LevelRun:
    """``3 × concurrency`` requests in waves of ``concurrency``, a 4-token chunk every STEP_S."""
    duration = chunks * STEP_S
    requests = [
        record(
            i,
            concurrency=concurrency,
            started_at=100.0 + (i // concurrency) * duration,
            e2e_s=duration,
            ttft_s=STEP_S,
            chunk_offsets=tuple(STEP_S * (k + 1) for k in range(chunks)),
            completion_tokens=4 * chunks,
        )
        for i in range(3 * concurrency)
    ]
    return LevelRun(
        server=URL,
        gpu=0,
        concurrency=concurrency,
        started_at=100.0,
        finished_at=100.0 + 3 * duration,
        requests=tuple(requests),
        metrics_window=None,
        metrics_note=None,
        cumulative_accept_length=None,
        client_lag_ms=(0.1,),
    )


def _benchmark(tmp_path, name: str, factor: float, hardware: str | None):  # type: ignore[no-untyped-def]
    run = BenchmarkRun(
        config=BenchmarkConfig(
            servers=[URL], model="m", concurrencies=[1, 4], max_tokens=256, out_dir=str(tmp_path / name)
        ),
        servers=(facts(clock_factor=factor, hardware=hardware),),
        levels=(_level(1, 20), _level(4, 20)),
        sample_size=12,
        sample_rows_read=12,
        sample_rejected=0,
        started_at=100.0,
        finished_at=200.0,
    )
    report = build_report(run)
    save_report(report, tmp_path / name)
    return report, tmp_path / name


def test_benchmark_reports_on_the_sim_clock_keeps_raw_files_and_the_estimate_converts_once(tmp_path):
    real, real_dir = _benchmark(tmp_path, "real", 1.0, None)
    sim, sim_dir = _benchmark(tmp_path, "sim", 4.0, "B200")

    # Data files: the same raw wall-clock numbers, the factor beside them.
    raw_real, raw_sim = (
        pl.read_parquet(real_dir / "results.parquet"),
        pl.read_parquet(sim_dir / "results.parquet"),
    )
    assert raw_sim["output_tok_s"].to_list() == raw_real["output_tok_s"].to_list()
    assert raw_real["output_tok_s"].to_list()[0] == pytest.approx(4 / STEP_S)  # 40 tok/s alone, wall clock
    assert raw_sim["clock_factor"].to_list() == [4.0, 4.0]
    assert raw_real["clock_factor"].to_list() == [1.0, 1.0]
    summary = json.loads((sim_dir / "benchmark.json").read_text())
    assert summary["clock"]["factor"] == 4.0 and summary["clock"]["hardware"] == "B200"

    # What a person reads: real servers untouched, the simulator's figures ÷ 4 (tok/s) and × 4 (seconds).
    assert real.clock == WALL and real.results_on_clock.equals(real.results)
    assert real.fleet["per_server_tok_s_mean"].to_list() == raw_real["output_tok_s"].to_list()
    assert sim.fleet["per_server_tok_s_mean"].to_list() == pytest.approx(
        [v / 4 for v in raw_sim["output_tok_s"].to_list()]
    )
    assert sim.fleet["e2e_s_p50"].to_list() == pytest.approx(
        [v * 4 for v in real.fleet["e2e_s_p50"].to_list()]
    )
    assert sim.recommendation.knee == real.recommendation.knee
    assert sim.recommendation.knee_tok_s == pytest.approx(real.recommendation.knee_tok_s / 4)
    assert "simulated B200 clock" in sim.recommendation.reason
    assert "clock" not in real.recommendation.reason

    # The estimate converts at load, once: rates ÷ 4, wall time × 4, dollars × 4.
    assert load_benchmark(sim_dir).occupancy["seconds"].sum() == pytest.approx(
        4 * load_benchmark(real_dir).occupancy["seconds"].sum()
    )
    common = {
        "dataset_size": 5000,
        "gpus": 7,
        "concurrency_per_server": 4,
        "max_tokens": 256,
        "bootstrap": 10,
    }
    e_real = run_estimate(EstimateConfig(benchmark_dir=str(real_dir), out_dir=str(tmp_path / "er"), **common))
    e_sim = run_estimate(EstimateConfig(benchmark_dir=str(sim_dir), out_dir=str(tmp_path / "es"), **common))
    assert e_sim.production.tok_s_per_gpu == pytest.approx(e_real.production.tok_s_per_gpu / 4, rel=1e-6)
    assert e_sim.production.wall_time_s == pytest.approx(4 * e_real.production.wall_time_s, rel=1e-6)
    assert e_sim.production.cost_usd == pytest.approx(4 * e_real.production.cost_usd, rel=1e-6)
    assert estimate_json(e_sim)["clock"]["hardware"] == "B200"
    assert any("simulated B200" in note for note in e_sim.notes)
    assert not any("clock" in note for note in e_real.notes)


def test_a_scenario_prices_its_own_number_of_prompts(tmp_path):
    _, folder = _benchmark(tmp_path, "sim", 4.0, "B200")
    scenarios = [
        {"name": "big", "gpus": 7, "num_prompts": 914_000},
        {"name": "big at 1", "gpus": 7, "num_prompts": 914_000, "concurrency_per_server": 1},
    ]
    estimate = run_estimate(
        EstimateConfig(
            benchmark_dir=str(folder),
            dataset_size=2000,
            turns="last",  # one request per prompt: the set is 2,000 requests
            gpus=7,
            concurrency_per_server=4,
            max_tokens=256,
            bootstrap=10,
            scenarios=scenarios,  # type: ignore[arg-type]
            out_dir=str(tmp_path / "e"),
        )
    )
    big, big_c1 = estimate.scenarios
    assert (estimate.production.num_prompts, big.num_prompts) == (2000, 914_000)
    assert big.wall_time_s == pytest.approx(estimate.production.wall_time_s * 457, rel=0.05)
    assert big_c1.wall_time_s / big.wall_time_s == pytest.approx(
        estimate.concurrency_1.wall_time_s / estimate.production.wall_time_s, rel=0.1
    )
    assert estimate.table()["requests"].to_list() == [2000, 2000, 914_000, 914_000]


# ----- live: the simulator at two speeds, and a server that is not the simulator --------------------------------
def _measure(url: str, out_dir) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    config = BenchmarkConfig(
        servers=[url],
        model="Qwen/Qwen3.6-27B",
        concurrencies=[1, 4],
        rounds=4.0,  # 8 requests alone (the least a level sends), 16 at 4 in flight: a window of seconds
        max_tokens=512,  # requests of seconds: the client's own per-request wall-clock overhead stays small
        warmup_requests=1,
        out_dir=str(out_dir),
    )
    report = build_report(asyncio.run(run_benchmark(config)))
    save_report(report, out_dir)
    return report


@pytest.mark.timing
def test_benchmarks_at_two_speeds_report_the_same_simulated_b200(sim_fleet, tmp_path):
    """Each report shows the simulator's own (wall-clock) truth ÷ its speed, so both read as one B200, and the raw
    file keeps the wall clock's figure exactly (levels of a few seconds: within 10%, plus the client's measured
    lateness as a share of the level's window).

    Across speeds 2 and 8 the figures agree within 30% once each is put back on the simulator's own clock: on a
    busy machine a sped-up simulator runs late (more so the faster it goes), and it measures by how much
    (``/sim/info`` clock_kept), so the comparison divides that out. A conversion missed or applied twice would be
    4× off.
    """
    fleets = {
        SLOW: sim_fleet(profile="b200-mtp", speed=SLOW),
        FAST: sim_fleet(profile="b200-mtp", speed=FAST),
    }
    shown: dict[float, dict[int, float]] = {}
    kept: dict[float, float] = {}
    for speed, fleet in fleets.items():
        before = sim_clocks(fleet)
        report = _measure(fleet.urls[0], tmp_path / f"s{speed:g}")
        kept[speed] = clock_kept(before, sim_clocks(fleet))
        assert (report.clock.factor, report.clock.hardware) == (speed, "B200")
        truth = truth_by_level(fleet.truth(), report.requests)
        shown[speed] = {}
        for row in report.fleet.iter_rows(named=True):
            c = row["concurrency"]
            raw_row = report.results.filter(pl.col("concurrency") == c).row(0, named=True)
            real_wall = truth[(fleet.urls[0], c)]["output_tok_s"]
            margin = 0.10 + lag_share(raw_row)
            assert row["per_server_tok_s_mean"] == pytest.approx(real_wall / speed, rel=margin), (speed, c)
            assert raw_row["output_tok_s"] == pytest.approx(speed * row["per_server_tok_s_mean"])
            shown[speed][c] = row["per_server_tok_s_mean"]
    on_own_clock = {speed: {c: v / kept[speed] for c, v in levels.items()} for speed, levels in shown.items()}
    for c in (1, 4):
        assert 1 / 1.3 < on_own_clock[FAST][c] / on_own_clock[SLOW][c] < 1.3, (c, shown, kept)
    # one request alone on a B200 + MTP: ~250 tok/s, less its ramp
    assert 150 < on_own_clock[SLOW][1] <= 250 * 1.05, (shown, kept)
    common = {
        "dataset_size": 10_000,
        "gpus": 7,
        "concurrency_per_server": 4,
        "max_tokens": 512,
        "bootstrap": 10,
    }
    e_slow = run_estimate(
        EstimateConfig(benchmark_dir=str(tmp_path / f"s{SLOW:g}"), out_dir=str(tmp_path / "e_slow"), **common)
    )
    e_fast = run_estimate(
        EstimateConfig(benchmark_dir=str(tmp_path / f"s{FAST:g}"), out_dir=str(tmp_path / "e_fast"), **common)
    )
    # The estimate reads each level's clock_kept from results.parquet: its figures are on the simulator's own clock.
    rate_ratio = e_fast.production.tok_s_per_gpu / e_slow.production.tok_s_per_gpu
    days_ratio = e_fast.production.days / e_slow.production.days
    assert 1 / 1.3 < rate_ratio < 1.3 and 1 / 1.3 < days_ratio < 1.3, (rate_ratio, days_ratio, kept)
    assert e_slow.production.tok_s_per_gpu == pytest.approx(
        shown[SLOW][4], rel=0.25
    )  # the fit, on the same clock


def test_a_server_that_is_not_the_simulator_is_on_the_wall_clock():
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)

    async def clock_of(url: str) -> HardwareClock:
        async with ServerClient(url) as client:
            return await read_clock(client)  # /sim/info: 404

    assert serve(app, clock_of) == WALL
