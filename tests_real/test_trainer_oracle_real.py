"""validate's input_ids and loss_mask against SpecForge 0.2.0's own parser, sample by sample (issue 10).

Two corpora, each validated by draftgen (every sample exported: all flags kept, gates open, token export on) and
then parsed by SpecForge from the exported train.jsonl:

(a) the real-tier generate run (a random tiny Qwen3 on vLLM and transformers serve; its own tokenizer and chat
    template), and
(b) a planted corpus with Qwen3's real vocabulary and a Qwen3.5/3.6-style chat template (think blocks after the
    last user query, tool results inside user turns): single turn, multi-turn, system prompt, tool turns, an empty
    think block, a truncated answer, samples over max_length, unicode, and a user turn quoting the assistant header.

For both SpecForge trainers, every sample's input_ids and loss_mask must equal validate's; the line
"samples compared N, mismatches 0" is figure 13 of docs/figures.md. SpecForge's dataset builder
(prepare_prompt_tasks on the export) must produce the same samples and raise no warning other than its notice
for a data-supplied system prompt, once per such sample.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import GenerateRun
from recording_proxy import vllm_ids
from specforge_oracle import (
    TRAINER_TEMPLATES,
    compare,
    dflash_prompts,
    load_tokenizer,
    read_tokens,
    specforge_dataset,
    specforge_masks,
)

from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.params import build_config
from draftgen.training.local_tokenizer import build_qwen3_tokenizer
from draftgen.validate.config import FLAGS, KEPT_BY_DEFAULT, ValidateConfig
from draftgen.validate.pipeline import finalize_export, validate_generation

SYSTEM_NOTICE = "The first message is from system"
TEMPLATE = Path(__file__).parents[1] / "tests" / "qwen35_style_template.jinja"
PLANTED_MAX_LENGTH = 160
TOTALS: Counter = Counter()  # across the tests of one session: figure 13's numbers are the last line printed


def _validate(
    generation_dir: Path,
    tokenizer_dir: str,
    tokenizer,
    out_dir: Path,
    trainer: str,
    max_length: int,
    rows: str = "per_turn",
) -> Path:
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(generation_dir),
            "tokenizer": tokenizer_dir,
            "out_dir": str(out_dir),
            "trainer": trainer,
            "rows": rows,
            "train_max_length": max_length,
            "keep_flagged": list(FLAGS),  # every sample is exported: the oracle sees flagged ones too
            "holdout_share": 0.0,
            "max_degenerate_share": 1.0,
            "max_truncated_share": 1.0,
            "export_tokens": True,
        },
    )
    result = validate_generation(config, tokenizer=tokenizer, progress=False)
    return finalize_export(result)


def _check_against_specforge(
    export: Path, tokenizer, trainer: str, max_length: int, tmp_path: Path, last_only: bool = True
) -> dict:
    """Every exported row's tokens against SpecForge's parser on its conversation (a row per turn: its
    train_only_last_turn). Rows built from the server's own ids that re-tokenizing would change are not the
    parser's to judge (it sees only text): they are counted, and their masks checked against the parser's where
    the tokens agree up to the first difference; cut turns kept with their ids are checked up to the tokens the
    parser's template adds closing them."""
    template = TRAINER_TEMPLATES[trainer]
    rows = [json.loads(line) for line in (export / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    oracle = dict(
        zip(
            [r["id"] for r in rows],
            specforge_masks(
                tokenizer,
                [r["conversations"] for r in rows],
                template,
                max_length,
                train_only_last_turn=last_only,
                tools=[json.loads(r["tools"]) if r.get("tools") else None for r in rows],
            ),
            strict=True,
        )
    )
    records = pl.read_parquet(export.parent / "samples.parquet")
    differs = dict(records.filter(pl.col("differs_at").is_not_null()).select("id", "differs_at").iter_rows())
    tokens = read_tokens(export)
    for key, at in differs.items():  # the same tokens before the first difference: the same mask there
        ids, mask = tokens[key]
        assert ids[:at] == oracle[key].input_ids[:at] and mask[:at] == oracle[key].loss_mask[:at], key
    TOTALS["server ids that re-tokenizing changes"] += len(differs)
    # A turn cut by max_tokens, kept with its server ids (keep_flagged: truncated): the token files hold it as
    # generated, train.jsonl as text, which the parser's chat template closes (</think>, the end token). The
    # parser must see exactly the same tokens, then exactly the `closing_tokens` validate measured, to max_length.
    closed = dict(
        records.filter(pl.col("closing_tokens").is_not_null() & pl.col("differs_at").is_null())
        .select("id", pl.struct("closing_tokens", "n_tokens"))
        .iter_rows()
    )
    for key, lengths in closed.items():
        (ids, mask), theirs = tokens[key], oracle[key]
        assert theirs.input_ids[: len(ids)] == ids and theirs.loss_mask[: len(ids)] == mask, key
        expected = min(lengths["n_tokens"] + lengths["closing_tokens"], max_length)
        assert len(theirs.input_ids) == expected, (key, len(theirs.input_ids), lengths)
    TOTALS["cut turns the template closes"] += len(closed)
    ours = {k: v for k, v in tokens.items() if k not in differs and k not in closed}
    oracle_same = {k: v for k, v in oracle.items() if k not in differs and k not in closed}
    compared, bad = compare(ours, oracle_same)
    TOTALS["compared"] += compared
    TOTALS["mismatches"] += len(bad)
    print(
        f"\nSpecForge 0.2.0 {template} parser vs validate trainer={trainer}: samples compared {compared}, "
        f"mismatches {len(bad)} (this session so far: samples compared {TOTALS['compared']}, "
        f"mismatches {TOTALS['mismatches']}; rows whose server ids re-tokenizing changes "
        f"{TOTALS['server ids that re-tokenizing changes']}, cut turns the template closes "
        f"{TOTALS['cut turns the template closes']})"
    )
    assert not bad, f"{len(bad)} of {compared} differ from SpecForge, e.g. {bad[:5]}"

    # SpecForge's dataset builder on the same export: the same samples (it shuffles, drops ids, keeps samples with
    # at least one supervised token). Every warning it raises was anticipated by validate: its notice for a
    # data-supplied system prompt (once per such sample), and each conversation it cuts (validate's
    # template_mismatch "cut: ...").
    run = specforge_dataset(
        export / "train.jsonl",
        tokenizer,
        template,
        max_length,
        tmp_path / f"hf-{trainer}",
        train_only_last_turn=last_only,
    )
    expected = [(o.input_ids, o.loss_mask) for o in oracle.values() if sum(o.loss_mask) >= 1]
    assert sorted(run.samples) == sorted(expected)
    assert run.log_warnings == []
    anticipated = Counter(
        {
            "system notice": sum(1 for r in rows if r["conversations"][0]["role"] == "system"),
            "cut": sum(1 for m in records["mismatch"] if m and m.startswith("cut:")),
            # a target's call whose arguments are not JSON: SpecForge renders {} and says so; validate flags it
            "bad arguments": int(records["invalid_tool_arguments"].sum()),
        }
    )
    assert +Counter(_warning_kind(w) for w in run.warnings) == +anticipated, run.warnings
    # The export validate publishes by default (flagged samples dropped) reads with no warning but that notice.
    clean_ids = set(records.filter(pl.col("flags").list.len() == 0)["id"])
    clean = export.parent / "clean.jsonl"
    clean.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows if r["id"] in clean_ids))
    run = specforge_dataset(
        clean,
        tokenizer,
        template,
        max_length,
        tmp_path / f"hf-clean-{trainer}",
        train_only_last_turn=last_only,
    )
    assert len(run.samples) == sum(1 for i in clean_ids if sum(oracle[i].loss_mask) >= 1)
    assert [w for w in run.warnings if _warning_kind(w) != "system notice"] == [] and run.log_warnings == []
    return {"rows": rows, "ours": tokens, "oracle": oracle}


