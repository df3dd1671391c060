"""The report machinery: the table formatter, the headline block, grouped checks, and report.html's shaping."""

from __future__ import annotations

import re

import polars as pl
import pytest

from draftgen.breakdown import breakdown, ratio_interval
from draftgen.display.checks import checks_html as grouped_html
from draftgen.display.checks import checks_text as grouped_text
from draftgen.display.checks import group_checks
from draftgen.display.headline import MARKER, Headline, Stat
from draftgen.display.notes import Log, Notes, Stack
from draftgen.display.report_html import final_text, headline_text, shape_notebook, shape_outputs
from draftgen.display.table import Column, Table, figures_table, format_value, label_for, spec_for, with_specs
from draftgen.generate.preflight import Check


# ----- values and column specs ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "kind", "digits", "shown"),
    [
        (1234567, "int", None, "1,234,567"),
        (250.127322, "tok_s", None, "250"),
        (12.34, "tok_s", None, "12.3"),
        (0.0412, "percent", None, "4.1%"),
        (0.0412, "percent", 2, "4.12%"),
        (1234.6, "usd", None, "$1,235"),
        (12.5, "usd", None, "$12.50"),
        (150.0, "duration", None, "2.5 min"),
        (1_500_000, "bytes", None, "1.5 MB"),
        (1.2345, "ratio", None, "1.23×"),
        (True, "bool", None, "yes"),
        (None, "number", None, "–"),
        (float("nan"), "number", None, "–"),
        (3.14159, "number", None, "3.14"),
        (31.4159, "number", None, "31.4"),
        (0.001234, "number", None, "0.001"),
        (12345.6, "number", None, "12,346"),
        (["a", "b"], "text", None, "a, b"),
        ("http://127.0.0.1:30000", "text", None, "http://127.0.0.1:30000"),
    ],
)
def test_format_value(value, kind, digits, shown):
    assert format_value(value, kind, digits) == shown


@pytest.mark.parametrize(
    ("name", "dtype", "kind", "label"),
    [
        ("output_tok_s", pl.Float64, "tok_s", "output tok/s"),
        ("ttft_s_p50", pl.Float64, "seconds", "TTFT p50 (s)"),
        ("truncated_rate", pl.Float64, "percent", "truncated rate"),
        ("share", pl.Float64, "percent", "share"),
        ("cost_usd", pl.Float64, "usd", "cost ($)"),
        ("completion_tokens", pl.Int64, "int", "completion tokens"),
        ("accept_length", pl.Float64, "number", "accept length"),
        ("server", pl.String, "text", "server"),
        ("reused", pl.Boolean, "bool", "reused"),
        ("tok_s_per_gpu", pl.Float64, "tok_s", "tok/s per GPU"),
    ],
)
def test_specs_from_names(name, dtype, kind, label):
    spec = spec_for(name, dtype)
    assert (spec.kind, spec.label) == (kind, label)
    assert label_for(name) == label


def test_a_bad_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="column 'x': kind 'money'"):
        Column("x", kind="money")


# ----- tables -----------------------------------------------------------------------------------------------
def frame(rows: int = 3, columns: int = 4) -> pl.DataFrame:
    data = {"server": [f"http://127.0.0.1:{30000 + i}" for i in range(rows)]}
    for c in range(columns):
        data[f"figure_{c}_tok_s"] = [1000.123456 * (i + 1) + c for i in range(rows)]
    return pl.DataFrame(data)


def test_a_table_has_no_dtype_row_no_shape_and_no_quotes():
    table = Table(frame(), note="on the wall clock")
    page = table._repr_html_()
    assert "shape:" not in page and "f64" not in page and "str" not in re.sub(r"<[^>]+>", " ", page).split()
    assert "&quot;http" not in page and '"http' not in page
    assert "1,000" in page and "1000.123456" not in page
    assert "figure 0 tok/s" in page and "on the wall clock" in page
    text = str(table)
    assert text.splitlines()[0].split()[0] == "server" and "1,000" in text and "shape" not in text


