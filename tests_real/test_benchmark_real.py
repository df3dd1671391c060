"""benchmark.ipynb against vLLM with n-gram speculative decoding (and transformers serve beside it).

Repetitive prompts at temperature 0: greedy decoding of the tiny model loops, and the n-gram proposer copies the
loop from earlier tokens, so vLLM accepts drafts. The acceptance length the notebook reports per level must be
exactly 1 + Δaccepted / Δdrafts computed here from the raw /metrics text of the notebook's own scrapes before
and after that level (recorded by the proxy, parsed with a plain regex, not with draftgen's parser).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from notebook_runs import draftgen_run
from recording_proxy import Exchange

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
GENERATED = "vllm:generation_tokens_total"
LEVELS = [1, 4]
PER_LEVEL = 8
PHRASES = (
    "the cat sat on the mat",
    "one two three four",
    "red green blue",
    "alpha beta gamma delta",
    "up and down and up and down",
    "tick tock",
    "north east south west",
    "do re mi fa so",
)


def counter(text: str, name: str) -> float:
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


def repetitive_prompts(path: Path, count: int) -> Path:
    with path.open("w") as handle:
        for i in range(count):
            phrase = PHRASES[i % len(PHRASES)]
            text = f"Repeat after me, {i}: " + ", ".join([phrase] * 12)
            handle.write(
                json.dumps({"id": f"rep-{i:03d}", "messages": [{"role": "user", "content": text}]}) + "\n"
            )
    return path


def scrapes_around(metrics: list[Exchange], started_at: float, finished_at: float) -> tuple[str, str]:
    """The notebook's own /metrics scrapes just before a level began and just after it ended."""
    before = [e for e in metrics if e.started < started_at]
    after = [e for e in metrics if e.started > finished_at]
    assert before and after, "the notebook did not scrape /metrics around the level"
    return before[-1].response_body.decode(), after[0].response_body.decode()


@pytest.fixture(scope="module")
def benchmark_run(real_servers, tiny_model, tmp_path_factory):
    from recording_proxy import RecordingProxy

    proxies = {engine: RecordingProxy(server.url) for engine, server in real_servers.items()}
    try:
        for proxy in proxies.values():
            proxy.start()
        work = tmp_path_factory.mktemp("bench")
        prompts = repetitive_prompts(work / "repetitive.jsonl", len(proxies) * len(LEVELS) * PER_LEVEL)
        params = {
            "servers": [proxies["vllm"].url, proxies["transformers"].url],
            "model": str(tiny_model),
            "prompts": str(prompts),
            "max_tokens": 64,
            "temperature": 0.0,
            "top_p": 1.0,
            "enable_thinking": False,
            "concurrencies": LEVELS,
            "num_prompts": PER_LEVEL,
            "warmup_requests": 1,
            "request_timeout_s": 300.0,
        }
        run_dir = draftgen_run("benchmark", work, "real", params)
        yield run_dir, proxies
    finally:
        for proxy in proxies.values():
            proxy.stop()


def test_acceptance_length_per_level_equals_the_raw_vllm_counters(benchmark_run):
    run_dir, proxies = benchmark_run
    results = pl.read_parquet(run_dir / "results.parquet")
    vllm = results.filter(pl.col("server") == proxies["vllm"].url).sort("concurrency")
    assert vllm["concurrency"].to_list() == LEVELS
    metrics = proxies["vllm"].exchanges("/metrics", "GET")
    for level in vllm.iter_rows(named=True):
        before, after = scrapes_around(metrics, level["started_at"], level["finished_at"])
        drafts = counter(after, DRAFTS) - counter(before, DRAFTS)
        accepted = counter(after, ACCEPTED) - counter(before, ACCEPTED)
        assert drafts > 0 and accepted > 0, f"c={level['concurrency']}: no drafts accepted"
        assert level["accept_length"] == pytest.approx(1.0 + accepted / drafts, rel=1e-12)
        assert level["accept_length"] > 1.0
        assert level["accept_length_source"] == f"metrics (1 + {ACCEPTED} / {DRAFTS})"
        # The level's window holds its requests and nothing else: vLLM's token counter equals their usage.
        assert level["output_tokens_source"] == "usage"
        assert level["metrics_generation_tokens"] == level["output_tokens"]
        assert counter(after, GENERATED) - counter(before, GENERATED) == level["output_tokens"]
        assert level["ok"] == PER_LEVEL and level["failed"] == 0


def test_each_engine_reports_what_it_has_and_the_rest_is_named(benchmark_run):
    run_dir, proxies = benchmark_run
    results = pl.read_parquet(run_dir / "results.parquet")
    requests = pl.read_parquet(run_dir / "requests.parquet")
    hf = results.filter(pl.col("server") == proxies["transformers"].url)
    assert hf["concurrency"].sort().to_list() == LEVELS
    assert hf["failed"].sum() == 0 and hf["output_tokens_source"].to_list() == ["usage"] * len(LEVELS)
    assert hf["accept_length"].is_null().all()
    assert all(s.startswith("missing") for s in hf["accept_length_source"])
    assert all("[DONE]" in m for m in hf["missing"])
    by_server = {
        url: requests.filter(pl.col("server") == url)
        for url in (proxies["vllm"].url, proxies["transformers"].url)
    }
    assert by_server[proxies["vllm"].url]["done_sentinel"].all()
    assert not by_server[proxies["transformers"].url]["done_sentinel"].any()
    assert requests["usage_reported"].all()