def _warning_kind(message: str) -> str:
    if message.startswith(SYSTEM_NOTICE):
        return "system notice"
    if message.startswith("Dropping leading") or "Conversation truncated" in message:
        return "cut"
    if message.startswith("Failed to parse arguments for tool"):
        return "bad arguments"
    return message


# ----- (a) the real servers' output -----------------------------------------------------------------------------


@pytest.mark.parametrize("rows", ["per_turn", "per_conversation"])
@pytest.mark.parametrize("trainer", list(TRAINER_TEMPLATES))
def test_real_generate_run_masks_equal_specforge(generate_run: GenerateRun, tmp_path, trainer, rows):
    folder = generate_run.params["model"]
    tokenizer = load_tokenizer(folder)
    export = _validate(
        generate_run.run_dir, folder, tokenizer, tmp_path / "validated", trainer, max_length=96, rows=rows
    )
    last_only = rows == "per_turn"
    checked = _check_against_specforge(export, tokenizer, trainer, 96, tmp_path, last_only=last_only)
    prompt_ids = {r["id"].partition("#")[0] for r in checked["rows"]}
    assert prompt_ids == set(generate_run.expected_ids)
    if not last_only:
        assert len(checked["rows"]) == len(generate_run.expected_ids)
    assert any(sum(mask) > 0 for _, mask in checked["ours"].values())


