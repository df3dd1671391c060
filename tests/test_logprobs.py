"""Top-k logprobs: the simulator answers them as SGLang 0.5.23 does, and generate keeps a per-turn entropy summary.

The simulator's shape (``choices[].logprobs.content``: per generated token, the stop token included, ``token``,
``bytes``, ``logprob``, ``top_logprobs``) is checked against real SGLang by tests_sglang/test_wire_shapes.py; here,
what a client relies on: one entry per completion token, the same values whole and streamed, each stream step's
entries on its own chunk. ``entropy_top_k`` asks for them and stores each turn's top-k entropy summary
(``turn_entropy``), computed as the answer arrives (draftgen.client.entropy).
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from aiohttp import web
from sim_helpers import post_json, serve

from draftgen.client import introspect
from draftgen.client.entropy import EntropySummary, top_k_entropy
from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.client.sse import SseDecoder
from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.params import ParameterError, SamplingParams, build_config

QUESTION = [{"role": "user", "content": "Tell me about the weather in three sentences."}]
NEW = 2  # the shared fleet's SGLang 0.5.23 server


def _whole(url: str, **extra: object) -> dict:
    body = {"model": "m", "messages": QUESTION, "max_tokens": 200, **extra}
    status, reply = post_json(f"{url}/v1/chat/completions", body)
    assert status == 200, reply
    return reply


def _stream(url: str, **extra: object) -> list[dict]:
    body = {"model": "m", "messages": QUESTION, "max_tokens": 200, "stream": True, **extra}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps({**body, "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        events = SseDecoder().feed(response.read())
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


def test_the_simulator_sends_an_entry_per_generated_token_the_stop_token_included(shared_sim_fleet):
    reply = _whole(shared_sim_fleet.urls[NEW], logprobs=True, top_logprobs=3, max_tokens=8192)
    [choice] = reply["choices"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == reply["usage"]["completion_tokens"]
    assert choice["finish_reason"] == "stop" and entries[-1]["token"] == "<|im_end|>"
    for entry in entries:
        assert list(entry) == ["token", "bytes", "logprob", "top_logprobs"]
        assert entry["bytes"] == list(entry["token"].encode()) and entry["token"]
        top = entry["top_logprobs"]
        assert len(top) == 3 and all(list(t) == ["token", "bytes", "logprob"] for t in top)
        logprobs = [t["logprob"] for t in top]
        assert logprobs == sorted(logprobs, reverse=True) and max(logprobs) <= 0.0
        assert sum(math.exp(lp) for lp in logprobs) <= 1.0 + 1e-9
        assert entry["logprob"] in logprobs  # the token drawn is among the top 3 (the sim's own takes ≥ 0.3)
    text = "".join(e["token"] for e in entries[:-1])
    assert (
        text.replace("</think>", "") == choice["message"]["reasoning_content"] + choice["message"]["content"]
    )


def test_no_logprobs_unless_asked_and_no_alternatives_unless_asked(shared_sim_fleet):
    url = shared_sim_fleet.urls[NEW]
    assert _whole(url)["choices"][0]["logprobs"] is None
    assert _whole(url, top_logprobs=5)["choices"][0]["logprobs"] is None  # SGLang: return_logprob=logprobs
    entries = _whole(url, logprobs=True)["choices"][0]["logprobs"]["content"]
    assert entries and all(e["top_logprobs"] == [] for e in entries)
    status, reply = post_json(
        f"{url}/v1/chat/completions",
        {"model": "m", "messages": QUESTION, "logprobs": True, "top_logprobs": -1},
    )
    assert status == 400 and "top_logprobs" in reply["message"]


def test_a_stream_carries_each_steps_entries_on_its_chunk_and_the_same_values_as_a_whole_answer(sim_fleet):
    """Without speculation a step is one token: </think> and the stop token are steps with no text of their own."""
    url = sim_fleet(profile="b200-mtp", speed=50, server_args=("--speculative-algorithm", "none")).urls[0]
    whole = _whole(url, logprobs=True, top_logprobs=2, max_tokens=8192)["choices"][0]["logprobs"]["content"]
    chunks = _stream(url, logprobs=True, top_logprobs=2, max_tokens=8192)
    streamed, own = [], 0
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["logprobs"] is None:
                continue
            entries = choice["logprobs"]["content"]
            streamed += entries
            delta = choice["delta"]
            shown = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
            if shown:  # a text chunk: the step's tokens are its text, </think> aside (the parser takes it)
                assert "".join(e["token"] for e in entries).replace("</think>", "") == shown
            else:  # a step with no text of its own (</think>, the stop token): a chunk of its own, as SGLang
                assert delta == {"reasoning_content": None}
                own += 1
    assert streamed == whole and whole[-1]["token"] == "<|im_end|>"
    assert own == 2  # </think>'s step and the stop token's
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["logprobs"] for c in finish] == [None]


# ----- the entropy summary -----------------------------------------------------------------------------------
def test_top_k_entropy_counts_what_the_alternatives_leave_as_one_outcome():
    half_quarter = [{"logprob": math.log(0.5)}, {"logprob": math.log(0.25)}]
    assert top_k_entropy(half_quarter) == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    whole = [{"logprob": math.log(0.5)}, {"logprob": math.log(0.5)}]
    assert top_k_entropy(whole) == pytest.approx(math.log(2))  # the two hold everything: exact
    assert top_k_entropy([{"logprob": 0.0}]) == 0.0  # sure of it
    assert (
        top_k_entropy([{"logprob": 0.0}, {"logprob": -math.inf}]) == 0.0
    )  # a masked alternative adds nothing
    assert top_k_entropy([]) is None


def test_the_summary_is_the_mean_and_quantiles_of_the_tokens_read():
    summary = EntropySummary()
    for p in (1.0, 0.5, 0.9, 0.6, 0.99):
        rest = 1.0 - p
        alternatives = [{"logprob": math.log(p)}] + ([{"logprob": math.log(rest)}] if rest > 0 else [])
        summary.add({"content": [{"token": "x", "logprob": math.log(p), "top_logprobs": alternatives}]})
    summary.add(
        {"content": [{"token": "y", "logprob": -0.1, "top_logprobs": []}]}
    )  # no alternatives: not read
    summary.add(None)
    values = sorted(
        -(p * math.log(p) + (1 - p) * math.log(1 - p)) if p < 1 else 0.0 for p in (1, 0.5, 0.9, 0.6, 0.99)
    )
    got = summary.summary()
    assert got is not None and got["tokens"] == 5
    assert got["mean"] == pytest.approx(sum(values) / 5)
    assert [got["p10"], got["p50"], got["p90"]] == pytest.approx([values[0], values[2], values[4]])
    assert EntropySummary().summary() is None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_client_summarises_the_answers_entropy_whole_and_streamed(shared_sim_fleet, stream):
    url = shared_sim_fleet.urls[NEW]

    async def ask(top: int):  # type: ignore[no-untyped-def]
        caps = Capabilities("sglang", spec_details=True, logprobs=True)
        async with ServerClient(url, capabilities=caps, entropy_top_k=top) as client:
            return await client.chat(QUESTION, SamplingParams(max_tokens=200), "m", stream=stream)

    result = asyncio.run(ask(4))
    expected = EntropySummary()
    expected.add(_whole(url, logprobs=True, top_logprobs=4)["choices"][0]["logprobs"])
    assert result.entropy == expected.summary()
    assert result.entropy["tokens"] == result.completion_tokens
    assert asyncio.run(ask(0)).entropy is None


def test_the_probe_asks_for_logprobs_only_when_wanted_and_drops_them_alone(shared_sim_fleet):
    url = shared_sim_fleet.urls[NEW]

    async def probe(top: int):  # type: ignore[no-untyped-def]
        async with ServerClient(url, entropy_top_k=top) as client:
            caps = await introspect.probe(client, "m", SamplingParams(top_k=20))
            kwargs = client.request_kwargs(QUESTION, SamplingParams(max_tokens=8), "m", stream=True)
            return caps, kwargs

    caps, kwargs = asyncio.run(probe(5))
    assert caps.logprobs and caps.extra_fields and kwargs["logprobs"] is True and kwargs["top_logprobs"] == 5
    caps, kwargs = asyncio.run(probe(0))
    assert not caps.logprobs and "logprobs" not in kwargs and "top_logprobs" not in kwargs


def test_an_engine_that_refuses_logprobs_keeps_its_other_extras():
    seen: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if "logprobs" in body:
            return web.json_response(
                {"error": {"message": "logprobs are not supported", "code": 400}}, status=400
            )
        return web.json_response(
            {
                "id": "r1",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)

    async def probe(url: str):  # type: ignore[no-untyped-def]
        async with ServerClient(url, entropy_top_k=5) as client:
            return await introspect.probe(client, "m", SamplingParams(top_k=20))

    caps = serve(app, probe)
    assert not caps.logprobs and caps.extra_fields and caps.template_kwargs
    assert [("logprobs" in b, "top_k" in b) for b in seen] == [(True, True), (False, True)]


# ----- generate stores it -----------------------------------------------------------------------------------
def _prompts(path: Path) -> Path:
    rows = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(4)]
    rows.append(
        {
            "id": "multi",
            "messages": [
                {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "old"},
                {"role": "user", "content": "And then?"},
            ],
        }
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(fleet, prompts: Path, out: Path, **changes: object) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    config = build_config(
        GenerateConfig,
        {
            "servers": fleet.urls,
            "model": "Qwen/Qwen3.6-27B",
            "prompts": str(prompts),
            "out_dir": str(out),
            "max_tokens": 64,
            "max_truncated_rate": 1.0,
            "canary": False,
            "turns": "all",
            "concurrency_per_server": 8,  # the sim's own cap is SGLang's 48 without serve's flag
            **changes,
        },
    )

    async def run() -> None:
        await generate(config, await preflight(config), progress=False)

    asyncio.run(run())
    return pl.read_parquet(out / "shards" / "*.parquet")


def test_generate_stores_each_turns_entropy_summary_with_entropy_top_k(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=50)
    rows = _run(fleet, _prompts(tmp_path / "p.jsonl"), tmp_path / "on", entropy_top_k=5)
    assert rows.schema["turn_entropy"] == OUTPUT_SCHEMA["turn_entropy"]
    for row in rows.iter_rows(named=True):
        assert len(row["turn_entropy"]) == len(row["turn_after"]) == (2 if row["id"] == "multi" else 1)
        for summary, tokens in zip(row["turn_entropy"], row["turn_completion_tokens"], strict=True):
            assert summary["tokens"] == tokens
            assert 0.0 <= summary["p10"] <= summary["p50"] <= summary["p90"] <= math.log(6) + 1e-9
            assert summary["p10"] <= summary["mean"] <= summary["p90"]
    off = _run(fleet, _prompts(tmp_path / "p.jsonl"), tmp_path / "off", entropy_top_k=0)
    assert sorted(off["turn_entropy"].to_list(), key=len) == [[None]] * 4 + [[None, None]]


def test_entropy_top_k_is_refused_without_streaming():
    """A whole answer goes through the openai SDK, whose objects for top-k logprobs cost many times the CPU."""
    values = {"servers": ["http://127.0.0.1:9"], "model": "m", "prompts": "synthetic", "out_dir": "/tmp/x"}
    with pytest.raises(ParameterError, match=r"entropy_top_k \(5\) needs stream: true"):
        build_config(GenerateConfig, {**values, "entropy_top_k": 5, "stream": False})
    assert build_config(GenerateConfig, {**values, "entropy_top_k": 0, "stream": False}).entropy_top_k == 0
    with pytest.raises(ParameterError, match="entropy_top_k"):
        build_config(GenerateConfig, {**values, "entropy_top_k": 21})
