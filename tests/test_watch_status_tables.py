"""monitor.ipynb's status section: draftgen status's reading as formatted tables (units, separators, no dtype row),
the same figures the command prints as text."""

from __future__ import annotations

import json
import os
import re
import socket
import time

from draftgen.watch import monitor
from draftgen.watch.status import run_status


def progress(**changes: object) -> dict:
    now = time.time()
    doc = {
        "state": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "heartbeat_at": now,
        "interval_s": 5.0,
        "conversations": {"total": 10_000, "done": 1_234, "failed": 2, "session_done": 1_000},
        "turns": {"done": 3_000, "total": 24_000, "session_done": 2_500},
        "rate": {"window_s": 60.0, "conversations_per_s": 0.5, "tok_s": 12_345.6},
        "trained_tokens": 4_567_890,
        "session_started_at": now - 1000,
        "eta_s": 17_540.0,
        "guard": {"window_rates": {"truncated": 0.2}, "max_rates": {"truncated": 0.5}, "seen": 1_500},
        "clock": {"factor": 5.0, "hardware": "B200"},
        "servers": [
            {
                "label": ":30000",
                "up": True,
                "in_flight": 64,
                "completed": 1_600,
                "tok_s": 6_000.0,
                "mean_accept_window": 3.5123,
                "mean_accept": 3.55,
                "errors": 0,
                "cached_tokens": 30_000,
                "cache_prompt_tokens": 120_000,
            },
            {
                "label": ":30001",
                "up": False,
                "in_flight": 0,
                "completed": 900,
                "tok_s": None,
                "mean_accept_window": None,
                "mean_accept": 3.4,
                "errors": 3,
            },
        ],
        "events": [{"at": now - 5, "server": ":30001", "what": "connection refused: marked down"}],
        "cache_by_turn": [[50_000, 0], [70_000, 30_000]],
    }
    doc.update(changes)
    return doc


def page_text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def test_the_status_is_tables_with_units_and_no_dtype_row(tmp_path):
    (tmp_path / "progress.json").write_text(json.dumps(progress()))
    view = monitor.status(tmp_path)
    page = view._repr_html_()
    assert "<pre>" not in page.split("dg-log")[0]  # figures and servers are tables, not printed text
    assert page.count("<table>") == 2
    words = page_text(page).split()
    assert not {"i64", "f64", "str", "bool"} & set(words) and "shape:" not in page
    assert ">RUNNING<" in page and "heartbeat" in page
    # the run's figures: thousands separators, rates on the simulated clock (÷5), units in the labels
    for shown in (
        "1,234 of 10,000 (12.3%)",
        "2,469",
        "rate (conversations/s)",
        "0.10",
        "4,567,890",
        "5.0 min",
        "in 4.9 h, at ",
    ):
        assert shown in page, shown
    assert "guard: truncated" in page and "20.0% (halts above 50%)" in page
    # the servers: one row each, headers with units, numbers formatted, a missing figure a dash
    headers = re.findall(r"<th[^>]*>([^<]+)</th>", page)
    assert headers[-9:] == [
        "server",
        "state",
        "in flight",
        "requests answered",
        "completion tok/s",
        "acceptance (rate window)",
        "acceptance (session)",
        "errors",
        "prompt tokens from its prefix cache",
    ]
    rows = re.findall(r"<tr>(<td.*?)</tr>", page.split("Servers")[1])
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in rows]
    assert cells == [
        [":30000", "up", "64", "1,600", "1,200", "3.51", "3.55", "0", "25.0%"],
        [":30001", "DOWN", "0", "900", "–", "–", "3.40", "3", "–"],
    ]
    # the share over every answer that said, and per turn index over the stored conversations
    cache = page_text(page).split("prefix cache", 1)[1]
    assert cache.startswith(" 25.0% of prompt tokens from the servers") and "1st 0.0%, 2nd 42.9%" in cache
    assert "<b>Last events</b>" in page and "connection refused: marked down" in page


def test_the_status_reads_the_same_as_draftgen_status(tmp_path):
    (tmp_path / "progress.json").write_text(json.dumps(progress()))
    text = str(monitor.status(tmp_path))
    _, command = run_status(tmp_path)
    assert "1,234 / 10,000 conversations" in command and "1,234 of 10,000 (12.3%)" in text
    assert "2,469 completion tok/s" in command and re.search(r"completion tok/s +2,469", text)
    assert re.search(r":30001 +DOWN +0 +900 +– +– +3\.40 +3", text), text


def test_a_run_without_progress_json_shows_its_manifest_counts(tmp_path):
    manifest = {
        "status": "complete",
        "counts": {"done": 1_500, "failed": 1, "rejected": 2},
        "prompts": {"valid": 2_000},
    }
    (tmp_path / "manifest.json").write_text(
        json.dumps(manifest | {"shards": [1, 2], "updated_at": time.time()})
    )
    page = monitor.status(tmp_path)._repr_html_()
    assert ">FINISHED<" in page and "1,500 of 2,000 (75.0%)" in page and "figures from manifest.json" in page