def test_export_carries_vllms_own_token_ids(generate_run: GenerateRun, tmp_path):
    """Every exported row whose tokens came from the server is, token for token, vLLM's own prompt ids followed by
    its own output ids as the proxy recorded them on the wire (not as draftgen stored them), the output ids all
    supervised; no row vLLM answered was re-tokenized (transformers serve, which sends no ids, answered those).
    Any server may take any turn of a conversation, so rows are matched to requests by their prompt ids."""
    folder = generate_run.params["model"]
    export = _validate(
        generate_run.run_dir, folder, load_tokenizer(folder), tmp_path / "v", "specforge-qwen3.5", 4096
    )
    records = pl.read_parquet(export.parent / "samples.parquet")
    source = dict(records.select("id", "token_source").iter_rows())
    sent = [vllm_ids(e) for e in generate_run.proxies["vllm"].chats()]
    sent = [(p, o) for p, o in sent if p and o]
    tokens = read_tokens(export)
    from_server = [key for key in tokens if source[key] == "server"]
    assert from_server, "no exported row carries the server's ids"
    for key in from_server:
        ids, mask = tokens[key]
        matches = [(p, o) for p, o in sent if ids[: len(p)] == p]
        assert len(matches) == 1, f"{key}: {len(matches)} of vLLM's requests had this row's prompt ids"
        prompt, output = matches[0]
        assert ids[len(prompt) : len(prompt) + len(output)] == output, key
        assert all(mask[len(prompt) : len(prompt) + len(output)]), key
    for key in (k for k in tokens if source[k] == "retokenized"):  # answered by transformers serve, not vLLM
        ids = tokens[key][0]
        assert not [p for p, o in sent if ids[: len(p) + len(o)] == p + o], f"{key}: vLLM's ids were not used"
    print(
        f"\nexported rows with vLLM's own ids: {len(from_server)} of {len(tokens)}, all equal to the wire's"
    )


# ----- (b) planted corpus, Qwen3's real vocabulary, Qwen3.5/3.6-style template ------------------------------------


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = build_qwen3_tokenizer(tmp_path_factory.mktemp("tok") / "qwen3")
    folder = tmp_path_factory.mktemp("tok") / "qwen35-style"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_bytes((base / "tokenizer.json").read_bytes())
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE.read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def qwen35_tokenizer(qwen35_dir: str):
    return load_tokenizer(qwen35_dir)


