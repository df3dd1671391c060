"""generate.ipynb against one vLLM and one transformers-serve server at once (streaming, thinking off).

What the servers themselves said is read from the recording proxies in front of them (raw bytes of every
answer) and from vLLM's own /metrics counters, never from draftgen's parsing.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import polars as pl
from conftest import GenerateRun
from notebook_runs import notebook_text
from recording_proxy import Exchange
from transformers import AutoTokenizer

from draftgen.training.conversation import (
    Answer,
    generated_calls,
    request_messages,
    stored_messages,
    stored_tools,
)

SAMPLING_EXTRAS = ("top_k", "min_p", "return_spec_tokens_details")


def stored_rows(run: GenerateRun) -> pl.DataFrame:
    shards = sorted((run.run_dir / "shards").glob("*.parquet"))
    assert shards, f"no shards in {run.run_dir}"
    return pl.concat([pl.read_parquet(s) for s in shards], how="diagonal_relaxed")


def final_usage(events: list) -> dict | None:
    """The usage object of a recorded SSE answer (whichever chunk carried it)."""
    usages = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
    return usages[-1] if usages else None


def answer(exchange: Exchange) -> tuple[str, dict | None]:
    """(response id, usage) of one recorded chat answer, streamed or not."""
    if exchange.request_json().get("stream"):
        events = list(exchange.sse_events())
        return events[0]["id"], final_usage(events)
    body = exchange.response_json()
    return body["id"], body.get("usage")


def streamed(exchanges: list[Exchange]) -> list[Exchange]:
    return [e for e in exchanges if e.status == 200 and e.request_json().get("stream")]


def counter(text: str, name: str) -> float:
    """Sum of the samples called exactly ``name`` (any labels) in Prometheus text, read with a plain regex."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


