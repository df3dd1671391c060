"""The prefix cache made visible: the simulator reports ``usage.prompt_tokens_details.cached_tokens`` as SGLang 0.5.23
does (with ``--enable-cache-report`` only, in a whole answer and in a stream's usage chunk), the client reads it both
ways, generate stores it per turn with the turn's server, and the report and ``draftgen status`` show the share of
prompt tokens served from cache per server and per turn index."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest
from sim_helpers import prompt_ids

from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.client.sse import SseDecoder
from draftgen.generate import GenerateConfig, generate, preflight, report
from draftgen.params import SamplingParams, build_config
from draftgen.sim.prefix_cache import CHUNK
from draftgen.watch.status import status_report

LONG = [
    {
        "role": "user",
        "content": "Summarise these notes. " + " ".join(f"note {i} says {i * 7}." for i in range(80)),
    }
]
SAMPLING = SamplingParams(max_tokens=16)


def _stream_usage(url: str, body: dict) -> dict | None:
    """The usage chunk of one streamed chat (``choices: []``), read as the client reads SSE."""
    import urllib.request

    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        events = SseDecoder().feed(response.read())
    chunks = [json.loads(e.data) for e in events if e.data != "[DONE]"]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1 and chunks[-1].get("usage") and chunks[-1]["choices"] == []
    return usage[0]


def test_the_streamed_usage_chunk_carries_cached_tokens_only_with_enable_cache_report(sim_fleet):
    plain = sim_fleet(profile="b200-mtp", speed=50)
    reporting = sim_fleet(profile="b200-mtp", speed=50, server_args=("--enable-cache-report",))
    body = {"model": "m", "messages": LONG, "max_tokens": 8}
    cached = (len(prompt_ids(plain, LONG)) - 1) // CHUNK * CHUNK
    assert [_stream_usage(plain.urls[0], body)["prompt_tokens_details"] for _ in range(2)] == [None, None]
    first, second = (_stream_usage(reporting.urls[0], body) for _ in range(2))
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": cached} and cached > 0


@pytest.mark.parametrize("stream", [False, True])
def test_the_client_reads_cached_tokens_whole_and_streamed(sim_fleet, stream):
    plain = sim_fleet(profile="b200-mtp", speed=50)
    reporting = sim_fleet(profile="b200-mtp", speed=50, server_args=("--enable-cache-report",))
    cached = (len(prompt_ids(plain, LONG)) - 1) // CHUNK * CHUNK

    async def ask(url: str) -> list[int | None]:
        async with ServerClient(url, capabilities=Capabilities("sglang")) as client:
            return [(await client.chat(LONG, SAMPLING, "m", stream=stream)).cached_tokens for _ in range(2)]

    assert asyncio.run(ask(plain.urls[0])) == [None, None]  # the server did not say
    assert asyncio.run(ask(reporting.urls[0])) == [0, cached]


# ----- generate stores it, the report and status show it ----------------------------------------------------------
def _conversations(path: Path, count: int) -> Path:
    """Three questions each, every user turn pasting notes of its own: later turns repeat a long history."""
    with open(path, "w") as out:
        for i in range(count):
            messages = []
            for k in range(3):
                if k:
                    messages.append({"role": "assistant", "content": "an older answer"})
                notes = " ".join(f"c{i} q{k} note {j} says {j * 7}." for j in range(60))
                messages.append({"role": "user", "content": f"{notes}\n\nQuestion {k} of {i}?"})
            out.write(json.dumps({"id": f"c{i:03d}", "messages": messages}) + "\n")
    return path


def _config(fleet, prompts: Path, out: Path, **changes: object) -> GenerateConfig:  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out),
        "max_tokens": 64,
        "concurrency_per_server": 4,
        "max_truncated_rate": 1.0,
        "canary": False,
        "turns": "all",
        **changes,
    }
    return build_config(GenerateConfig, values)


def _run(config: GenerateConfig) -> None:
    async def run() -> None:
        plan = await preflight(config)
        await generate(config, plan, progress=False)

    asyncio.run(run())


def test_generate_stores_each_turns_cached_tokens_and_server_and_the_report_shows_the_share(
    sim_fleet, tmp_path: Path
) -> None:
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=50, server_args=("--enable-cache-report",))
    prompts = _conversations(tmp_path / "p.jsonl", 24)
    config = _config(fleet, prompts, tmp_path / "run")
    _run(config)
    rows = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet")
    assert rows.height == 24
    truth = {r["rid"]: r for i in range(2) for r in fleet.truth(i) if r.get("kind") == "chat"}
    for row in rows.iter_rows(named=True):
        assert len(row["turn_cached_tokens"]) == len(row["turn_server"]) == 3
        assert row["turn_server"][-1] == row["server"] and set(row["turn_server"]) <= set(fleet.urls)
        # the last turn's record on its server (the response id is the server's rid)
        assert row["turn_cached_tokens"][-1] == truth[row["response_id"]]["cached_tokens"]
        assert row["turn_cached_tokens"][0] == 0  # nothing of a first question is anywhere yet
    later = rows.select(pl.col("turn_cached_tokens").list.slice(1)).explode("turn_cached_tokens")
    assert (later["turn_cached_tokens"] > 0).mean() >= 0.9  # each later turn found its history on its server

    tables = report.cache_share(tmp_path / "run")
    by_turn = {r["turn"]: r for r in tables["turn"].iter_rows(named=True)}
    assert set(by_turn) == {0, 1, 2} and all(r["turns"] == 24 for r in by_turn.values())
    assert by_turn[0]["cached_share"] == 0 and by_turn[2]["cached_share"] > by_turn[1]["cached_share"] > 0.3
    assert set(tables["server"]["server"]) <= set(fleet.urls) and tables["server"]["turns"].sum() == 72
    cached = sum(r["cached_tokens"] for r in by_turn.values())
    prompt = sum(r["prompt_tokens"] for r in by_turn.values())
    assert report.summary(tmp_path / "run")["cached_share"][0] == pytest.approx(cached / prompt, abs=1e-4)
    assert "Prefix cache, per turn" in str(report.cache_view(tmp_path / "run"))

    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert [pair[0] for pair in progress["cache_by_turn"]] == [by_turn[t]["prompt_tokens"] for t in range(3)]
    assert sum(s["cached_tokens"] for s in progress["servers"]) == cached
    text = status_report(tmp_path / "run").text
    assert f"{cached / prompt:.1%} of prompt tokens from the servers' prefix caches" in text
    assert f"3rd {by_turn[2]['cached_share']:.1%}" in text


def test_without_the_cache_report_nothing_is_claimed(sim_fleet, tmp_path: Path) -> None:
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=50)
    config = _config(fleet, _conversations(tmp_path / "p.jsonl", 4), tmp_path / "run")
    _run(config)
    rows = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet")
    assert rows["turn_cached_tokens"].to_list() == [[None] * 3] * 4
    assert rows["turn_server"].to_list() == [[fleet.urls[0]] * 3] * 4
    assert report.cache_share(tmp_path / "run")["turn"].height == 0
    assert report.summary(tmp_path / "run")["cached_share"][0] is None
    assert "no stored turn reported its cached tokens" in str(report.cache_view(tmp_path / "run"))
    assert "prefix caches" not in status_report(tmp_path / "run").text


def test_validate_dataset_card_states_the_cache_share_per_server_and_turn(tmp_path, tokenizer_dir, tokenizer):
    from validate_helpers import clean_rows, write_generation

    from draftgen.validate.config import ValidateConfig
    from draftgen.validate.pipeline import finalize_export, validate_generation

    rows = clean_rows(16)
    for i, row in enumerate(rows):
        answers = len(row.get("turn_after") or [0])
        row["turn_prompt_tokens"] = [20 * (t + 1) for t in range(answers)]
        row["turn_cached_tokens"] = [0 if t == 0 else 10 for t in range(answers)]
        row["turn_server"] = [f"http://127.0.0.1:3000{i % 2}"] * answers
    write_generation(tmp_path / "gen", rows)
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(tmp_path / "gen"),
            "tokenizer": str(tokenizer_dir),
            "out_dir": str(tmp_path / "v"),
        },
    )
    export = finalize_export(validate_generation(config, tokenizer=tokenizer, progress=False))
    cache = json.loads((export / "dataset_info.json").read_text())["prefix_cache"]
    multi = sum(1 for row in rows if len(row["turn_prompt_tokens"]) == 2)  # 4 two-turn rows, 12 single-turn
    assert [(t["turn"], t["turns"], t["cached_tokens"]) for t in cache["by_turn"]] == [
        (0, 16, 0),
        (1, multi, 40),
    ]
    assert cache["share"] == pytest.approx(40 / (16 * 20 + multi * 40))
    assert {s["server"] for s in cache["by_server"]} == {"http://127.0.0.1:30000", "http://127.0.0.1:30001"}
    readme = (export / "README.md").read_text()
    assert (
        f"| prompt tokens served from the servers' prefix caches | {cache['share']:.1%} of prompt tokens"
        in readme
    )