LONG = " ".join(f"step {n}: carry the {n % 7} and add {n * 3}." for n in range(60))
UNICODE = "naïve café — 漢字かな交じり文, emoji 🙂👩‍💻, e\u0301 (combining), עברית, ∑ xᵢ² ≤ 1"


def _planted_rows() -> list[dict]:
    user = {"role": "user", "content": "What is 17 * 23? Show the steps."}
    cases: list[tuple[str, list[dict], str | None, str | None, str]] = [
        ("single", [user], "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51.", "391", "stop"),
        (
            "single-newlines",
            [user],
            "\n\nLeading and trailing newlines.\n\n",
            "\n\nThe answer is 391.",
            "stop",
        ),
        (
            "multi-turn",
            [
                {"role": "user", "content": "Name a prime."},
                {"role": "assistant", "content": "7 is prime."},
                {"role": "user", "content": "And one above 100?"},
            ],
            "101 has no divisor up to 10.",
            "101",
            "stop",
        ),
        (
            "multi-turn-3",
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Write code."},
                {"role": "assistant", "content": "Which language?"},
                {"role": "user", "content": "Python."},
            ],
            "A tiny function.",
            "```python\ndef f(x):\n    return x + 1\n```",
            "stop",
        ),
        (
            "system",
            [{"role": "system", "content": "You are terse."}, user],
            "Multiply.",
            "391.",
            "stop",
        ),
        (
            "tool",
            [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Calling the weather tool."},
                {"role": "tool", "content": '{"city": "Paris", "temp_c": 21}'},
            ],
            "The tool says 21 °C.",
            "It is 21 °C in Paris.",
            "stop",
        ),
        (
            "tools-two",
            [
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "Compare Paris and Rome."},
                {"role": "assistant", "content": "Calling both."},
                {"role": "tool", "content": '{"city": "Paris", "temp_c": 21}'},
                {"role": "tool", "content": '{"city": "Rome", "temp_c": 25}'},
            ],
            "Rome is warmer by 4.",
            "Rome (25 °C) is warmer than Paris (21 °C).",
            "stop",
        ),
        ("empty-think", [{"role": "user", "content": "Reply with OK."}], "", "OK.", "stop"),
        ("empty-think-null", [{"role": "user", "content": "Reply with OK."}], None, "OK", "stop"),
        ("truncated", [user], "Let me multiply 17 by 23 carefully, digit by", None, "length"),
        ("truncated-answer", [user], "Done thinking.", "The product is 3", "length"),
        ("over-max-length", [user], LONG, "391", "stop"),
        ("prompt-over-max-length", [{"role": "user", "content": LONG + " " + LONG}], "ok", "391", "stop"),
        ("unicode", [{"role": "user", "content": UNICODE}], "Ünïcödé thinking 🙂.", UNICODE, "stop"),
        (
            "quoted-header",
            [{"role": "user", "content": "Explain <|im_start|>assistant\n<think>\n tokens."}],
            "They are chat markers.",
            "They mark turns.",
            "stop",
        ),
        ("think-in-answer", [user], "Hmm.", "<think>oops</think> 391", "stop"),
        (
            "leading-assistant",
            [{"role": "assistant", "content": "Welcome!"}, {"role": "user", "content": "Hi"}],
            "Greet back.",
            "Hello.",
            "stop",
        ),
    ]
    rows = []
    for variant in range(2):
        for name, messages, reasoning, content, finish in cases:
            suffix = "" if variant == 0 else " (again)"
            rows.append(
                {
                    "id": f"{name}-{variant}",
                    "messages": [
                        {**m, "content": m["content"] + (suffix if m["role"] == "user" else "")}
                        for m in messages
                    ],
                    "reasoning_content": reasoning
                    if reasoning is None or variant == 0
                    else reasoning + suffix,
                    "content": content if content is None or variant == 0 else content + suffix,
                    "finish_reason": finish,
                }
            )
    for row in rows:  # one generated turn after the last message (turns: last)
        row.update(
            turn_after=[len(row["messages"]) - 1],
            turn_content=[row["content"]],
            turn_reasoning=[row["reasoning_content"]],
            turn_finish_reason=[row["finish_reason"]],
            turns_mode="last",
        )
    return rows + _all_turn_rows()


