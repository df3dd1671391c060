"""Prometheus text → counter windows → tokens and acceptance length (SGLang and vLLM names)."""

from __future__ import annotations

import pytest

from draftgen.client.metrics import (
    MetricsParseError,
    acceptance_length,
    counter_window,
    generated_tokens,
    parse_metrics,
)

SGLANG_BEFORE = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen3.6-27B",dp_rank="0"} 1000.0
sglang:generation_tokens_total{model_name="Qwen/Qwen3.6-27B",dp_rank="1"} 500.0
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="Qwen/Qwen3.6-27B"} 400.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B"} 7.0
"""
SGLANG_AFTER = SGLANG_BEFORE.replace("1000.0", "4600.0").replace("400.0", "1400.0").replace("7.0", "0.0")

VLLM_BEFORE = """\
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="m",engine="0"} 10
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 100
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 50
"""
VLLM_AFTER = VLLM_BEFORE.replace(" 10\n", " 2010\n").replace(" 100\n", " 600\n").replace(" 50\n", " 1300\n")


def test_counters_are_summed_over_label_sets_and_gauges_kept_apart():
    snap = parse_metrics(SGLANG_BEFORE, taken_at=1.0)
    assert snap.counters["sglang:generation_tokens_total"] == 1500.0
    assert snap.gauges["sglang:num_running_reqs"] == 7.0
    assert "sglang:num_running_reqs" not in snap.counters


def test_sglang_window_gives_tokens_and_acceptance_from_differences():
    window = counter_window(parse_metrics(SGLANG_BEFORE, 10.0), parse_metrics(SGLANG_AFTER, 15.0))
    assert window.seconds == 5.0
    assert generated_tokens(window) == (3600.0, "sglang:generation_tokens_total")
    value, how = acceptance_length(window)
    assert value == pytest.approx(3600.0 / 1000.0)
    assert "spec_verify_calls" in how


def test_vllm_acceptance_is_one_plus_accepted_per_draft():
    window = counter_window(parse_metrics(VLLM_BEFORE, 0.0), parse_metrics(VLLM_AFTER, 1.0))
    assert generated_tokens(window) == (2000.0, "vllm:generation_tokens_total")
    value, how = acceptance_length(window)
    assert value == pytest.approx(1.0 + 1250.0 / 500.0)
    assert how.startswith("1 + vllm:")


def test_a_counter_that_went_down_is_reported_not_differenced():
    window = counter_window(parse_metrics(SGLANG_AFTER, 0.0), parse_metrics(SGLANG_BEFORE, 1.0))
    assert "sglang:generation_tokens_total" in window.reset
    assert generated_tokens(window) is None
    assert acceptance_length(window) is None


def test_no_speculation_counters_means_no_acceptance():
    text = "# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total 5\n"
    window = counter_window(parse_metrics(text, 0.0), parse_metrics(text.replace(" 5", " 9"), 1.0))
    assert generated_tokens(window) == (4.0, "sglang:generation_tokens_total")
    assert acceptance_length(window) is None


def test_not_prometheus_text_raises_a_named_error():
    with pytest.raises(MetricsParseError, match="not Prometheus text"):
        parse_metrics("<html>502 Bad Gateway</html>")
