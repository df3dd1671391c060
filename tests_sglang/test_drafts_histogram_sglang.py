"""Every stored turn carries SGLang's drafts histogram, checked against the server's own counters.

SGLang 0.5.23 counts, per request, its verify steps by the drafts each accepted (``Req.update_spec_correct_drafts_
histogram``, the same count it adds to ``spec_num_correct_drafts``, beside ``spec_verify_ct += 1``), and adds each
finished request's ``spec_verify_ct`` to ``sglang:spec_verify_calls_total``. So for every answer the histogram
sums to its verify steps and its weighted sum is its accepted drafts, and over a run the counter grows by the sum
of every answer's verify steps (an answer with no verify step, its one token from prefill, has no spec details and
adds nothing). generate runs (no kernel: support/generate_rows.py) on the NGRAM and STANDALONE servers through
recording proxies, whole and streamed, over single-turn rows and a three-turn conversation; the test compares each
stored turn with the answer its server sent, and the counter over the run with every answer the proxies saw.

The designed hybrid's NEXTN run (mtp_runs.py) is checked exactly: each turn's histogram is the designed one.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from prompt_files import single_turn, three_turns, write_rows
from recording_proxy import Exchange, RecordingProxy
from test_mtp_server import designed
from tier_runs import SERVED_MODEL, metric

VERIFY = "sglang:spec_verify_calls_total"
DRAFT_TOKENS = 4  # both servers propose 3 drafts a verify step (NGRAM 4 draft tokens; STANDALONE 3/1/4)
SUPPORT = Path(__file__).resolve().parent / "support"


def grown(histogram) -> list[int]:  # type: ignore[no-untyped-def]
    """A histogram as SGLang grows it: as long as the most drafts a step accepted + 1."""
    counts = list(histogram)
    while counts and counts[-1] == 0:
        counts.pop()
    return counts


def spec_details(exchange: Exchange) -> tuple[dict | None, dict, str]:
    """(sglext.spec_tokens_details or None, usage, response id) of one chat answer, whole or streamed."""
    if not exchange.request_json().get("stream"):
        body = exchange.response_json()
        return (body.get("sglext") or {}).get("spec_tokens_details"), body["usage"], body["id"]
    details, usage, rid = None, None, None
    for event in exchange.sse_events():
        if event == "[DONE]":
            continue
        rid = rid or event.get("id")
        details = details or (event.get("sglext") or {}).get("spec_tokens_details")
        usage = usage or event.get("usage")
    return details, usage or {}, rid or ""


def run_generate(draftgen: str, servers: list[str], root: Path, stream: bool) -> dict:
    prompts = write_rows(root / "prompts.jsonl", single_turn("drafts", 5) + three_turns("drafts-multi", 1))
    params = {
        "servers": servers,
        "model": SERVED_MODEL,
        "prompts": str(prompts),
        "out_dir": str(root / "run"),
        "stream": stream,
        "turns": "all",
        "enable_thinking": False,  # the random model never closes </think>
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 12,
        "concurrency_per_server": 2,
        "max_truncated_rate": 1.0,  # it never stops before max_tokens either
        "canary": False,
        "hedge_slow_ratio": 0.0,  # every answer one server's: the stored turn is the answer its proxy saw
        "request_timeout_s": 300.0,
    }
    python = Path(draftgen).parent / "python"
    done = subprocess.run(
        [str(python), str(SUPPORT / "generate_rows.py"), json.dumps(params)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": ""},  # the tier's path (our sgl_kernel stand-in) is not draftgen's
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_every_stored_turn_carries_the_histogram_its_server_counted(draftgen, fleet, tmp_path, stream):
    upstream = {"ngram": fleet.ngram.url, "standalone": fleet.standalone.url}
    proxies = {name: RecordingProxy(url) for name, url in upstream.items()}
    try:
        urls = {name: proxy.start() for name, proxy in proxies.items()}
        before = {name: metric(url, VERIFY) for name, url in upstream.items()}
        report = run_generate(draftgen, list(urls.values()), tmp_path, stream)
        grew = {name: metric(url, VERIFY) - before[name] for name, url in upstream.items()}
        answers: dict[str, dict] = {}  # by response id: the server's own counts of each answer
        for name, proxy in proxies.items():
            verified = 0
            for exchange in proxy.chats():
                if exchange.status != 200:
                    continue  # refused (a probe's extra): no generation, nothing counted
                details, usage, rid = spec_details(exchange)
                if details is None:  # no verify step: its one token came from prefill
                    assert usage.get("completion_tokens") == 1, (name, exchange.request_json(), usage)
                    continue
                histogram = details["spec_correct_drafts_histogram"]
                assert sum(histogram) == details["spec_verify_ct"] > 0, (name, details)
                assert sum(k * n for k, n in enumerate(histogram)) == details["spec_num_correct_drafts"]
                assert histogram == grown(histogram) and len(histogram) <= DRAFT_TOKENS, histogram
                verified += details["spec_verify_ct"]
                answers[rid] = {"server": urls[name], **details}
            assert grew[name] == verified > 0, (name, grew, verified)  # SGLang's /metrics over the run
    finally:
        for proxy in proxies.values():
            proxy.stop()
    rows = report["rows"]
    assert len(rows) == 6 and sum(len(r["turn_after"]) for r in rows) == 5 + 3
    assert {s["url"] for s in report["servers"]} == set(urls.values())
    stored: Counter = Counter()
    for row in rows:
        turns = zip(row["turn_drafts_histogram"], row["turn_spec_verify_ct"], row["turn_server"], strict=True)
        for histogram, verify, server in turns:
            assert histogram is not None and sum(histogram) == verify, row
            stored[(server, tuple(histogram))] += 1
        # the last turn's answer, by its response id: exactly what its server counted
        mine = answers[row["response_id"]]
        assert mine["server"] == row["turn_server"][-1]
        assert row["turn_drafts_histogram"][-1] == mine["spec_correct_drafts_histogram"]
        assert row["turn_spec_verify_ct"][-1] == mine["spec_verify_ct"]
    sent = Counter((a["server"], tuple(a["spec_correct_drafts_histogram"])) for a in answers.values())
    assert not stored - sent, (stored, sent)  # every stored turn's histogram is one its server sent


def test_the_hybrids_nextn_turns_carry_the_designed_histogram(mtp_generate_run, models):
    """generate on the designed hybrid (NEXTN 3/1/4, thinking on, streamed, turns: all): every turn's histogram is
    the one the designed MTP head's misses make (tiny_qwen3_5.designed_verify_steps), as SGLang grows it."""
    from notebook_runs import stored_rows

    want = designed(str(models.hybrid), thinking=True)
    rows = stored_rows(mtp_generate_run.run_dir)
    assert rows.height > 0
    for row in rows.iter_rows(named=True):
        turns = len(row["turn_after"])
        assert row["turn_drafts_histogram"] == [grown(want.histogram)] * turns, row["id"]
        assert row["turn_spec_verify_ct"] == [want.verify_steps] * turns
