"""Planted generation outputs for the validate tests, written with polars in generate's shard contract
(docs/design.md#generation-output-the-run-folder).

``clean_rows(n)`` are samples no check should flag; ``planted_rows()`` holds at least one sample per flag, each
with the flag it must raise. ``write_generation(folder, rows)`` writes ``shards/*.parquet`` + ``manifest.json``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl

from draftgen.generate.store import OUTPUT_SCHEMA

WORDS = (
    "so we need the sum of each term then check the value again because the list is sorted and the loop "
    "runs over every index until the result equals the target number which gives two cases to compare"
).split()
# The columns a generate shard carries that these helpers fill, typed as the store writes them.
SCHEMA = {
    name: OUTPUT_SCHEMA[name]
    for name in (
        *("id", "messages", "reasoning_content", "content", "finish_reason", "prompt_tokens"),
        *("completion_tokens", "spec_accept_length", "spec_verify_ct", "server", "latency_s", "attempts"),
        *("turn_after", "turn_content", "turn_reasoning", "turn_finish_reason", "turns_mode"),
        *("turn_prompt_tokens", "turn_completion_tokens"),
        *("turn_prompt_shared", "turn_prompt_ids", "turn_output_ids", "turn_budget_by"),
        *("message_extras", "tools", "turn_tool_calls", "tool_divergence"),
        *("turn_server", "turn_cached_tokens", "turn_drafts_histogram"),
    )
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def row(
    sample_id: str,
    *,
    reasoning: str | None,
    content: str | None,
    finish_reason: str | None = "stop",
    messages: list[dict] | None = None,
) -> dict:
    return {
        "id": sample_id,
        "messages": messages or [{"role": "user", "content": f"Question {sample_id}: what is the sum?"}],
        "reasoning_content": reasoning,
        "content": content,
        "finish_reason": finish_reason,
        "prompt_tokens": 20,
        "completion_tokens": 100,
        "spec_accept_length": 3.1,
        "spec_verify_ct": 30,
        "server": "http://127.0.0.1:30000",
        "latency_s": 1.5,
        "attempts": 1,
    }


def clean_rows(count: int, seed: int = 0, prefix: str = "clean") -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        messages = [{"role": "user", "content": f"Task {i}: {_text(rng, 12)}"}]
        if i % 4 == 1:
            messages.insert(0, {"role": "system", "content": "You answer concisely and precisely."})
        if i % 4 == 2:  # multi-turn: the source's assistant turn is replaced by the target's own (turns: all)
            messages = [
                {"role": "user", "content": f"First {i}: {_text(rng, 6)}"},
                {"role": "assistant", "content": "Source model's answer: " + _text(rng, 10)},
                {"role": "user", "content": f"Then {i}: {_text(rng, 8)}"},
            ]
        answer = f"Answer {i}: {_text(rng, rng.randint(8, 30))}"
        sample = row(
            f"{prefix}-{i:04d}", reasoning=_text(rng, rng.randint(20, 60)), content=answer, messages=messages
        )
        if i % 4 == 2:
            first = (f"First answer {i}: {_text(rng, 9)}", _text(rng, 25))
            sample.update(turns(sample, [(0, *first), (2, answer, sample["reasoning_content"])], "all"))
        rows.append(sample)
    return rows


def turns(sample: dict, answers: list[tuple[int, str | None, str | None]], mode: str) -> dict:
    """The multi-turn columns of a row: per generated turn (turn_after, content, reasoning), all finished."""
    return {
        "turn_after": [after for after, _, _ in answers],
        "turn_content": [content for _, content, _ in answers],
        "turn_reasoning": [reasoning for _, _, reasoning in answers],
        "turn_finish_reason": ["stop"] * len(answers),
        "turns_mode": mode,
    }


def planted_rows(rng_seed: int = 1, duplicate_prompts: int = 3) -> list[tuple[dict, str]]:
    """(row, the flag it must raise): every flag at least once."""
    rng = random.Random(rng_seed)
    think = _text(rng, 30)
    long_answer = " ".join(_text(rng, 40) for _ in range(12))
    planted = [
        (row("bad-empty-answer", reasoning=think, content=""), "empty_answer"),
        (row("bad-null-answer", reasoning=think, content=None), "empty_answer"),
        (
            row("bad-empty-reasoning", reasoning="", content="The sum is 12, " + _text(rng, 20)),
            "empty_reasoning",
        ),
        (
            row("bad-unclosed", reasoning=think + " and then", content=None, finish_reason="length"),
            "unclosed_think",
        ),
        (
            row("bad-unclosed-raw", reasoning=think, content="<think>\nlet me see " + _text(rng, 20)),
            "unclosed_think",
        ),
        (
            row(
                "bad-truncated",
                reasoning=think,
                content="The sum is " + _text(rng, 20),
                finish_reason="length",
            ),
            "truncated",
        ),
        (
            row("bad-no-finish", reasoning=think, content="The sum is " + _text(rng, 20), finish_reason=None),
            "truncated",
        ),
        (
            row(
                "bad-loop",
                reasoning=think + " Wait, again." * 2,
                content=None,
                finish_reason="repetition_loop",
            ),
            "repetition_loop",
        ),
        (row("bad-six", reasoning="", content="OK."), "tiny_mask"),
        (row("bad-tiny", reasoning="Easy.", content="OK."), "tiny_mask"),
        (row("bad-long", reasoning=think, content=long_answer), "over_max_length"),
        (
            row("bad-markers", reasoning=think, content="</think>\n\nThe sum is " + _text(rng, 10)),
            "think_markers_in_answer",
        ),
        (
            row("bad-fffd", reasoning=think, content="The sum is \ufffd\ufffd " + _text(rng, 10)),
            "invalid_text",
        ),
        (row("bad-nul", reasoning=think + "\x00", content="The sum is " + _text(rng, 10)), "invalid_text"),
        (
            row("bad-surrogate", reasoning=think, content="Smile \\ud83d then " + _text(rng, 10)),
            "invalid_text",
        ),
        (
            row(
                "bad-prompt-text",
                reasoning=think,
                content="The sum is " + _text(rng, 10),
                messages=[{"role": "user", "content": "Broken \ufffd prompt"}],
            ),
            "invalid_text",
        ),
        (
            row(
                "bad-template",  # the prompt ends with an assistant turn: rendered as final turn vs as history
                reasoning=think,
                content="The sum is " + _text(rng, 10),
                messages=[
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello there."},
                ],
            ),
            "template_mismatch",
        ),
    ]
    history = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "Another model wrote this answer: four."},
        {"role": "user", "content": "And times three?"},
    ]
    foreign = row("bad-foreign", reasoning=think, content="Twelve, " + _text(rng, 12), messages=history)
    foreign.update(turns(foreign, [(2, foreign["content"], think)], "last"))
    planted.append((foreign, "foreign_assistant_turn"))
    for i in range(duplicate_prompts):
        planted.append(
            (
                row(f"bad-dup-{i}", reasoning=_text(rng, 25), content="I cannot help with that request."),
                "duplicate_answer",
            )
        )
    return planted


def server_ids(
    tokenizer,
    history: list[dict],
    reasoning: str | None,
    content: str | None,
    thinking: bool = True,
    *,
    tools: list[dict] | None = None,
    calls: list[dict] | tuple = (),
):  # type: ignore[no-untyped-def]
    """(prompt ids, output ids) a faithful server returns for one answer: the template's rendering of the
    request with its generation prompt, and the canonical tokens of what follows it up to the end-of-turn token
    (the text the model generated, its tool calls included; the template's newline after <|im_end|> is not part of
    it). ``tools``: the conversation's, rendered into the prompt."""
    from draftgen.training.trainers import specforge_calls

    answer = {"role": "assistant", "content": content or "", "reasoning_content": reasoning or ""}
    if calls:
        answer["tool_calls"] = specforge_calls(list(calls))
    history = [
        {**m, "tool_calls": specforge_calls(list(m["tool_calls"]))} if m.get("tool_calls") else m
        for m in history
    ]

    def render(turns: list[dict], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            turns,
            tools=tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            enable_thinking=thinking,
        )

    def after_prompt(turns: list[dict]) -> str | None:
        head, full = render(turns, True), render([*turns, answer], False)
        return full[len(head) :] if full.startswith(head) else None

    prompt = render(history, True)
    # What the model wrote after its prompt; a history the template renders otherwise once an answer follows (it
    # ends with an assistant turn) does not change what was generated.
    generated = after_prompt(history)
    if generated is None:
        generated = after_prompt([{"role": "user", "content": "x"}])
    assert generated is not None
    generated = generated[: generated.rindex("<|im_end|>") + len("<|im_end|>")]
    encode = tokenizer.backend_tokenizer.encode
    return encode(prompt, add_special_tokens=False).ids, encode(generated, add_special_tokens=False).ids


