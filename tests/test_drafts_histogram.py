"""What a drafter learns from, kept per turn: SGLang 0.5.23's ``spec_correct_drafts_histogram``.

The simulator sends it as SGLang does (element k: the verify steps that accepted exactly k drafts, the list as long
as the most drafts any step accepted + 1; in the whole answer's and the stream's ``sglext``, and in ``/generate``'s
last ``meta_info`` only); the client reads it both ways; generate stores it per turn, multi-turn rows included, and
a folder with shards written before the column existed still reads and resumes; generate's report and validate's
card show acceptance per draft position from it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import matplotlib
import polars as pl
import pytest
from sim_helpers import post_json

from draftgen.client.records import Capabilities
from draftgen.client.server import ServerClient
from draftgen.client.sse import SseDecoder
from draftgen.display.position_plots import TITLE, acceptance_by_position
from draftgen.draft_positions import COLUMN, DraftPositions, from_histograms, from_rows
from draftgen.generate import GenerateConfig, generate, preflight, report
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.params import SamplingParams, build_config
from draftgen.rundir.layout import GENERATE_PLOT_BY_POSITION, PLOTS, plot_file

matplotlib.use("Agg")

QUESTION = [{"role": "user", "content": "Tell me about the weather in three sentences."}]
NEW = 2  # the shared fleet's SGLang 0.5.23 server (conftest.SHARED_SIM_SHAPES)


def _details(url: str, *, stream: bool, max_tokens: int = 300) -> tuple[dict, int]:
    """(sglext.spec_tokens_details, completion tokens) of one chat, whole or streamed (the raw SSE read)."""
    body = {
        "model": "m",
        "messages": QUESTION,
        "max_tokens": max_tokens,
        "return_spec_tokens_details": True,
    }
    if not stream:
        status, reply = post_json(f"{url}/v1/chat/completions", body)
        assert status == 200, reply
        return reply["sglext"]["spec_tokens_details"], reply["usage"]["completion_tokens"]
    import urllib.request

    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        events = SseDecoder().feed(response.read())
    chunks = [json.loads(e.data) for e in events if e.data != "[DONE]"]
    [ext] = [c for c in chunks if "sglext" in c]
    assert ext["choices"] == [] and ext["usage"] is None
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    return ext["sglext"]["spec_tokens_details"], usage["completion_tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_simulator_counts_verify_steps_by_drafts_accepted_as_sglang_does(shared_sim_fleet, stream):
    url = shared_sim_fleet.urls[NEW]
    details, tokens = _details(url, stream=stream)
    histogram = details["spec_correct_drafts_histogram"]
    assert sum(histogram) == details["spec_verify_ct"]
    assert sum(k * steps for k, steps in enumerate(histogram)) == details["spec_num_correct_drafts"]
    assert details["spec_num_correct_drafts"] == tokens - details["spec_verify_ct"]
    # SGLang grows the list as drafts are accepted (Req.update_spec_correct_drafts_histogram): no trailing zeros,
    # and never longer than the drafts a step proposes (b200-mtp: 3/1/4, so 0…3 drafts)
    assert histogram[-1] > 0 and 1 <= len(histogram) <= 4
    assert details["spec_cap_lens_histogram"] == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_short_answer_gets_a_histogram_only_as_long_as_its_steps_reached(shared_sim_fleet, stream):
    """Three tokens leave no room for a step of three drafts: SGLang's list stops at the most any step accepted
    (a fixed-width list, as draft_tokens long, would end in zeros)."""
    for _ in range(4):
        details, tokens = _details(shared_sim_fleet.urls[NEW], stream=stream, max_tokens=3)
        histogram = details["spec_correct_drafts_histogram"]
        assert tokens == 3 and len(histogram) <= 3 and histogram[-1] > 0, histogram
        assert sum(histogram) == details["spec_verify_ct"]


def test_generate_meta_info_adds_the_acceptance_fields_once_finished(shared_sim_fleet):
    """SGLang 0.5.23's tokenizer manager adds the spec fields to meta_info when the request has finished: a
    streamed /generate carries them in its last event only."""
    import urllib.request

    url = shared_sim_fleet.urls[NEW]
    body = {"text": "The weather today is", "sampling_params": {"max_new_tokens": 64}, "stream": True}
    request = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [json.loads(e.data) for e in SseDecoder().feed(response.read()) if e.data != "[DONE]"]
    assert len(events) > 2
    *partial, last = events
    assert all("spec_correct_drafts_histogram" not in e["meta_info"] for e in partial)
    assert all("spec_verify_ct" not in e["meta_info"] for e in partial)
    meta = last["meta_info"]
    assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"] > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_client_reads_the_histogram_whole_and_streamed(shared_sim_fleet, stream):
    url = shared_sim_fleet.urls[NEW]
    old = shared_sim_fleet.urls[0]  # SGLang 0.5.4's shape: no acceptance data in the chat API

    async def ask(server: str):  # type: ignore[no-untyped-def]
        async with ServerClient(server, capabilities=Capabilities("sglang", spec_details=True)) as client:
            return await client.chat(QUESTION, SamplingParams(max_tokens=300), "m", stream=stream)

    result = asyncio.run(ask(url))
    assert result.drafts_histogram is not None
    assert sum(result.drafts_histogram) == result.spec_verify_ct
    assert result.drafts_histogram == _details(url, stream=stream)[0]["spec_correct_drafts_histogram"]
    assert asyncio.run(ask(old)).drafts_histogram is None


# ----- generate stores it; old folders still read ----------------------------------------------------------
def _prompts(path: Path, count: int) -> Path:
    """Single-turn rows and, every third, a three-question conversation (``turns: all`` answers every one)."""
    with open(path, "w") as out:
        for i in range(count):
            if i % 3:
                messages = [{"role": "user", "content": f"Question {i}: why is the sky blue?"}]
            else:
                messages = [
                    {"role": "user", "content": f"Chat {i}: hello."},
                    {"role": "assistant", "content": "an older answer"},
                    {"role": "user", "content": "And then?"},
                    {"role": "assistant", "content": "another older answer"},
                    {"role": "user", "content": "Why?"},
                ]
            out.write(json.dumps({"id": f"p{i:03d}", "messages": messages}) + "\n")
    return path


def _config(fleet, prompts: Path, out: Path, **changes: object) -> GenerateConfig:  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(out),
        "max_tokens": 96,
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


def _truth(fleet) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {r["rid"]: r for i in range(len(fleet.urls)) for r in fleet.truth(i) if r.get("kind") == "chat"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_generate_stores_every_turns_histogram(sim_fleet, tmp_path, stream):
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=50)
    _run(_config(fleet, _prompts(tmp_path / "p.jsonl", 12), tmp_path / "run", stream=stream))
    rows = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet")
    assert rows.height == 12 and rows.schema[COLUMN] == OUTPUT_SCHEMA[COLUMN]
    truth = _truth(fleet)
    for row in rows.iter_rows(named=True):
        histograms = row[COLUMN]
        assert len(histograms) == len(row["turn_after"]) == (1 if int(row["id"][1:]) % 3 else 3)
        for histogram, verify, tokens in zip(
            histograms, row["turn_spec_verify_ct"], row["turn_completion_tokens"], strict=True
        ):
            assert sum(histogram) == verify and histogram[-1] > 0
            assert sum(k * n for k, n in enumerate(histogram)) == tokens - verify  # the sim's drafts
        assert sum(histograms[-1]) == truth[row["response_id"]]["verify_steps"]  # the server's own count
    positions = report.draft_positions(tmp_path / "run")
    assert positions.turns == rows[COLUMN].list.len().sum()
    assert positions.verify_steps == rows["spec_verify_ct"].sum()
    every = [h for hs in rows[COLUMN].to_list() for h in hs]
    assert positions == from_histograms(every)
    shares = positions.table()["share"].to_list()
    assert shares == sorted(shares, reverse=True) and 0 < shares[-1] < shares[0] < 1  # a chain: each falls


def _drop_column(shard: Path) -> None:
    """The shard as a draftgen before the column wrote it."""
    pl.read_parquet(shard).drop(COLUMN).write_parquet(shard)


def test_a_folder_with_shards_older_than_the_column_reads_and_resumes(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=50)
    prompts, out = _prompts(tmp_path / "p.jsonl", 9), tmp_path / "run"
    _run(_config(fleet, prompts, out, limit=4, batch_save_size=4))
    [old] = sorted((out / "shards").glob("*.parquet"))
    _drop_column(old)
    old_turns = pl.read_parquet(old)["turn_after"].list.len().sum()
    assert COLUMN not in pl.read_parquet(old).columns
    _run(_config(fleet, prompts, out, batch_save_size=4))  # resumes: the 5 prompts not stored
    rows = report.scan_results(out).collect()
    assert rows.height == 9
    shards = sorted((out / "shards").glob("*.parquet"))
    new = pl.concat([pl.read_parquet(s) for s in shards if s != old])
    assert new.height == 5 and new[COLUMN].list.len().sum() == new["turn_after"].list.len().sum()
    positions = report.draft_positions(out)
    assert positions.turns == new[COLUMN].list.len().sum() and positions.turns + old_turns == 6 + 3 * 3
    assert positions.verify_steps == new["spec_verify_ct"].sum()
    assert "Acceptance per draft position" in str(report.draft_positions_view(out))


def test_the_report_plot_asks_its_question_and_says_when_there_is_nothing(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=50)
    _run(_config(fleet, _prompts(tmp_path / "p.jsonl", 3), tmp_path / "run"))
    plot = report.plot_acceptance_by_position(tmp_path / "run")
    assert plot.path == tmp_path / "run" / PLOTS / plot_file(GENERATE_PLOT_BY_POSITION)
    [axes] = plot.figure.axes
    assert axes.get_title().startswith(TITLE + "\n(")
    positions = report.draft_positions(tmp_path / "run")
    heights = [patch.get_height() for patch in axes.patches]
    assert heights == pytest.approx(positions.table()["share"].to_list())

    plain = sim_fleet(
        servers=1, profile="b200-mtp", speed=50, server_args=("--speculative-algorithm", "none")
    )
    _run(_config(plain, _prompts(tmp_path / "q.jsonl", 3), tmp_path / "plain"))
    rows = pl.read_parquet(tmp_path / "plain" / "shards" / "*.parquet")
    # no speculation: nothing sent, nothing claimed, every turn a null element
    assert sorted(rows[COLUMN].to_list(), key=len) == [[None], [None], [None] * 3]
    empty = report.plot_acceptance_by_position(tmp_path / "plain").figure.axes[0]
    assert "no drafts histogram" in empty.texts[0].get_text() and not empty.patches
    assert "the servers sent none" in str(report.draft_positions_view(tmp_path / "plain"))


# ----- the sums ----------------------------------------------------------------------------------------------
def test_position_shares_are_what_the_counts_say():
    positions = DraftPositions((10, 20, 30, 40), turns=4)
    table = positions.table()
    assert table["position"].to_list() == [1, 2, 3]
    assert table["accepted"].to_list() == [90, 70, 40]
    assert table["share"].to_list() == pytest.approx([0.9, 0.7, 0.4])
    assert table["given_previous"].to_list() == pytest.approx([0.9, 70 / 90, 40 / 70])
    assert positions.as_dict() == {
        "turns": 4,
        "verify_steps": 100,
        "steps_by_drafts_accepted": [10, 20, 30, 40],
        "share_by_position": [0.9, 0.7, 0.4],
    }
    assert DraftPositions((5,), 1).table().is_empty()  # no step got past its first draft: no position reached
    assert DraftPositions((), 0).table().is_empty()


def test_summing_in_polars_equals_summing_by_hand():
    histograms = [[[3, 1], None], [[0, 0, 2, 5]], None, [[]], [[1], [4, 4, 4]]]
    frame = pl.LazyFrame({COLUMN: histograms}, schema={COLUMN: OUTPUT_SCHEMA[COLUMN]})
    flat = [h for row in histograms if row is not None for h in row]
    assert from_rows(frame) == from_histograms(flat) == DraftPositions((8, 5, 6, 5), turns=5)
    absent = pl.LazyFrame({COLUMN: [None, None]}, schema={COLUMN: OUTPUT_SCHEMA[COLUMN]})
    assert from_rows(absent) == DraftPositions((), 0)
    figure = acceptance_by_position(from_rows(frame))
    assert [p.get_height() for p in figure.axes[0].patches] == pytest.approx([16 / 24, 11 / 24, 5 / 24])


def test_validate_card_states_acceptance_per_draft_position(tmp_path, tokenizer_dir, tokenizer):
    from validate_helpers import clean_rows, write_generation

    from draftgen.validate.config import ValidateConfig
    from draftgen.validate.pipeline import finalize_export, validate_generation

    rows = clean_rows(8)
    for i, row in enumerate(rows):
        answers = len(row.get("turn_after") or [0])
        row[COLUMN] = [[1, 2, 3] if i % 2 else None for _ in range(answers)]
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
    info = json.loads((export / "dataset_info.json").read_text())["draft_positions"]
    turns = sum(len(r.get("turn_after") or [0]) for i, r in enumerate(rows) if i % 2)
    assert info == {
        "turns": turns,
        "verify_steps": 6 * turns,
        "steps_by_drafts_accepted": [turns, 2 * turns, 3 * turns],
        "share_by_position": [round(5 / 6, 4), 0.5],
    }
    readme = (export / "README.md").read_text()
    assert (
        f"| acceptance per draft position while generating | 1 83.3%, 2 50.0% of {6 * turns:,} verify"
        in readme
    )


def test_a_card_without_histograms_says_so(tmp_path, tokenizer_dir, tokenizer):
    from validate_helpers import clean_rows, write_generation

    from draftgen.validate.config import ValidateConfig
    from draftgen.validate.pipeline import finalize_export, validate_generation

    folder = write_generation(tmp_path / "gen", clean_rows(6))
    for shard in (folder / "shards").glob("*.parquet"):
        _drop_column(shard)  # written before the column existed
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(tmp_path / "gen"),
            "tokenizer": str(tokenizer_dir),
            "out_dir": str(tmp_path / "v"),
        },
    )
    export = finalize_export(validate_generation(config, tokenizer=tokenizer, progress=False))
    info = json.loads((export / "dataset_info.json").read_text())["draft_positions"]
    assert info["turns"] == 0 and info["share_by_position"] == []
    assert (
        "acceptance per draft position while generating | not reported" in (export / "README.md").read_text()
    )