def _all_turn_rows() -> list[dict]:
    """turns: all — every source assistant turn replaced by a generated answer with its own reasoning."""
    conversations = {
        "all-two-turns": (
            [
                {"role": "user", "content": "Name a prime."},
                {"role": "assistant", "content": "SOURCE TEXT, replaced"},
                {"role": "user", "content": "And one above 100?"},
            ],
            [0, 2],
            ["Small primes: 2, 3, 5, 7.", "101 has no divisor up to 10."],
            ["7 is prime.", "101"],
        ),
        "all-tool-loop": (
            [
                {"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "SOURCE TEXT, replaced"},
                {"role": "tool", "content": '{"city": "Paris", "temp_c": 21}'},
            ],
            [1, 3],
            ["I need the weather tool.", "The tool says 21."],
            ["Calling the weather tool.", "It is 21 °C in Paris."],
        ),
    }
    rows = []
    for name, (messages, after, reasoning, content) in conversations.items():
        rows.append(
            {
                "id": f"{name}-0",
                "messages": messages,
                "reasoning_content": reasoning[-1],
                "content": content[-1],
                "finish_reason": "stop",
                "turn_after": after,
                "turn_content": content,
                "turn_reasoning": reasoning,
                "turn_finish_reason": ["stop"] * len(after),
                "turns_mode": "all",
            }
        )
    return rows


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _agentic_rows() -> list[dict]:
    """Agentic conversations as generate stores them (turns: all; training.conversation's columns): parallel calls
    spliced, a single call then text, a divergent call that ended its conversation, malformed arguments, a call to
    an unoffered function, a call after an answer's text, unicode arguments; every one rendered with its tools."""
    from draftgen.training.conversation import answer_points, encode_calls, follow_up, message_columns

    paris, rome = '{"city": "Paris"}', '{"city": "Rome", "days": 2}'
    cases = {
        "agentic-parallel": (
            [
                {"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "Weather in Paris and in Rome for two days?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [_call("s1", "get_weather", paris), _call("s2", "get_weather", rome)],
                },
                {"role": "tool", "tool_call_id": "s1", "content": '{"temp_c": 21}'},
                {"role": "tool", "tool_call_id": "s2", "content": '{"temp_c": [25, 26]}'},
                {"role": "user", "content": "Which is warmer?"},
            ],
            [
                (
                    "",
                    "Two cities: two calls.",
                    [_call("t1", "get_weather", rome), _call("t2", "get_weather", paris)],
                ),
                ("Rome, by four degrees.", "Compare 25 and 21.", []),
            ],
        ),
        "agentic-single": (
            [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [_call("s1", "get_weather", paris)],
                },
                {"role": "tool", "tool_call_id": "s1", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "Thanks!"},
            ],
            [
                ("Let me check.", "One call.", [_call("t1", "get_weather", paris)]),
                ("It is sunny in Paris.", "The tool said sunny.", []),
                ("You're welcome.", "Be polite.", []),
            ],
        ),
        "agentic-diverged": (
            [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [_call("s1", "get_weather", paris)]},
                {"role": "tool", "tool_call_id": "s1", "content": "sunny"},
                {"role": "user", "content": "And tomorrow?"},
            ],
            [("", "Rome, I think.", [_call("t1", "get_weather", rome)])],
        ),
        "agentic-bad-arguments": (
            [{"role": "user", "content": "Weather in Paris?"}],
            [("", "Call it.", [_call("t1", "get_weather", '{"city": "Par')])],
        ),
        "agentic-unknown-tool": (
            [{"role": "user", "content": "Stock price of ACME?"}],
            [("", "No such tool, call anyway.", [_call("t1", "get_stock", '{"symbol": "ACME"}')])],
        ),
        "agentic-unicode": (
            [{"role": "user", "content": "Wetter in Zürich? 🙂"}],
            [
                (
                    "Ich schaue nach.",
                    "Zürich → get_weather.",
                    [_call("t1", "get_weather", '{"city": "Zürich 🙂"}')],
                )
            ],
        ),
    }
    rows = []
    for name, (messages, turns) in cases.items():
        points = list(answer_points(messages, "all"))[: len(turns)]
        _, divergence = follow_up(messages, points[0], turns[0][2], 0)
        kept = messages[: points[-1] + 1]
        plain, extras = message_columns(kept)
        rows.append(
            {
                "id": f"{name}-0",
                "messages": plain,
                "message_extras": extras,
                "tools": json.dumps([WEATHER]),
                "reasoning_content": turns[-1][1],
                "content": turns[-1][0],
                "finish_reason": "tool_calls" if turns[-1][2] else "stop",
                "turn_after": points,
                "turn_content": [t[0] for t in turns],
                "turn_reasoning": [t[1] for t in turns],
                "turn_tool_calls": [encode_calls(t[2]) for t in turns],
                "turn_finish_reason": ["tool_calls" if t[2] else "stop" for t in turns],
                "turns_mode": "all",
                "tool_divergence": divergence.as_json(1) if divergence is not None else None,
            }
        )
    return rows