def test_an_empty_table_is_the_sentence_saying_why():
    empty = Table(frame().clear(), empty="no router: each server is its own worker")
    assert "no router: each server is its own worker" in empty._repr_html_()
    assert "<table" not in empty._repr_html_()
    assert str(empty) == "no router: each server is its own worker"


def test_a_wide_single_row_is_turned_on_its_side():
    one = Table(frame(rows=1, columns=20), max_chars=80)
    (part,) = one.parts()
    headers, rows, _ = part
    assert headers == ["figure", "value"]
    assert len(rows) == 21 and rows[0] == ["server", "http://127.0.0.1:30000"]


def test_a_wide_table_is_split_with_its_keys_repeated_and_each_part_fits():
    wide = Table(frame(rows=4, columns=20), keys=("server",), max_chars=90)
    parts = wide.parts()
    assert len(parts) > 1
    shown = [h for headers, _, _ in parts for h in headers if h != "server"]
    assert shown == [f"figure {c} tok/s" for c in range(20)]  # every column once, in order
    for headers, rows, _ in parts:
        assert headers[0] == "server" and len(rows) == 4
        width = sum(
            max(max(len(w) for w in h.split()), *(len(r[i]) for r in rows)) + 3 for i, h in enumerate(headers)
        )
        assert width <= 90
    assert Table(frame(rows=4, columns=2), max_chars=90).parts()[0][0][0] == "server"  # narrow: whole


def test_column_specs_override_and_later_columns_still_show():
    data = frame(rows=2, columns=1).with_columns(pl.lit(0.25).alias("new_rate"))
    specs = with_specs(data, [Column("figure_0_tok_s", "tok/s per GPU", "tok_s", digits=1)], drop=("server",))
    headers, rows, _ = Table(data, specs).cells()
    assert headers == ["tok/s per GPU", "new rate"]
    assert rows[0] == ["1,000.1", "25.0%"]


def test_a_missing_column_is_named():
    with pytest.raises(KeyError, match="no column 'nope'"):
        Table(frame(), ["nope"]).cells()


def test_figures_table_formats_by_kind():
    table = figures_table([("requests", 1234, "int"), ("cut", 0.05, "percent"), ("path", "/tmp/x")])
    assert table.cells()[1] == [["requests", "1,234"], ["cut", "5.0%"], ["path", "/tmp/x"]]


# ----- notes, logs ------------------------------------------------------------------------------------------
def test_findings_are_sentences_not_reprs():
    none = Notes((), none="Nothing missing.")
    assert str(none) == "Nothing missing." and "[]" not in none._repr_html_()
    assert "'Nothing" not in none._repr_html_() and ">Nothing missing.<" in none._repr_html_()
    some = Notes(("server 0 sent no usage",), title="What the servers did not send")
    assert "<li>server 0 sent no usage</li>" in some._repr_html_()
    both = Stack((none, some))
    assert "Nothing missing." in both._repr_html_() and "server 0 sent no usage" in repr(both)


def test_a_long_log_keeps_its_last_lines_and_counts_the_rest():
    log = Log([f"event {i}" for i in range(100)], keep=5)
    assert str(log).splitlines()[0] == "events: 100 lines, the last 5:"
    assert str(log).splitlines()[-1] == "  event 99" and "event 94" not in str(log)
    page = log._repr_html_()
    assert "95 earlier events lines of 100" in page and "<details" in page


# ----- the headline block -----------------------------------------------------------------------------------
def test_the_headline_block_says_the_answer_in_html_and_text(tmp_path):
    block = Headline(
        step="validate",
        question="is the data fit to train on?",
        answer="2,300 of 2,383 rows exported",
        stats=[Stat("yield", "98.3%", "", "4.2M trained tokens"), Stat("tok/s", "1,284", "tok/s")],
        verdict="FAIL",
        reason="degenerate 6.0% > 5.0%",
        clock="on the simulated B200's clock",
        files=[("summary", tmp_path / "summary.json"), ("elsewhere", "/etc/hosts")],
        home=tmp_path,
    )
    page = block._repr_html_()
    assert f"{MARKER}='validate'" in page and ">FAIL<" in page and "98.3%" in page
    assert "href='summary.json'" in page and "href='file:///etc/hosts'" in page
    text = block.text().splitlines()
    assert text[0] == "validate: is the data fit to train on?"
    assert text[1] == "  FAIL — 2,300 of 2,383 rows exported"
    assert "  why: degenerate 6.0% > 5.0%" in text and "  yield: 98.3% (4.2M trained tokens)" in text
    assert "  clock: on the simulated B200's clock" in text


