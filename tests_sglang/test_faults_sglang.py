"""Faults on real SGLang servers, through generate.ipynb run the production way.

* Hedging: the NGRAM server beside the STANDALONE one (the same random model, the same served name; STANDALONE runs
  a draft model too and answers at well under half the rate), with ``hedge_slow_ratio`` 0.9 so the slower one is
  hedged for sure at the tail. A hedged request's loser is cancelled by the client, and SGLang's own counter
  ``sglang:num_aborted_requests_total`` (incremented by its TokenizerManager when it aborts a request whose
  client went away) shows it. SGLang does not log such aborts at its default level, so its metrics are the witness.
  The run streams: SGLang notices a vanished client of a non-streamed request only every 4 s
  (SGLANG_REQUEST_STATE_WAIT_TIMEOUT), so a non-streamed loser that ends sooner is finished, not aborted.
* A request SGLang refuses: a prompt longer than the model's context gets a 400 with SGLang's message before it
  reaches the scheduler; it lands in failed.parquet with that message after one attempt (a 400 is never retried).
  The run is made without the trainer's cap (``train_max_length`` 0), which would set that prompt aside unsent.
  An empty ``messages`` list, the other refusal named in issue 18, cannot come out of generate (the prompt reader
  rejects an empty conversation into rejected.parquet before any request), so it is sent with draftgen's client
  directly and must be classified the same way: http 400, SGLang's message, not retryable.
* A server SIGKILLed mid-run: the run fails over to the other server and stores every id exactly once; serve's
  ``--restart`` brings the killed one back (test_serve_lifecycle.py checks serve's own report of that).
"""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from notebook_runs import assert_exactly_once, failed_rows, notebook_text
from prompt_files import ids_of
from tier_runs import HedgedRun, KilledRun, classify_refusal


def test_a_hedged_requests_loser_is_aborted_on_the_real_server(hedged_run: HedgedRun):
    run_dir, urls, aborted = hedged_run.run_dir, hedged_run.urls, hedged_run.aborted
    expected = [i for i in ids_of(hedged_run.prompts) if i != "too-long"]
    rows = assert_exactly_once(run_dir, expected)
    [session] = json.loads((run_dir / "manifest.json").read_text())["sessions"]
    text = notebook_text(run_dir / "generate.ipynb")
    hedged, wins = session["hedged"], session["hedge_wins"]
    assert hedged >= 1, text[-3000:]
    assert f"still running on slow {urls['standalone']}" in text  # generate's own note: STANDALONE was hedged
    # Each hedge has one loser, cancelled by the client: the original on STANDALONE when the copy on NGRAM
    # answered first (hedge_wins), else the copy on NGRAM. SGLang counts an abort for a loser it was still
    # running, and this run cuts nothing else short, so per server the aborts are at most its losers, and at
    # least one loser was aborted (the other copy of a hedged request is mid-answer when the first one lands).
    assert aborted["standalone"] <= wins and aborted["ngram"] <= hedged - wins, (aborted, session)
    assert aborted["standalone"] + aborted["ngram"] >= 1, (aborted, session)
    # every stored answer carries SGLang's per-request acceptance, from whichever server kept it
    assert rows["spec_verify_ct"].is_not_null().all() and (rows["spec_accept_length"] >= 1.0).all()
    assert set(rows["server"].to_list()) == set(urls.values())


def test_a_prompt_sglang_refuses_lands_in_failed_with_its_message_after_one_attempt(hedged_run: HedgedRun):
    failed = failed_rows(hedged_run.run_dir)
    assert failed["id"].to_list() == ["too-long"], failed
    [row] = failed.iter_rows(named=True)
    assert (row["error_kind"], row["status"], row["attempts"]) == ("http", 400, 1)
    # the stored error is draftgen's "kind status: " before SGLang's own message
    assert re.fullmatch(
        r"http 400: The input \(\d+ tokens\) is longer than the model's context length \(4096 tokens\)\.",
        row["error"],
    ), row["error"]


def test_empty_messages_are_refused_by_sglang_and_classified_not_retryable(draftgen, fleet):
    done = classify_refusal(draftgen, fleet.plain.url)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [r["path"] for r in results] == ["chat", "chat stream", "stream_chat"]
    for result in results:
        assert result == {
            "path": result["path"],
            "kind": "http",
            "status": 400,
            "message": "Messages cannot be empty.",
            "retryable": False,
        }


@pytest.mark.stops_servers
def test_a_server_sigkilled_mid_run_fails_over_and_every_id_is_stored_once(
    plain_killed_mid_run: KilledRun, fleet
):
    run = plain_killed_mid_run
    rows = assert_exactly_once(run.run_dir, ids_of(run.prompts))
    assert failed_rows(run.run_dir).is_empty()
    by_server = {url: rows.filter(pl.col("server") == url) for url in (fleet.plain.url, fleet.ngram.url)}
    # plain answered before it died, ngram took the rest; nothing plain answered was sent after the kill
    assert by_server[fleet.plain.url].height > 0 and by_server[fleet.ngram.url].height > 0
    assert (by_server[fleet.plain.url]["started_at"] < run.killed_at).all()
    assert (by_server[fleet.ngram.url]["started_at"] > run.killed_at).any()
    text = notebook_text(run.run_dir / "generate.ipynb")
    assert f"{fleet.plain.url}" in text and "marked down after" in text
    assert json.loads((run.run_dir / "manifest.json").read_text())["status"] == "complete"


@pytest.mark.stops_servers
def test_the_fleets_two_model_folders_are_one_tokenizer_that_counts_as_sglang(
    plain_killed_mid_run: KilledRun, models
):
    """plain and ngram loaded different folders (the designed and the random model) holding the same tokenizer
    files: generate takes the first for the trainer's cap, and counts the canary's prompt (sent with thinking off)
    as each SGLang server counted it."""
    text = notebook_text(plain_killed_mid_run.run_dir / "generate.ipynb")
    assert (
        f"the servers loaded {models.designed}, {models.random}, whose tokenizer files are the same" in text
    )
    assert "the tokenizer counts the canary" in text and "prompt tokens for the canary" not in text