def _write_generation(folder: Path, rows: list[dict]) -> Path:
    (folder / "shards").mkdir()
    columns = dict.fromkeys(name for r in rows for name in r)  # every row's columns, in order
    frame = pl.DataFrame(
        [{**r, "prompt_tokens": 0, "completion_tokens": 0, "attempts": 1} for r in rows],
        schema={
            name: OUTPUT_SCHEMA[name] for name in (*columns, "prompt_tokens", "completion_tokens", "attempts")
        },
    )
    frame.head(20).write_parquet(folder / "shards" / "part-000000.parquet")
    if frame.height > 20:
        frame.slice(20).write_parquet(folder / "shards" / "part-000001.parquet")
    return folder


@pytest.fixture(scope="module")
def planted_generation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_generation(tmp_path_factory.mktemp("planted"), _planted_rows())


@pytest.fixture(scope="module")
def agentic_generation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_generation(tmp_path_factory.mktemp("agentic"), _agentic_rows())


AGENTIC_MAX_LENGTH = 1024  # the tool schemas in the system turn: the conversations are longer than the others


@pytest.mark.parametrize("rows", ["per_turn", "per_conversation"])
@pytest.mark.parametrize("trainer", list(TRAINER_TEMPLATES))
def test_agentic_conversations_masks_equal_specforge(
    agentic_generation, qwen35_dir, qwen35_tokenizer, tmp_path, trainer, rows
):
    """Tool calls, spliced results and tools, exported in SpecForge's shape (tools a JSON string, call arguments
    JSON strings) and parsed by SpecForge's own parser and dataset builder: the same input_ids and loss masks, row
    for row; the target's calls supervised with their turn, the results and schemas never."""
    last_only = rows == "per_turn"
    export = _validate(
        agentic_generation,
        qwen35_dir,
        qwen35_tokenizer,
        tmp_path / "validated",
        trainer,
        AGENTIC_MAX_LENGTH,
        rows,
    )
    checked = _check_against_specforge(
        export, qwen35_tokenizer, trainer, AGENTIC_MAX_LENGTH, tmp_path, last_only=last_only
    )
    ours = checked["ours"]
    stored = _agentic_rows()
    assert len(ours) == (sum(len(r["turn_after"]) for r in stored) if last_only else len(stored))
    spans = {
        key: sum(1 for a, b in zip([0, *mask], mask, strict=False) if b and not a)
        for key, (_, mask) in ours.items()
    }
    # a row per conversation: qwen3-thinking supervises every assistant turn; qwen3.5 only those its template gives a
    # think block, the turns after the last user question (an earlier turn's calls are history to it), as SpecForge
    every = last_only or trainer == "specforge-qwen3-thinking"
    if not last_only:
        assert (spans["agentic-parallel-0"], spans["agentic-single-0"]) == ((2, 3) if every else (1, 1))
    calling = [
        k for k in ours if k.startswith(("agentic-parallel-0", "agentic-single-0", "agentic-unicode-0"))
    ]
    for key in calling:
        ids, mask = ours[key]
        supervised = qwen35_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert "<tool_response>" not in supervised and 'get_weather"' not in supervised, key
    with_call = [
        k
        for k in calling
        if "<tool_call>" in qwen35_tokenizer.decode([t for t, m in zip(*ours[k], strict=True) if m])
    ]
    assert len(with_call) == (3 if every else 1), (
        with_call
    )  # the calling turns of parallel, single and unicode
    by_id = {r["id"]: r for r in checked["rows"]}
    assert all(json.loads(r["tools"]) == [WEATHER] for r in by_id.values())
    spliced = by_id["agentic-parallel-0#1" if last_only else "agentic-parallel-0"]["conversations"]
    assert [t.get("tool_call_id") for t in spliced if t["role"] == "tool"] == [
        "t1",
        "t2",
    ]  # re-addressed, its order
    assert [t["content"] for t in spliced if t["role"] == "tool"] == [
        '{"temp_c": [25, 26]}',
        '{"temp_c": 21}',
    ]


