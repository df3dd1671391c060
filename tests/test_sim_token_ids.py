"""The simulator's token ids: consistent with its text and tokenizer, in SGLang 0.5.23's shape, stored by generate.

Prompt ids are the chat template's rendering encoded (prompt_tokens == their number); output ids decode to exactly
the text sent (reasoning, ``</think>``, answer) and end with the EOS on a stop (completion_tokens == their number);
streaming sends the same ids as a plain request; the ``noncanonical_ids`` fault sends ids that decode to the same
text but are not what re-encoding it gives. A generate run on the simulator stores them per turn, and expanding
the stored prompt ids gives each turn's prompt as the server rendered it.
"""

from __future__ import annotations

import itertools
import json

import polars as pl
import pytest
from sim_helpers import USER, post, post_json, prompt_ids, sse_json, tokenizer_of, truth_for

from draftgen.training.token_ids import expand

IDS = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
MODEL = "Qwen/Qwen3.6-27B"


def chat(url: str, **body) -> dict:
    status, reply = post_json(f"{url}/v1/chat/completions", {"model": MODEL, "messages": USER, **body})
    assert status == 200, reply
    return reply


def stream(url: str, **body) -> list[dict]:
    payload = {"model": MODEL, "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    status, raw = post(f"{url}/v1/chat/completions", {**payload, **body})
    assert status == 200, raw[:300]
    chunks, done = sse_json(raw)
    assert done
    return chunks


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("max_tokens", [4096, 40])
def test_ids_match_the_text_the_template_and_the_usage(shared_sim_fleet, thinking, max_tokens):
    fleet, url = shared_sim_fleet, shared_sim_fleet.urls[2]
    tokenizer = tokenizer_of(fleet)
    reply = chat(url, max_tokens=max_tokens, chat_template_kwargs={"enable_thinking": thinking}, **IDS)
    choice, usage, ext = reply["choices"][0], reply["usage"], reply["sglext"]
    assert ext["input_ids"] == prompt_ids(fleet, USER, thinking) and usage["prompt_tokens"] == len(
        ext["input_ids"]
    )
    (output,) = ext["output_ids"]
    assert len(output) == usage["completion_tokens"]
    message = choice["message"]
    raw = (
        message["reasoning_content"] + "</think>" if thinking and choice["finish_reason"] == "stop" else ""
    ) + (message["content"] or "")
    if not (thinking and choice["finish_reason"] == "length"):
        assert tokenizer.decode(output) == (raw if thinking else message["content"])
    else:
        assert tokenizer.decode(output) == message["reasoning_content"]  # cut inside its thinking
    if choice["finish_reason"] == "stop":
        assert output[-1] == tokenizer.eos_id == choice["matched_stop"]
        assert tokenizer.encode(tokenizer.decode(output)) == output[:-1]  # canonical
    else:
        assert tokenizer.eos_id not in output and len(output) == max_tokens
    truth = truth_for(fleet, reply["id"], 2)
    assert (truth["prompt_tokens"], truth["completion_tokens"]) == (len(ext["input_ids"]), len(output))


def test_ids_only_when_asked_and_by_header_too(shared_sim_fleet):
    url = shared_sim_fleet.urls[2]
    assert "sglext" not in chat(url, max_tokens=32)
    headers = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
    request_body = json.dumps({"model": MODEL, "messages": USER, "max_tokens": 32}).encode()
    import urllib.request

    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=request_body,
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        body = json.loads(reply.read())
    assert set(body["sglext"]) == {"input_ids", "output_ids"} and len(body["sglext"]["output_ids"][0]) == 32
    only_input = chat(url, max_tokens=8, return_input_ids_in_sglext=True)
    assert set(only_input["sglext"]) == {"input_ids"}


def test_streamed_ids_equal_the_plain_requests_and_cut_the_text_at_token_boundaries(shared_sim_fleet):
    fleet, url = shared_sim_fleet, shared_sim_fleet.urls[2]
    tokenizer = tokenizer_of(fleet)
    plain = chat(url, max_tokens=4096, **IDS, return_spec_tokens_details=True)
    chunks = stream(url, max_tokens=4096, **IDS, return_spec_tokens_details=True)
    tails = [c for c in chunks if c["choices"] == []]
    assert [sorted(c) for c in tails] == [
        ["choices", "created", "id", "model", "object", "sglext", "usage"],  # sglext first, usage null
        ["choices", "created", "id", "model", "object", "usage"],
    ]
    assert tails[0]["usage"] is None and "spec_tokens_details" in tails[0]["sglext"]
    assert tails[0]["sglext"]["input_ids"] == plain["sglext"]["input_ids"]
    assert tails[0]["sglext"]["output_ids"] == plain["sglext"]["output_ids"]
    # every text delta ends on a token boundary of the raw output (reasoning, "</think>", answer)
    pieces = [tokenizer.piece(i) for i in plain["sglext"]["output_ids"][0]]
    boundaries = {len("".join(pieces[:n])) for n in range(len(pieces) + 1)}
    offset, answering = 0, False
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                offset += len(delta["reasoning_content"])
                assert offset in boundaries
            if delta.get("content"):
                offset += 0 if answering else len("</think>")
                answering = True
                offset += len(delta["content"])
                assert offset in boundaries
    assert offset == len("".join(pieces))


def test_noncanonical_fault_decodes_to_the_same_text_but_not_from_re_encoding(sim_fleet):
    fleet = sim_fleet(servers=1, profile="instant", faults=["noncanonical_ids=1"])
    tokenizer = tokenizer_of(fleet)
    for thinking in (True, False):
        reply = chat(
            fleet.urls[0], max_tokens=4096, chat_template_kwargs={"enable_thinking": thinking}, **IDS
        )
        (output,) = reply["sglext"]["output_ids"]
        message = reply["choices"][0]["message"]
        text = (
            (message["reasoning_content"] + "</think>" + message["content"])
            if thinking
            else message["content"]
        )
        assert tokenizer.decode(output) == text
        assert tokenizer.encode(text) != output[:-1]  # what validate's re-tokenizing would get
        assert len(output) == reply["usage"]["completion_tokens"] > len(tokenizer.encode(text)) + 1
        assert truth_for(fleet, reply["id"], 0)["noncanonical"] is True


def test_generate_output_ids_are_cumulative_when_streaming(shared_sim_fleet):
    fleet, url = shared_sim_fleet, shared_sim_fleet.urls[2]
    tokenizer = tokenizer_of(fleet)
    body = {"text": "Hello there", "sampling_params": {"max_new_tokens": 64}}
    status, full = post_json(f"{url}/generate", body)
    assert status == 200
    assert full["output_ids"][: len(tokenizer.encode(full["text"]))] == tokenizer.encode(full["text"])
    status, raw = post(f"{url}/generate", {**body, "stream": True})
    events, done = sse_json(raw)
    assert done and events[-1]["output_ids"] == full["output_ids"]
    for earlier, later in itertools.pairwise(events):
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
        assert tokenizer.decode(later["output_ids"]) == later["text"]


def test_a_generate_run_on_the_sim_stores_every_turns_ids(instant_fleet, tmp_path):
    """Multi-turn rows: expanding the stored prompt ids gives each turn's prompt exactly as the server rendered
    it (the history re-rendered by the template, tools and calls included), the output ids decode to each turn's
    text (and its calls' text, which the parser took out of content)."""
    from test_generate_multiturn import config_for, conversations, run, sent_messages, write_rows

    from draftgen.sim.toolcalls import SimCall, call_text
    from draftgen.training.conversation import generated_calls, stored_tools

    rows = conversations(40, seed=3)
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    fleet = instant_fleet(2)
    outcome = run(config_for(fleet, prompts, tmp_path / "run"))
    assert outcome.status == "complete"
    tokenizer = tokenizer_of(fleet)
    frame = pl.read_parquet(tmp_path / "run" / "shards")
    assert frame.schema["turn_output_ids"] == pl.List(pl.List(pl.UInt32))
    assert frame.schema["turn_prompt_ids"] == pl.List(pl.List(pl.UInt32))
    assert frame.schema["turn_prompt_shared"] == pl.List(pl.Int32)
    multi = shared_total = 0
    for row in frame.rows(named=True):
        turns = len(row["turn_after"])
        outputs = row["turn_output_ids"]
        assert len(outputs) == turns and all(o is not None for o in outputs), row["id"]
        full = expand(row["turn_prompt_shared"], row["turn_prompt_ids"], outputs)
        calls = generated_calls(row, turns)
        for turn in range(turns):
            sent = list(sent_messages(row, turn))
            assert full[turn] == prompt_ids(fleet, sent, True, stored_tools(row)), (row["id"], turn)
            assert len(full[turn]) == row["turn_prompt_tokens"][turn]
            assert len(outputs[turn]) == row["turn_completion_tokens"][turn]
            reasoning, content = row["turn_reasoning"][turn] or "", row["turn_content"][turn] or ""
            finish = row["turn_finish_reason"][turn]
            # a turn cut at max_tokens after its reasoning ended holds </think> and part of its answer too
            thought = finish in ("stop", "tool_calls") or tokenizer.think_end_id in outputs[turn]
            raw = reasoning + "</think>" + content if thought else reasoning
            if calls[turn]:  # the parser took the calls' text out of content: the ids still hold it
                made = [
                    SimCall(c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in calls[turn]
                ]
                raw += call_text(made, after_answer=False)
            assert tokenizer.decode(outputs[turn]) == raw, (row["id"], turn)
        multi += turns > 1
        shared_total += sum(row["turn_prompt_shared"][1:])
    assert multi > 10 and shared_total > 0  # later turns really share their history instead of storing it
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    servers = manifest["sessions"][-1]["servers"]
    assert sorted(s["url"] for s in servers) == sorted(fleet.urls)
    assert {(s["engine"], s["version"], s["token_ids"]) for s in servers} == {("sglang", "0.5.23", "sglext")}
