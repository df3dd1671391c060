"""max_tokens against the trainer's max_length: the estimate measures the share of generated tokens past it, and
generate's preflight warns before the GPUs spend them."""

from __future__ import annotations

import json

import polars as pl
import pytest

from draftgen.estimate.plan import max_length_cost
from draftgen.generate import GenerateConfig
from draftgen.generate.preflight import ESTIMATE_KEYS, PromptScan, max_length_check
from draftgen.params import build_config


def test_the_estimate_counts_the_generated_tokens_past_max_length():
    requests = pl.DataFrame(
        {
            "prompt_tokens": [100, 100, 1000, None],
            "completion_tokens": [1000, 4000, 3500, 4000],
        }
    )
    cost = max_length_cost(requests, 4096)
    assert cost is not None and cost.requests == 3
    # past 4096: 0, 4, 404 of 8,500 generated tokens; two of three requests
    assert cost.share_of_tokens == pytest.approx(408 / 8500)
    assert cost.share_of_requests == pytest.approx(2 / 3) and cost.median_prompt_tokens == 100
    # what an uncapped run would generate past max_length, and that the estimate is priced capped
    note = cost.note(4096)
    assert (
        "uncapped, 4.8% of the generated tokens" in note
        and "min(max_tokens, max_length − its prompt)" in note
    )
    assert max_length_cost(requests, 0) is None
    assert max_length_cost(requests.drop("prompt_tokens"), 4096) is None


def _config(tmp_path, **changes) -> GenerateConfig:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "q"}]}\n')
    values = {
        "servers": ["http://127.0.0.1:1"],
        "model": "m",
        "prompts": str(prompts),
        "out_dir": str(tmp_path / "o"),
    }
    return build_config(GenerateConfig, {**values, **changes})


def test_preflight_warns_when_max_tokens_and_prompts_reach_past_max_length(tmp_path):
    scan = PromptScan(prompt_chars=[400] * 9 + [40_000])  # median 400 characters: ~100 tokens
    check = max_length_check(_config(tmp_path), scan)
    assert check is not None and check.status == "warn"
    assert "~100 tokens" in check.detail and "longer than ~3,996 tokens is cut" in check.detail
    assert max_length_check(_config(tmp_path, max_tokens=2048), scan).status == "ok"
    assert max_length_check(_config(tmp_path, train_max_length=0), scan) is None
    estimate = tmp_path / "estimate.json"
    body = dict.fromkeys(ESTIMATE_KEYS, 1)
    estimate.write_text(json.dumps({**body, "train_max_length": {"share_of_tokens": 0.031}}))
    measured = max_length_check(_config(tmp_path, estimate=str(estimate)), scan)
    assert measured.status == "warn" and "measured 3.1% of the generated tokens past it" in measured.detail
