"""The notebooks on the hybrid MTP server: benchmark, estimate, generate with SGLang's ids, validate, tune's race.

The server is ``draftgen serve`` of the designed ``qwen3_5`` hybrid with NEXTN 3/1/4 (test_mtp_server.py), so the
acceptance every run reports is known: 13 tokens in 4 verify steps per thinking-on answer (3.25 per step). What
is checked is what draftgen makes of SGLang's NEXTN path: acceptance per request from ``sglext`` equal to
SGLang's own /metrics accounting over each level, the batch cap read from the server equal to the one SGLang
resolved (the mamba state pool's, not the argument), the estimate built on both, every turn's ids as SGLang
sent them and validate's rows equal to them token for token, and tune's race over two MTP settings.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import yaml
from mtp_runs import MAMBA_CAPPED_RUNNING, MTP_ANSWER_TOKENS, MTP_BENCH_LEVELS, MTP_BENCH_PER_LEVEL, MTP_RACE
from notebook_runs import assert_exactly_once, stored_rows
from prompt_files import ids_of
from test_benchmark_sglang import GENERATED, VERIFY, counter, scrapes_around
from test_mtp_server import designed, hybrid_tokenizer
from tiny_qwen3 import DESIGNED_ANSWER, DESIGNED_REASONING, IM_END, THINK_CLOSE

from draftgen.defaults import CONCURRENCY_PER_SERVER


def test_benchmark_acceptance_from_sglext_equals_sglangs_metrics_under_nextn(mtp_benchmark_run, models):
    run_dir, proxy = mtp_benchmark_run.run_dir, mtp_benchmark_run.proxy
    want = designed(str(models.hybrid), thinking=True)
    results = pl.read_parquet(run_dir / "results.parquet")
    requests = pl.read_parquet(run_dir / "requests.parquet")
    assert results.sort("concurrency")["concurrency"].to_list() == MTP_BENCH_LEVELS
    metrics = proxy.exchanges("/metrics", "GET")
    for level in results.iter_rows(named=True):
        mine = requests.filter(pl.col("concurrency") == level["concurrency"])
        assert mine.height == MTP_BENCH_PER_LEVEL and mine["ok"].all()
        assert mine["completion_tokens"].to_list() == [want.tokens] * MTP_BENCH_PER_LEVEL
        assert mine["spec_verify_ct"].to_list() == [want.verify_steps] * MTP_BENCH_PER_LEVEL
        tokens, verifies = mine["completion_tokens"].sum(), mine["spec_verify_ct"].sum()
        before, after = scrapes_around(metrics, level["started_at"], level["finished_at"])
        assert counter(after, GENERATED) - counter(before, GENERATED) == tokens
        assert counter(after, VERIFY) - counter(before, VERIFY) == verifies
        assert level["accept_length_source"] == "sglext"
        assert level["accept_length"] == pytest.approx(want.accept_length, rel=1e-12)
        assert level["metrics_accept_length"] == pytest.approx(level["accept_length"], rel=0.02)
        assert 1.0 < level["accept_length"] < 4.0
    assert (results["missing"] == "").all(), results.select("server", "missing")


def test_the_batch_cap_draftgen_reads_is_the_one_sglang_resolved(mtp_benchmark_run, mtp_server):
    """SGLang keeps ``max_running_requests`` 64 (serve's with MTP on) in its arguments and runs at most 21: the
    mamba state pool's limit, which it logs. The benchmark must report the 21."""
    results = pl.read_parquet(mtp_benchmark_run.run_dir / "results.parquet")
    assert set(results["max_running_requests"].to_list()) == {MAMBA_CAPPED_RUNNING}
    log = mtp_server.server_log.read_text(errors="replace")
    assert f"max_running_requests={MAMBA_CAPPED_RUNNING}," in log
    [info] = mtp_benchmark_run.proxy.exchanges("/server_info", "GET")[:1]
    assert json.loads(info.response_body)["max_running_requests"] == CONCURRENCY_PER_SERVER


def test_the_estimate_prices_the_hybrids_measured_acceptance_and_cap(
    mtp_estimate_run, mtp_benchmark_run, models
):
    estimate = json.loads((mtp_estimate_run / "estimate.json").read_text())
    assert estimate["benchmark_dir"] == str(mtp_benchmark_run.run_dir)
    assert estimate["rate_model"]["max_running_requests"] == MAMBA_CAPPED_RUNNING, estimate["rate_model"]
    assert estimate["accept_length_source"] == "sglext"
    assert estimate["accept_length"] == pytest.approx(
        designed(str(models.hybrid), True).accept_length, rel=1e-9
    )
    assert estimate["mean_completion_tokens"] == MTP_ANSWER_TOKENS and estimate["servers"] == 7


def test_generate_stores_sglangs_ids_for_every_turn_of_the_hybrid(mtp_generate_run, models):
    rows = assert_exactly_once(mtp_generate_run.run_dir, ids_of(mtp_generate_run.prompts))
    tok = hybrid_tokenizer(str(models.hybrid))
    answer = tok.encode(
        DESIGNED_REASONING + THINK_CLOSE + "\n\n" + DESIGNED_ANSWER + IM_END, add_special_tokens=False
    )
    want = designed(str(models.hybrid), thinking=True)
    for row in rows.iter_rows(named=True):
        turns = len(row["turn_after"])
        assert turns == (3 if row["id"].startswith("mtp-multi") else 1), row["id"]
        assert row["turn_output_ids"] == [answer] * turns, row["id"]
        assert row["turn_reasoning"] == [DESIGNED_REASONING] * turns
        assert row["turn_spec_verify_ct"] == [want.verify_steps] * turns, row["id"]


def test_validate_rows_are_sglangs_output_ids_token_for_token(mtp_validate_run, mtp_generate_run):
    summary = json.loads((mtp_validate_run / "summary.json").read_text())
    assert summary["passed"], summary
    stored = stored_rows(mtp_generate_run.run_dir)
    answers = sum(len(t) for t in stored["turn_after"].to_list())
    assert summary["counts"]["token_source"]["server"] == answers == summary["counts"]["out"]
    outputs = {  # validate's sample ids: ROW#TURN for multi-turn rows
        f"{row['id']}#{turn}" if len(row["turn_output_ids"]) > 1 else row["id"]: ids
        for row in stored.iter_rows(named=True)
        for turn, ids in enumerate(row["turn_output_ids"])
    }
    tokens = pl.concat(
        [pl.read_parquet(p) for p in sorted((mtp_validate_run / "export" / "tokens").glob("*.parquet"))]
    )
    assert sorted(tokens["id"].to_list()) == sorted(outputs)
    for row in tokens.iter_rows(named=True):
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        server = outputs[row["id"]]
        supervised = ids[mask == 1].tolist()
        # the trainer supervises the server's completion ids, then the template's newline after <|im_end|>
        assert supervised[: len(server)] == server, row["id"]
        assert len(supervised) == len(server) + 1, row["id"]


def test_tune_raced_two_mtp_settings_on_the_hybrid(mtp_tune_run, models):
    table = pl.read_parquet(mtp_tune_run / "candidates.parquet")
    labels = sorted(table["candidate"].to_list())
    assert labels == sorted(f"MTP {s}/{k}/{d}, 4 running" for s, k, d in MTP_RACE), labels
    assert table["failure"].is_null().all(), table.select("candidate", "failure", "log_tail")
    accept = dict(zip(table["candidate"], table["accept_length"], strict=True))
    for steps, _, drafts in MTP_RACE:
        want = designed(str(models.hybrid), thinking=True, steps=steps)
        assert accept[f"MTP {steps}/1/{drafts}, 4 running"] == pytest.approx(want.accept_length, rel=1e-9)
    assert accept["MTP 3/1/4, 4 running"] > accept["MTP 2/1/3, 4 running"]  # the head gets 3 in a row right
    best = table.sort("tok_s_per_gpu", descending=True)["candidate"][0]
    [chosen] = table.filter(pl.col("status") == "chosen")["candidate"].to_list()
    assert chosen == best
    settings = yaml.safe_load((mtp_tune_run / "settings.yaml").read_text())["settings"]
    assert settings["speculative_algorithm"] == "NEXTN" and settings["speculative_eagle_topk"] == 1
    logs = sorted((mtp_tune_run / "servers").glob("r0-*/server-*.log"))
    assert len(logs) == len(MTP_RACE)
    for log in logs:
        text = log.read_text(errors="replace")
        assert (
            "'speculative_algorithm': 'EAGLE'," in text
            and "'mamba_radix_cache_strategy': 'no_buffer'," in text
        )
        assert "type=Qwen3_5ForCausalLMMTP" in text