def test_a_headline_verdict_is_one_of_the_known():
    with pytest.raises(ValueError, match="verdict 'OK'"):
        Headline(step="x", question="q", answer="a", verdict="OK")


# ----- grouped checks ---------------------------------------------------------------------------------------
SERVERS = [f"http://127.0.0.1:{30000 + i}" for i in range(7)]


def preflight_checks(failing: dict[str, str] | None = None) -> list[Check]:
    failing = failing or {}
    checks = [Check("prompts", "synthetic", "ok", "2,000 valid of 2,000 rows read")]
    for name in ("healthy", "model", "engine", "batch cap"):
        for url in SERVERS:
            status = "fail" if (name, url) in failing else "ok"
            detail = failing.get((name, url), f"{name} fine")  # type: ignore[call-overload]
            checks.append(Check(name, url, status, detail))
    checks += [Check("canary", url, "ok", f"reasoning {100 + i} chars") for i, url in enumerate(SERVERS)]
    return checks


def test_seven_healthy_servers_are_one_row_per_check():
    rows = group_checks(preflight_checks())
    assert [(r.check, r.status, r.where) for r in rows] == [
        ("prompts", "ok", "synthetic"),
        ("healthy", "ok", "7/7 servers"),
        ("model", "ok", "7/7 servers"),
        ("engine", "ok", "7/7 servers"),
        ("batch cap", "ok", "7/7 servers"),
        ("canary", "ok", "7/7 servers"),
    ]
    assert rows[1].detail == "healthy fine"
    assert rows[-1].detail == "e.g. :30000: reasoning 100 chars"  # details differ: the first, named


def test_a_server_that_failed_keeps_its_own_row():
    failing = {("healthy", SERVERS[3]): "/health answered 503", ("model", SERVERS[3]): "serves other",
               ("model", SERVERS[5]): "serves other"}  # fmt: skip
    rows = group_checks(preflight_checks(failing))  # type: ignore[arg-type]
    healthy = [r for r in rows if r.check == "healthy"]
    assert [(r.status, r.where, r.detail) for r in healthy] == [
        ("ok", "6/7 servers", "healthy fine"),
        ("fail", ":30003", "/health answered 503"),
    ]
    model = [r for r in rows if r.check == "model"]
    assert [(r.status, r.where) for r in model] == [("ok", "5/7 servers"), ("fail", "2/7 servers")]
    text = grouped_text(preflight_checks(failing))  # type: ignore[arg-type]
    assert "FAIL  model      2/7 servers: :30003, :30005  serves other" in text
    assert len(text.splitlines()) == 8


def test_servers_that_passed_saying_different_things_are_each_shown():
    """Two engines in one fleet (vLLM and transformers serve): both engine rows stay, each naming its server; a
    figure that differs on every server (seven canaries) is one row with the first as example."""
    vllm, hf, third = "http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8002"
    checks = [
        Check("engine", vllm, "ok", "engine vllm 0.32.0"),
        Check("engine", hf, "ok", "engine openai-compatible; top_k/min_p not accepted: not sent"),
        Check("engine", third, "ok", "engine vllm 0.32.0"),
    ]
    rows = group_checks(checks)
    assert [(r.where, r.detail) for r in rows] == [
        ("2/3 servers", "engine vllm 0.32.0"),
        (":8001", "engine openai-compatible; top_k/min_p not accepted: not sent"),
    ]
    text = grouped_text(checks)
    assert "2/3 servers: :8000, :8002  engine vllm 0.32.0" in text
    assert "engine openai-compatible" in text and "engine openai-compatible" in grouped_html(checks)
    canaries = [Check("canary", url, "ok", f"reasoning {100 + i} chars") for i, url in enumerate(SERVERS)]
    assert [(r.where, r.detail) for r in group_checks(canaries)] == [
        ("7/7 servers", "e.g. :30000: reasoning 100 chars")
    ]


