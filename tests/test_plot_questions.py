"""The plots a reader could misread, checked on their Figure: titled with their question, axes with units, acceptance
over time against the run's mean and its interval on an axis from 1, turns counted per turn where max_tokens
applies (a conversation's last turn does not stand for its others)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import polars as pl
import pytest
from matplotlib.patches import Polygon, Rectangle
from validate_helpers import clean_rows, write_generation

from draftgen.generate import report as generate_report
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.params import build_config
from draftgen.rundir.layout import HISTORY, SHARDS
from draftgen.server_settings import ServerSettings
from draftgen.tune import verdict_report
from draftgen.tune.config import Candidate
from draftgen.tune.verdict_report import Point, Ranking, Verdict
from draftgen.validate import report as validate_report
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import validate_generation
from draftgen.watch import monitor

matplotlib.use("Agg")  # validate's plots draw through pyplot


@pytest.fixture(autouse=True)
def _close_pyplot_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def vertical_lines(axes) -> list[float]:  # type: ignore[no-untyped-def]
    return [line.get_xdata()[0] for line in axes.lines if len(set(line.get_xdata())) == 1]


# ----- validate ---------------------------------------------------------------------------------------------
def validated(tmp_path: Path, tokenizer_dir: Path, tokenizer, rows: str, parameters: dict):  # type: ignore[no-untyped-def]
    folder = write_generation(tmp_path / "gen", clean_rows(30))
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(manifest | {"parameters": parameters}))
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(folder),
            "tokenizer": str(tokenizer_dir),
            "out_dir": str(tmp_path / "out"),
            "train_max_length": 512,
            "holdout_share": 0.0,
            "rows": rows,
        },
    )
    return validate_generation(config, tokenizer=tokenizer, progress=False)


def test_validate_marks_max_tokens_on_the_per_turn_mask_sums_only(tmp_path, tokenizer_dir, tokenizer):
    result = validated(tmp_path, tokenizer_dir, tokenizer, "per_turn", {"max_tokens": 4096})
    axes = validate_report.plot_mask_sums(result)
    assert axes.get_title() == "How many tokens does each sample's loss mask supervise?"
    assert "supervised tokens per sample, one generated turn each" in axes.get_xlabel()
    assert 4096 in vertical_lines(axes) and axes.get_xlim()[1] > 4096
    assert any(text.get_text() == "max_tokens 4,096 (caps each turn)" for text in axes.texts)
    whole = validated(tmp_path / "conv", tokenizer_dir, tokenizer, "per_conversation", {"max_tokens": 4096})
    axes = validate_report.plot_mask_sums(whole)
    assert "one conversation each" in axes.get_xlabel() and 4096 not in vertical_lines(axes)


def test_validate_reads_each_arms_max_tokens(tmp_path):
    plan = [{"name": "short", "share": 0.5, "max_tokens": 1024}, {"name": "rest", "share": 0.5}]
    result = SimpleNamespace(
        output=SimpleNamespace(manifests=[{"parameters": {"max_tokens": 4096, "sampling_plan": plan}}, None])
    )
    assert validate_report.max_tokens_caps(result) == [1024, 4096]  # type: ignore[arg-type]
    plan[1]["max_tokens"] = 2048  # every arm sets its own: the run's own caps nothing
    assert validate_report.max_tokens_caps(result) == [1024, 2048]  # type: ignore[arg-type]


def test_validate_yield_is_titled_with_its_question(tmp_path, tokenizer_dir, tokenizer):
    result = validated(tmp_path, tokenizer_dir, tokenizer, "per_turn", {})
    axes = validate_report.plot_yield(result)
    assert axes.get_title().startswith("How much of what the GPUs generated trains the drafter? ")
    assert axes.get_xlabel() == "% of the tokens the target generated"
    empty = SimpleNamespace(counts={"yield": {"buckets": {}, "generated_tokens": 0, "share": None}})
    title = validate_report.plot_yield(empty).get_title()  # type: ignore[arg-type]
    assert title == "How much of what the GPUs generated trains the drafter? (no tokens generated)"


# ----- tune's verdict ---------------------------------------------------------------------------------------
def verdict() -> Verdict:
    mtp = Candidate(1000, ServerSettings(max_running_requests=64), 64)
    eagle = Candidate(1001, ServerSettings(speculative_algorithm="EAGLE3", max_running_requests=64), 64)
    points = tuple(
        Point(
            c, level, tok, tok * 0.97, tok * 1.03, accept, accept - 0.05, accept + 0.05, "sglext", 200, None
        )
        for c, base, accept in ((mtp, 1000.0, 3.55), (eagle, 1100.0, 3.62))
        for level, tok in ((1, base / 10), (8, base / 2), (64, base))
    )
    run = SimpleNamespace(candidates=(mtp, eagle), config=SimpleNamespace(interval=0.9))
    return Verdict(run, points, 64, 1, Ranking(None, ()), Ranking(None, ()), (), (), None, 7, 1_000_000, 6.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "title", "bottom"),
    [
        ("tok_s_per_gpu", "Which candidate makes the most output tok/s per GPU at each concurrency?", 0.0),
        ("accept_length", "What acceptance length does each candidate reach at each concurrency?", 1.0),
    ],
)
def test_the_verdicts_plots_ask_their_question_on_an_honest_axis(value, title, bottom):
    (axes,) = verdict_report.plot_verdict(verdict(), value).axes
    assert axes.get_title() == f"{title} (90% intervals)"
    assert axes.get_xlabel() == "requests in flight per server"
    assert axes.get_ylim()[0] == bottom  # not zoomed onto the points: a 2% gap is drawn as one
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["1", "8", "64"]
    assert vertical_lines(axes) == [64]  # the production concurrency


# ----- monitor ----------------------------------------------------------------------------------------------
def write_history(folder: Path) -> float:
    """Two servers, 40 lines 5 s apart, acceptance about 3.6 with a wobble; returns the request-weighted mean."""
    lines, sums, counts = [], [0.0, 0.0], [0, 0]
    for step in range(40):
        servers = {}
        for index in (0, 1):
            n = 4 + (step + index) % 3
            sums[index] += n * (3.6 + 0.02 * ((step * (index + 1)) % 5 - 2))
            counts[index] += n
            servers[f"http://127.0.0.1:{30000 + index}"] = [
                counts[index],
                400 * step,
                sums[index],
                counts[index],
                8,
                True,
            ]
        lines.append(
            json.dumps({"t": 1000.0 + 5 * step, "session": 1.0, "done": 10 * step, "servers": servers})
        )
    (folder / HISTORY).write_text("\n".join(lines) + "\n")
    # the first line of each server is where its deltas start
    first = sum(4 + index % 3 for index in (0, 1))
    first_sum = sum((4 + index % 3) * (3.6 + 0.02 * (0 - 2)) for index in (0, 1))
    return (sum(sums) - first_sum) / (sum(counts) - first)


def test_monitor_draws_acceptance_against_the_runs_mean_and_interval_from_one(tmp_path):
    mean = write_history(tmp_path)
    figure = monitor.plot_throughput_and_acceptance(tmp_path, bins=20).figure
    top, bottom = figure.axes[:2]
    assert top.get_title().startswith("How fast is each server producing tokens")
    assert top.get_ylabel() == "completion tok/s (wall clock)"
    assert bottom.get_xlabel() == "time since the history began (s)"
    (line,) = [line for line in bottom.lines if line.get_label().startswith("run mean")]
    assert line.get_ydata()[0] == pytest.approx(mean)
    (band,) = [p for p in bottom.patches if isinstance(p, (Polygon, Rectangle))]
    low, high = band.get_extents().transformed(bottom.transData.inverted()).intervaly
    assert low < mean < high
    assert "95% interval" in line.get_label()
    assert bottom.get_ylim()[0] == 1.0  # from "no draft accepted": a ±1% wobble is drawn as one


# ----- generate's finish reasons ----------------------------------------------------------------------------
def test_finish_reasons_count_every_generated_turn(tmp_path):
    (tmp_path / SHARDS).mkdir()
    rows = pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "finish_reason": ["stop", "stop", "length"],  # a row's own: its last turn's
            "turn_finish_reason": [
                ["length", "stop"],
                ["stop", "stop", "stop"],
                None,
            ],  # c: one turn, older shard
        },
        schema={name: OUTPUT_SCHEMA[name] for name in ("id", "finish_reason", "turn_finish_reason")},
    )
    rows.write_parquet(tmp_path / SHARDS / "part-000000.parquet")
    counts = dict(generate_report.finish_reasons(tmp_path).select("finish_reason", "turns").iter_rows())
    assert counts == {"stop": 4, "length": 2}  # a's first turn was cut, though the row ended with "stop"
    (axes,) = generate_report.plot_finish_reasons(tmp_path).figure.axes
    assert axes.get_title() == "How did the generated turns end (stop = finished, length = hit max_tokens)?"
    assert axes.get_ylabel() == "generated turns"
    assert [bar.get_height() for bar in axes.patches] == [4, 2]