def with_server_ids(sample: dict, tokenizer, *, missing_turns: tuple[int, ...] = ()) -> dict:  # type: ignore[no-untyped-def]
    """``sample`` with the token-id columns a server that returns ids fills (``missing_turns``: none for those)."""
    from draftgen.training.conversation import (
        Answer,
        generated_calls,
        generated_turns,
        request_messages,
        stored_messages,
        stored_tools,
    )
    from draftgen.training.token_ids import compact

    mode, points, contents, reasonings = generated_turns(sample)
    calls = generated_calls(sample, len(points))
    messages, tools = stored_messages(sample), stored_tools(sample)
    prompts, outputs, earlier = [], [], []
    for j, point in enumerate(points):
        history = list(request_messages(messages, point, earlier, mode))
        prompt, output = server_ids(
            tokenizer, history, reasonings[j], contents[j], tools=tools, calls=calls[j]
        )
        missing = j in missing_turns
        prompts.append(None if missing else prompt)
        outputs.append(None if missing else output)
        earlier.append((point, Answer(contents[j], calls[j])))
    shared, suffixes = compact(prompts, outputs)
    return {**sample, "turn_prompt_shared": shared, "turn_prompt_ids": suffixes, "turn_output_ids": outputs}


def write_generation(folder: Path, rows: list[dict], shard_size: int = 25) -> Path:
    """generate's output (docs/design.md): shards/part-NNNNN.parquet of ``shard_size`` rows, manifest.json."""
    shards = folder / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    names = []
    for start in range(0, len(rows), shard_size):
        name = f"part-{start // shard_size:05d}.parquet"
        pl.DataFrame(rows[start : start + shard_size], schema=SCHEMA).write_parquet(shards / name)
        names.append(name)
    manifest = {"counts": {"done": len(rows)}, "shards": names}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def tool_call(name: str, arguments: str, call_id: str) -> dict:
    """A call as a server's parser returns it (arguments a JSON string, as sent)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def agentic_row(
    sample_id: str,
    rng: random.Random,
    *,
    calls: list[dict] | None = None,
    city: str = "Paris",
    tools: list[dict] | None = None,
) -> dict:
    """A stored agentic conversation (turns: all): a question the source answered with a call to get_weather, the
    tool's result, a follow-up. ``calls``: the target's first answer's calls (default: the source's call, so the
    result was spliced and the follow-up answered: two turns); calls that differ end the conversation at turn 0,
    recorded in ``tool_divergence``, as generate stores it."""
    from draftgen.training.conversation import encode_calls, follow_up, message_columns

    source_call = {
        "id": f"src-{sample_id}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": city}},
    }
    messages = [
        {"role": "user", "content": f"What is the weather in {city} today? {_text(rng, 3)}"},
        {"role": "assistant", "content": "", "tool_calls": [source_call]},
        {"role": "tool", "tool_call_id": f"src-{sample_id}", "content": f"Sunny in {city}, 24 C."},
        {"role": "user", "content": f"Then what should I pack? {_text(rng, 2)}"},
    ]
    tools = tools if tools is not None else [WEATHER]
    first = (
        calls
        if calls is not None
        else [tool_call("get_weather", json.dumps({"city": city}), f"call-{sample_id}")]
    )
    _, divergence = follow_up(messages, 0, first, 0)
    answers = [(0, "", _text(rng, rng.randint(18, 26)), first)]
    if divergence is None:
        answers.append((3, f"Pack light: {_text(rng, 8)}", _text(rng, rng.randint(18, 26)), []))
    kept = messages[: answers[-1][0] + 1]
    plain, extras = message_columns(kept)
    last_content, last_reasoning = answers[-1][1], answers[-1][2]
    sample = row(sample_id, reasoning=last_reasoning, content=last_content, messages=plain)
    sample.update(turns(sample, [(after, content, thought) for after, content, thought, _ in answers], "all"))
    sample["turn_finish_reason"] = ["tool_calls" if made else "stop" for *_, made in answers]
    sample["finish_reason"] = sample["turn_finish_reason"][-1]
    sample["message_extras"] = extras
    sample["tools"] = json.dumps(tools)
    sample["turn_tool_calls"] = [encode_calls(made) for *_, made in answers]
    sample["tool_divergence"] = divergence.as_json(1) if divergence is not None else None
    return sample


def agentic_single(sample_id: str, rng: random.Random, calls: list[dict]) -> dict:
    """A one-question conversation with tools whose one (final) answer made ``calls``."""
    from draftgen.training.conversation import encode_calls

    messages = [{"role": "user", "content": f"Is it raining in Oslo? {_text(rng, 6)}"}]
    sample = row(
        sample_id, reasoning=_text(rng, 30), content="", finish_reason="tool_calls", messages=messages
    )
    sample.update(turns(sample, [(0, "", sample["reasoning_content"])], "all"))
    sample["turn_finish_reason"] = ["tool_calls"]
    sample["tools"] = json.dumps([WEATHER])
    sample["turn_tool_calls"] = [encode_calls(calls)]
    return sample


def planted_tool_rows(rng_seed: int = 3) -> list[tuple[dict, str]]:
    """(row, flag) for the tool flags: a call to a function the tools do not offer, arguments that are not JSON, a
    conversation that ended where the target's call was not the source's."""
    rng = random.Random(rng_seed)
    return [
        (
            agentic_single("bad-unknown-tool", rng, [tool_call("get_stock", '{"symbol": "X"}', "c1")]),
            "unknown_tool",
        ),
        (
            agentic_single("bad-tool-arguments", rng, [tool_call("get_weather", '{"city": "Oslo"', "c2")]),
            "invalid_tool_arguments",
        ),
        (
            agentic_row(
                "bad-diverged", rng, calls=[tool_call("get_weather", json.dumps({"city": "London"}), "c3")]
            ),
            "tool_divergence",
        ),
    ]