def test_every_prompt_id_is_stored_exactly_once_across_both_engines(generate_run: GenerateRun):
    rows = stored_rows(generate_run)
    ids = rows["id"].to_list()
    assert len(ids) == len(set(ids)), "an id was stored twice"
    assert set(ids) == set(generate_run.expected_ids)
    assert (
        not (generate_run.run_dir / "failed.parquet").exists()
        or pl.read_parquet(generate_run.run_dir / "failed.parquet").is_empty()
    )
    by_server = rows.group_by("server").len()
    served = dict(zip(by_server["server"].to_list(), by_server["len"].to_list(), strict=True))
    assert set(served) == {p.url for p in generate_run.proxies.values()}, f"rows per server: {served}"
    manifest = json.loads((generate_run.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete", manifest.get("status")


def test_stored_token_counts_equal_each_servers_own_usage(generate_run: GenerateRun):
    rows = stored_rows(generate_run)
    usage_by_id = dict(
        answer(e) for proxy in generate_run.proxies.values() for e in proxy.chats() if e.status == 200
    )
    assert rows["usage_reported"].all()
    sent = Counter(
        (usage["prompt_tokens"], usage["completion_tokens"])
        for usage in usage_by_id.values()
        if usage is not None
    )
    stored: Counter = Counter()
    for row in rows.iter_rows(named=True):
        usage = usage_by_id[row["response_id"]]  # the row's last turn
        assert usage is not None, f"{row['server']} sent no usage for {row['id']}"
        turns = list(zip(row["turn_prompt_tokens"], row["turn_completion_tokens"], strict=True))
        assert turns[-1] == (usage["prompt_tokens"], usage["completion_tokens"]), row["id"]
        assert row["prompt_tokens"] == turns[-1][0], row["id"]
        assert row["completion_tokens"] == sum(c for _, c in turns), row["id"]  # a conversation's total
        stored.update(turns)
    assert rows["turn_after"].list.len().max() > 1, "the real tier's prompts hold no multi-turn conversation"
    # every stored turn's counts are those of an answer a server really sent (earlier turns included)
    assert not stored - sent, f"turn counts no server sent: {stored - sent}"
    # vLLM's own counters agree with the usage of every answer it sent (preflight's probe and canary included).
    vllm_answers = [answer(e)[1] for e in generate_run.proxies["vllm"].chats() if e.status == 200]
    before, after = generate_run.vllm_metrics_before, generate_run.vllm_metrics_after
    generated = counter(after, "vllm:generation_tokens_total") - counter(
        before, "vllm:generation_tokens_total"
    )
    prompted = counter(after, "vllm:prompt_tokens_total") - counter(before, "vllm:prompt_tokens_total")
    assert generated == sum(u["completion_tokens"] for u in vllm_answers)
    assert prompted == sum(u["prompt_tokens"] for u in vllm_answers)


def test_both_servers_rendered_our_template_with_thinking_off(generate_run: GenerateRun):
    """Each server's prompt_tokens equal our template's tokens with enable_thinking=false: the switch reached both.

    For every turn: the request of a later turn carries the target's own earlier answers (and calls), rendered as
    history; a conversation with tools is rendered with them.
    """
    tokenizer = AutoTokenizer.from_pretrained(generate_run.params["model"])
    rows = stored_rows(generate_run)
    for row in rows.iter_rows(named=True):
        earlier: list[tuple[int, Answer]] = []
        calls = generated_calls(row, len(row["turn_after"]))
        for after, content, made, prompt_tokens in zip(
            row["turn_after"], row["turn_content"], calls, row["turn_prompt_tokens"], strict=True
        ):
            messages = request_messages(stored_messages(row), after, earlier, row["turns_mode"])
            rendered = tokenizer.apply_chat_template(
                list(messages),
                tools=stored_tools(row),
                add_generation_prompt=True,
                enable_thinking=False,
                tokenize=True,
                return_dict=True,
            )
            assert prompt_tokens == len(rendered["input_ids"]), (row["id"], after, row["server"])
            earlier.append((after, Answer(content, made)))


def test_engine_extras_go_only_where_the_probe_found_them_accepted(generate_run: GenerateRun):
    vllm, hf = generate_run.proxies["vllm"].chats(), generate_run.proxies["transformers"].chats()
    # transformers serve refused the probe's first request (sampling extras), and nothing after it carried them.
    refused = [e for e in hf if e.status == 422]
    assert len(refused) == 1 and "Unexpected fields" in refused[0].response_body.decode()
    assert "return_spec_tokens_details" in refused[0].request_json()
    accepted = [e.request_json() for e in hf if e.status == 200]
    assert accepted and not any(k in body for body in accepted for k in SAMPLING_EXTRAS)
    assert all(body["chat_template_kwargs"] == {"enable_thinking": False} for body in accepted)
    # vLLM accepted every field: no refusals, and enable_thinking reached it on every request.
    assert all(e.status == 200 for e in vllm)
    assert all(e.request_json()["chat_template_kwargs"] == {"enable_thinking": False} for e in vllm)
    text = notebook_text(generate_run.run_dir / "generate.ipynb")
    assert "engine vllm 0.32.0" in text
    assert "engine openai-compatible" in text and "top_k/min_p not accepted" in text
    assert "model list unavailable (GET /v1/models answered 500)" in text


def test_the_model_folder_vllm_reports_caps_each_turn_and_counts_as_both_servers(generate_run: GenerateRun):
    """No tokenizer given: generate takes the folder vLLM's model card names (its ``root``; transformers serve lists
    none) for the trainer's cap, and counts the canary's prompt (sent with thinking off) as each server did."""
    text = notebook_text(generate_run.run_dir / "generate.ipynb")
    assert "tokenizer" not in generate_run.params
    assert "none given: the model folder the servers loaded is on this machine" in text
    assert "the tokenizer counts the canary" in text and "prompt tokens for the canary" not in text


def test_the_stream_shapes_the_client_absorbed(generate_run: GenerateRun):
    """vLLM: usage in a chunk of its own with choices [] and a final [DONE]; transformers serve: usage on the
    finish chunk and no [DONE]. The same client stored both correctly (see the usage test)."""
    assert streamed(generate_run.proxies["vllm"].chats()) and streamed(
        generate_run.proxies["transformers"].chats()
    )
    for exchange in streamed(generate_run.proxies["vllm"].chats()):
        events = list(exchange.sse_events())
        assert events[-1] == "[DONE]"
        usage_chunks = [e for e in events if isinstance(e, dict) and e.get("usage")]
        assert usage_chunks and all(e["choices"] == [] for e in usage_chunks)
    for exchange in streamed(generate_run.proxies["transformers"].chats()):
        events = list(exchange.sse_events())
        assert "[DONE]" not in events
        assert events[-1]["usage"] and events[-1]["choices"][0]["finish_reason"] is not None
