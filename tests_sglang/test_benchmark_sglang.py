"""benchmark.ipynb against the NGRAM and STANDALONE servers: acceptance per request (sglext) and from /metrics.

SGLang 0.5.23 reports each request's ``spec_verify_ct`` (verify steps) and ``completion_tokens``, and counts the
same two numbers into ``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total`` when the request
finishes (``TokenizerManager`` → ``observe_one_finished_request``). Both are integer counts of the same events, so
over a level the two acceptance lengths, Σ tokens / Σ verify steps from sglext and Δ tokens / Δ verify calls from
the notebook's own /metrics scrapes before and after the level, are equal, not close, when the counter window
holds exactly the level's requests. They may differ only when it does not: a request of another client (or one
the benchmark cancelled, which SGLang still counts when it aborts it) finishes between the two scrapes; a request
finishes with no verify step (its one token from prefill: generation tokens grow, verify calls do not, and sglext
carries no spec details for it); or a level's request fails at the client while the server finishes it. None of
those happens here (temperature 0, the random model never stops before max_tokens, nothing else talks to these
servers), so the test asks for equality of both counts and of the two lengths.
"""

from __future__ import annotations

import gzip
import re

import polars as pl
import pytest
from recording_proxy import Exchange
from tier_runs import BENCH_LEVELS as LEVELS
from tier_runs import BENCH_MAX_TOKENS as MAX_TOKENS
from tier_runs import BENCH_PER_LEVEL as PER_LEVEL
from tier_runs import BenchmarkRun

GENERATED = "sglang:generation_tokens_total"
VERIFY = "sglang:spec_verify_calls_total"


def counter(text: str, name: str) -> float:
    """Sum of the samples called exactly ``name`` (any labels) in Prometheus text, read with a plain regex."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


def scrapes_around(metrics: list[Exchange], started_at: float, finished_at: float) -> tuple[str, str]:
    before = [e for e in metrics if e.started < started_at]
    after = [e for e in metrics if e.started > finished_at]
    assert before and after, "the notebook did not scrape /metrics around the level"
    return text_of(before[-1]), text_of(after[0])


def text_of(exchange: Exchange) -> str:
    """The body as sent: SGLang's /metrics (prometheus_client) gzips it for a client that accepts gzip."""
    body = exchange.response_body
    return (gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body).decode()


@pytest.mark.parametrize("name", ["ngram", "standalone"])
def test_acceptance_from_sglext_equals_the_metrics_counters_per_level(benchmark_run: BenchmarkRun, name):
    run_dir, proxy = benchmark_run.run_dir, benchmark_run.proxies[name]
    results = pl.read_parquet(run_dir / "results.parquet").filter(pl.col("server") == proxy.url)
    requests = pl.read_parquet(run_dir / "requests.parquet").filter(pl.col("server") == proxy.url)
    assert results.sort("concurrency")["concurrency"].to_list() == LEVELS
    metrics = proxy.exchanges("/metrics", "GET")
    for level in results.iter_rows(named=True):
        mine = requests.filter(pl.col("concurrency") == level["concurrency"])
        assert mine.height == PER_LEVEL and mine["ok"].all()
        assert mine["completion_tokens_source"].to_list() == ["usage"] * PER_LEVEL
        assert (mine["spec_verify_ct"] > 0).all(), mine.select("spec_verify_ct")
        tokens, verifies = mine["completion_tokens"].sum(), mine["spec_verify_ct"].sum()
        before, after = scrapes_around(metrics, level["started_at"], level["finished_at"])
        assert counter(after, GENERATED) - counter(before, GENERATED) == tokens == PER_LEVEL * MAX_TOKENS
        assert counter(after, VERIFY) - counter(before, VERIFY) == verifies
        assert level["accept_length_source"] == "sglext"
        assert level["accept_length"] == pytest.approx(tokens / verifies, rel=1e-12)
        assert level["metrics_accept_length"] == pytest.approx(level["accept_length"], rel=1e-12)
        # each request's own figure is SGLang's completion_tokens / spec_verify_ct
        for row in mine.iter_rows(named=True):
            assert row["spec_accept_length"] == pytest.approx(
                row["completion_tokens"] / row["spec_verify_ct"]
            )
        assert 1.0 <= level["accept_length"] <= 4.0  # both servers verify at most 4 tokens a step


def test_standalone_accepts_drafts_and_both_report_the_engine(benchmark_run: BenchmarkRun):
    run_dir, proxies = benchmark_run.run_dir, benchmark_run.proxies
    results = pl.read_parquet(run_dir / "results.parquet")
    standalone = results.filter(pl.col("server") == proxies["standalone"].url)
    assert (standalone["accept_length"] > 1.0).all()  # the draft model agrees with the target often
    assert (results["missing"] == "").all(), results.select("server", "missing")
    assert (results["failed"] == 0).all()