def test_preflight_shows_its_checks_grouped():
    from draftgen.generate.preflight import PreflightError

    error = PreflightError(preflight_checks({("engine", SERVERS[0]): "probe failed"}))  # type: ignore[dict-item]
    lines = str(error).splitlines()
    assert len(lines) == 1 + 6 + 1  # the first line, one row per check, the failed server's own row
    assert any("engine" in line and "6/7 servers" in line for line in lines)
    assert any(line.strip().startswith("FAIL") and ":30000" in line for line in lines)


# ----- report.html shaping ----------------------------------------------------------------------------------
BAR = "".join(f"\rgenerate: {p:3d}%|███ | {p * 20}/2000 [00:{p:02d}<00:10]" for p in range(0, 101, 10))


def test_a_progress_bar_keeps_its_final_line():
    assert final_text(BAR + "\n") == "generate: 100%|███ | 2000/2000 [00:100<00:10]\n"
    assert final_text("a\r\nb\x1b[A\n") == "a\nb\n"


def stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def test_streams_are_merged_and_redrawn_bars_collapse():
    pieces = [stream(f"\rgenerate: {p}%") for p in range(0, 101, 5)] + [stream("\ncomplete: 2,000 rows\n")]
    (shaped,) = shape_outputs(pieces)
    assert shaped["text"] == "generate: 100%\ncomplete: 2,000 rows\n"


def test_a_long_log_is_folded_to_its_last_lines_and_a_count():
    lines = [f"GPU 0 c={i}: ok" for i in range(40)]
    (shaped,) = shape_outputs([stream("\n".join(lines) + "\n")], keep=5)
    page = shaped["data"]["text/html"]
    assert "35 earlier output lines of 40" in page
    assert shaped["data"]["text/plain"].splitlines() == lines[-5:]


def notebook() -> dict:
    def cell(source: str, outputs: list[dict], tags: list[str] | None = None) -> dict:
        return {"cell_type": "code", "source": source, "metadata": {"tags": tags or []}, "outputs": outputs}

    block = {
        "output_type": "execute_result",
        "data": {"text/plain": "generate: done", "text/html": "<b>H</b>"},
    }
    return {
        "cells": [
            {"cell_type": "markdown", "source": "# generate", "metadata": {}},
            cell("run()", [stream(BAR)]),
            cell("headline()", [block], ["headline"]),
            cell("table()", [{"output_type": "display_data", "data": {"text/plain": "t"}}]),
        ]
    }


def test_the_headline_goes_first_and_once():
    nb = notebook()
    shaped = shape_notebook(nb)
    first = shaped["cells"][0]
    assert first["outputs"][0]["data"]["text/html"] == "<b>H</b>"
    assert shaped["cells"][1]["source"] == "# generate"
    assert shaped["cells"][3]["outputs"] == []  # not shown twice
    assert shaped["cells"][2]["outputs"][0]["text"].count("generate:") == 1
    assert nb["cells"][2]["outputs"]  # the executed notebook itself is left as it was
    assert headline_text(nb) == "generate: done"
    assert headline_text({"cells": []}) is None


# ----- the acceptance band ----------------------------------------------------------------------------------
def test_ratio_interval_matches_the_breakdown_tables():
    tokens = [100.0, 220.0, 330.0, 90.0, 400.0]
    verify = [30.0, 60.0, 100.0, 30.0, 100.0]
    mean, low, high = ratio_interval(tokens, verify)  # type: ignore[misc]
    table = breakdown(
        pl.DataFrame(
            {"g": ["a"] * 5, "completion_tokens": tokens, "verify_ct": verify, "latency_s": [1.0] * 5}
        ),
        "g",
    )
    assert mean == pytest.approx(sum(tokens) / sum(verify))
    assert (round(low, 3), round(high, 3)) == (table["accept_length_low"][0], table["accept_length_high"][0])
    assert ratio_interval([1.0], [0.0]) is None