@pytest.mark.parametrize("trainer", list(TRAINER_TEMPLATES))
def test_planted_corpus_masks_equal_specforge_a_row_per_turn(
    planted_generation, qwen35_dir, qwen35_tokenizer, tmp_path, trainer
):
    export = _validate(
        planted_generation, qwen35_dir, qwen35_tokenizer, tmp_path / "validated", trainer, PLANTED_MAX_LENGTH
    )
    checked = _check_against_specforge(export, qwen35_tokenizer, trainer, PLANTED_MAX_LENGTH, tmp_path)
    ours = checked["ours"]
    stored = _planted_rows()
    assert len(ours) == sum(len(r.get("turn_after") or [None]) for r in stored)
    # every row supervises one turn: one span, its own answer
    for key, (_, mask) in ours.items():
        assert sum(1 for a, b in zip([0, *mask], mask, strict=False) if b and not a) <= 1, key


@pytest.mark.parametrize("trainer", list(TRAINER_TEMPLATES))
def test_planted_corpus_masks_equal_specforge(
    planted_generation, qwen35_dir, qwen35_tokenizer, tmp_path, trainer
):
    export = _validate(
        planted_generation,
        qwen35_dir,
        qwen35_tokenizer,
        tmp_path / "validated",
        trainer,
        PLANTED_MAX_LENGTH,
        rows="per_conversation",
    )
    checked = _check_against_specforge(
        export, qwen35_tokenizer, trainer, PLANTED_MAX_LENGTH, tmp_path, last_only=False
    )
    ours = checked["ours"]
    assert len(ours) == len(_planted_rows())
    # the corpus reaches the cases it is meant to: cut at max_length, more than one supervised span
    assert sum(len(ids) == PLANTED_MAX_LENGTH for ids, _ in ours.values()) >= 4
    spans = {
        key: sum(1 for a, b in zip([0, *mask], mask, strict=False) if b and not a)
        for key, (_, mask) in ours.items()
    }
    assert spans["tool-0"] >= 2 and spans["single-0"] == 1 and spans["all-tool-loop-0"] == 2
    # turns: all — the trainer reads the target's own answers, each with its reasoning, never the source's text
    by_id = {r["id"]: r["conversations"] for r in checked["rows"]}
    for key in ("all-two-turns-0", "all-tool-loop-0"):
        assert "SOURCE TEXT" not in json.dumps(by_id[key])
        assert all(t.get("reasoning_content") for t in by_id[key] if t["role"] == "assistant")
    assert (
        spans["quoted-header-0"] == 2
    )  # the quoted header opens a span in the user turn, as SpecForge reads it


# ----- (c) the DFlash-ready export: SpecForge's own prompt builder reads it unchanged ----------------------------


# What a tiny random model's answers trip by design (48-token cuts, broken UTF-8, stray think markers, thinking off's
# empty think block, where the trainer's span starts after the merged "\n\n"): kept for the real run, beside
# validate's own default keeps, so that its export has rows. trainer_rejects (what DFlash's filter drops) stays.
RANDOM_MODEL_FLAGS = [
    *KEPT_BY_DEFAULT,
    "truncated",
    "invalid_text",
    "empty_reasoning",
    "template_mismatch",
    "think_markers_in_answer",
    "unclosed_think",
]


def _dflash_export(
    generation_dir: Path, tokenizer_dir: str, tokenizer, out_dir: Path, max_length: int, keep: list[str]
) -> Path:
    """validate as a user preparing DFlash data runs it: the DFlash trainer, its defaults (flagged rows dropped,
    but for ``keep``); the gates are opened, so a tiny random model's corpus still publishes."""
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(generation_dir),
            "tokenizer": tokenizer_dir,
            "out_dir": str(out_dir),
            "trainer": "specforge-dflash-qwen3.5",
            "train_max_length": max_length,
            "max_degenerate_share": 1.0,
            "max_truncated_share": 1.0,
            "keep_flagged": keep,
        },
    )
    return finalize_export(validate_generation(config, tokenizer=tokenizer, progress=False))


@pytest.mark.parametrize("corpus", ["real-run", "planted"])
def test_specforge_dflash_prompt_builder_keeps_every_exported_row_unchanged(
    corpus, generate_run: GenerateRun, planted_generation, qwen35_dir, qwen35_tokenizer, tmp_path
):
    if corpus == "real-run":
        folder, tokenizer_dir, max_length = generate_run.run_dir, generate_run.params["model"], 96
        tokenizer, keep = load_tokenizer(tokenizer_dir), RANDOM_MODEL_FLAGS
    else:
        folder, tokenizer_dir, tokenizer, max_length = planted_generation, qwen35_dir, qwen35_tokenizer, 160
        keep = list(KEPT_BY_DEFAULT)
    export = _dflash_export(folder, tokenizer_dir, tokenizer, tmp_path / "dflash", max_length, keep)
    ours = [json.loads(line) for line in (export / "prompts.jsonl").read_text().splitlines()]
    assert ours, "the export holds rows"
    kept = dflash_prompts(export / "prompts.jsonl", tokenizer, max_length)
    print(
        f"\nSpecForge 0.2.0 DFlash prompt builder on {corpus}: {len(kept)} of {len(ours)} rows kept, unchanged"
    )
    assert kept == [(r["input_ids"], r["loss_mask"]) for r in ours], "none dropped, none changed"
    # the card, and the export as a Hugging Face dataset
    info = json.loads((export / "dataset_info.json").read_text())
    assert info["counts"]["exported"] == len(ours) and info["files"]["prompts"] == "prompts.jsonl"
    from datasets import load_dataset

    # a cache of its own: datasets served the other corpus's cached "conversations" for this one (same file names)
    cache = str(tmp_path / "hf-cache")
    prompts = load_dataset(str(export), "prompts", split="train", cache_dir=cache)
    assert prompts.num_rows == len(ours) and prompts[0]["input_ids"] == ours[0]["input_ids"]
    conversations = load_dataset(str(export), "conversations", split="train", cache_dir=cache)
    assert conversations.num_rows == len(ours)
