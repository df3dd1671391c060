"""Trainer-exact loss masks (draftgen.training.trainers, draftgen.training.spans): each expectation below is derived by hand
from the trainer's rules (docs/validate.md), or computed the literal, slow way the trainer does it."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from draftgen.training.local_tokenizer import build_qwen3_tokenizer
from draftgen.training.masks import MaskSpec, build_conversation_masks, build_masks, load_tokenizer
from draftgen.training.spans import find_ignored, find_spans, span_masks
from draftgen.training.trainers import (
    TRAINERS,
    SpanTrainer,
    Trainer,
    UnknownTrainerError,
    span_trainer_messages,
    trainer_spec,
)
from draftgen.validate.config import ValidateConfig

QWEN35 = TRAINERS[Trainer.SPECFORGE_QWEN35]
QWEN3_THINKING = TRAINERS[Trainer.SPECFORGE_QWEN3_THINKING]
TEMPLATE = Path(__file__).with_name("qwen35_style_template.jinja")


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_tokenizer(tmp_path_factory.mktemp("tok") / "qwen3")


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path):
    return load_tokenizer(qwen3_dir)


@pytest.fixture(scope="module")
def qwen35(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Qwen3's real vocabulary with a Qwen3.5/3.6-style template (think blocks after the last user query)."""
    folder = tmp_path_factory.mktemp("tok") / "qwen35"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((qwen3_dir / "tokenizer.json").read_bytes())
    config = json.loads((qwen3_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE.read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)


def _supervised_tokens(tokenizer, batch, index: int) -> list[str]:
    ids = np.asarray(batch.input_ids[index])
    return tokenizer.convert_ids_to_tokens(ids[batch.loss_mask(index) == 1].tolist())


def _supervised_text(tokenizer, batch, index: int) -> str:
    ids = np.asarray(batch.input_ids[index])
    return tokenizer.backend_tokenizer.decode(
        ids[batch.loss_mask(index) == 1].tolist(), skip_special_tokens=False
    )


# --- names ------------------------------------------------------------------------------------------------------


def test_trainer_names_legacy_conventions_and_unknown_names():
    assert MaskSpec().trainer is Trainer.SPECFORGE_QWEN35
    assert MaskSpec(trainer="think_in_prompt").trainer is Trainer.DRAFTGEN_THINK_IN_PROMPT
    assert MaskSpec(trainer="think_in_target").trainer is Trainer.DRAFTGEN_THINK_IN_TARGET
    with pytest.raises(UnknownTrainerError, match=r"unknown trainer 'eagle'.*specforge-qwen3\.5"):
        trainer_spec("eagle")
    with pytest.raises(UnknownTrainerError):
        MaskSpec(trainer="specforge-qwen4")
    base = {"generation_dir": "g", "tokenizer": "t", "out_dir": "o"}
    assert ValidateConfig(**base).trainer is Trainer.SPECFORGE_QWEN35
    assert (
        ValidateConfig(**base, mask_convention="think_in_target").trainer is Trainer.DRAFTGEN_THINK_IN_TARGET
    )
    assert ValidateConfig(**base, mask_convention="").trainer is Trainer.SPECFORGE_QWEN35
    with pytest.raises(ValueError, match="give only trainer"):
        ValidateConfig(**base, trainer="specforge-qwen3-thinking", mask_convention="think_in_prompt")
    with pytest.raises(ValueError, match="mask_convention value: trainer draftgen-think-in-prompt"):
        ValidateConfig(**base, trainer="think_in_prompt")


# --- the "Reply with OK." example: where 6 / 7 / 8 come from ------------------------------------------------------

OK_EXAMPLE = {
    # after "<think>\n": the empty block's "\n\n" is one token straddling that boundary, so it is not supervised;
    # the end-of-turn string "<|im_end|>\n" is supervised up to its newline
    Trainer.SPECFORGE_QWEN35: ["</think>", "ĊĊ", "OK", ".", "<|im_end|>", "Ċ"],
    # after "<|im_start|>assistant\n": the think block and the newline after <|im_end|> are supervised
    Trainer.SPECFORGE_QWEN3_THINKING: ["<think>", "ĊĊ", "</think>", "ĊĊ", "OK", ".", "<|im_end|>", "Ċ"],
    # draftgen's generated-turn conventions stop at <|im_end|>; think_in_prompt's 6 is the answer tokenized after
    # its prompt (the full text's "\n\n" is flagged as a boundary mismatch, so its loss_mask is empty)
    Trainer.DRAFTGEN_THINK_IN_TARGET: ["<think>", "ĊĊ", "</think>", "ĊĊ", "OK", ".", "<|im_end|>"],
}
OK_SUMS = {
    Trainer.SPECFORGE_QWEN35: 6,
    Trainer.SPECFORGE_DFLASH_QWEN35: 6,  # the same template entry: the same mask (its loader's filters differ)
    Trainer.SPECFORGE_QWEN3_THINKING: 8,
    Trainer.DRAFTGEN_THINK_IN_PROMPT: 6,
    Trainer.DRAFTGEN_THINK_IN_TARGET: 7,
}


@pytest.mark.parametrize("trainer", list(OK_SUMS), ids=str)
def test_reply_with_ok_mask_sum_under_each_trainer(qwen3, trainer):
    prompt = [{"role": "user", "content": "Reply with OK."}]
    batch = build_masks(qwen3, [prompt], [""], ["OK."], MaskSpec(trainer=trainer), keep_ids=True)
    assert batch.mask_sum[0] == OK_SUMS[trainer]
    if trainer in OK_EXAMPLE:
        assert _supervised_tokens(qwen3, batch, 0) == OK_EXAMPLE[trainer]
    tokens = qwen3.convert_ids_to_tokens(batch.input_ids[0])
    if trainer is Trainer.SPECFORGE_QWEN3_THINKING:  # its template entry brings a system prompt
        system = [
            "<|im_start|>",
            "system",
            "Ċ",
            "You",
            "Ġare",
            "Ġa",
            "Ġhelpful",
            "Ġassistant",
            ".",
            "<|im_end|>",
        ]
        assert tokens[:10] == system
    else:
        assert tokens[:3] == ["<|im_start|>", "user", "Ċ"]
    assert tokens[-2:] == ["<|im_end|>", "Ċ"]
    boundary = trainer in (
        Trainer.SPECFORGE_QWEN35,
        Trainer.SPECFORGE_DFLASH_QWEN35,
        Trainer.DRAFTGEN_THINK_IN_PROMPT,
    )
    assert (batch.mismatch[0] or "").startswith("boundary") == boundary


def test_thinking_off_the_empty_think_block_is_expected_not_a_mismatch(qwen3):
    prompt = [{"role": "user", "content": "Reply with OK."}]
    spec = MaskSpec(enable_thinking=False)
    batch = build_masks(qwen3, [prompt], [None], ["OK, here it is."], spec, keep_ids=True)
    assert batch.mismatch == [None]
    # the same trainer mask as with thinking on: from </think> (the "\n\n" straddles "<think>\n")
    assert _supervised_tokens(qwen3, batch, 0)[:2] == ["</think>", "ĊĊ"]
    on = build_masks(qwen3, [prompt], [None], ["OK, here it is."], MaskSpec(), keep_ids=True)
    assert on.loss_mask(0).tolist() == batch.loss_mask(0).tolist() and on.mismatch[0].startswith("boundary")


def test_with_reasoning_specforge_qwen35_is_the_old_default_plus_the_newline(qwen3):
    prompt = [{"role": "user", "content": "Reply with OK."}]
    spec35, old = MaskSpec(), MaskSpec(trainer="draftgen-think-in-prompt")
    new = build_masks(qwen3, [prompt], ["The user wants OK."], ["OK."], spec35, keep_ids=True)
    before = build_masks(qwen3, [prompt], ["The user wants OK."], ["OK."], old, keep_ids=True)
    assert new.mismatch == [None] and before.mismatch == [None]
    assert _supervised_text(qwen3, new, 0) == "The user wants OK.\n</think>\n\nOK.<|im_end|>\n"
    assert new.mask_sum[0] == before.mask_sum[0] + 1


def test_sglangs_answer_with_the_newlines_after_think_trains_on_what_was_generated(qwen3, qwen35):
    """SGLang 0.5.23's qwen3 reasoning parser keeps the "\n\n" after </think> in content ("\n\nOK.", seen on the
    real server in the SGLang tier, and the simulator does the same): the target must read "</think>\n\nOK.", the
    tokens generated, not "</think>\n\n\n\nOK." (a "\n\n\n\n" token the model never emitted)."""
    prompt = [{"role": "user", "content": "Reply with OK."}]
    for tokenizer in (qwen3, qwen35):
        batch = build_masks(
            tokenizer, [prompt], ["The user wants OK."], ["\n\nOK."], MaskSpec(), keep_ids=True
        )
        assert batch.mismatch == [None]
        assert _supervised_text(tokenizer, batch, 0) == "The user wants OK.\n</think>\n\nOK.<|im_end|>\n"
        # history turns too: the earlier answer renders as "assistant\nOK." in both templates
        history = [
            *prompt,
            {"role": "assistant", "content": "\n\nOK."},
            {"role": "user", "content": "Again."},
        ]
        rendered = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        assert "<|im_start|>assistant\nOK.<|im_end|>" in rendered


# --- span finding -----------------------------------------------------------------------------------------------

H, E = "<|im_start|>assistant\n<think>\n", "<|im_end|>\n"


def test_spans_run_from_each_header_through_the_next_end_of_turn():
    text = f"<|im_start|>user\nq{E}{H}a\n</think>\n\nb{E}<|im_start|>user\nr{E}{H}c{E}"
    spans = find_spans(text, QWEN35)
    assert [text[s:e] for s, e, _ in spans] == [f"a\n</think>\n\nb{E}", f"c{E}"]
    assert all(closed for *_, closed in spans)


def test_a_span_without_end_of_turn_ends_where_the_text_ends_before_a_final_newline():
    assert [(s, e) for s, e, _ in find_spans(f"x{H}abc\n", QWEN35)] == [(1 + len(H), 1 + len(H) + 3)]
    assert [(s, e) for s, e, _ in find_spans(f"x{H}abc", QWEN35)] == [(1 + len(H), 1 + len(H) + 3)]
    assert find_spans(f"x{H}abc", QWEN35)[0][2] is False
    assert find_spans("no header here", QWEN35) == []


def test_a_header_inside_a_span_does_not_start_another():
    text = f"{H}quote {H} inside{E}"
    assert [text[s:e] for s, e, _ in find_spans(text, QWEN35)] == [f"quote {H} inside{E}"]


@pytest.mark.parametrize("spec", [QWEN35, QWEN3_THINKING], ids=["qwen3.5", "qwen3-thinking"])
def test_spans_match_a_lazy_regex_up_to_end_of_turn_or_end_of_text(spec):
    """The rule as a regular expression (lazy match up to the end-of-turn string or ``$``), on random texts."""
    rule = re.compile(f"{re.escape(spec.assistant_header)}(.*?(?:{re.escape(spec.end_of_turn)}|$))", re.S)
    pieces = [
        spec.assistant_header,
        spec.end_of_turn,
        "<|im_end|>",
        "<|im_start|>",
        "assistant\n",
        "a",
        "\n",
        "\n\n",
    ]
    rng = random.Random(3)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        expected = [(m.start(1), m.end(1)) for m in rule.finditer(text)]
        assert [(s, e) for s, e, _ in find_spans(text, spec)] == expected, repr(text)


def test_ignore_strings_every_occurrence():
    spec = SpanTrainer(assistant_header=H, end_of_turn=E, ignore_strings=("ab", "x"))
    assert find_ignored("abxab_x", spec) == [(0, 2), (3, 5), (2, 3), (6, 7)]


# --- conversations as the trainer sees them ---------------------------------------------------------------------


def test_the_trainer_message_clean_up():
    turns, note = span_trainer_messages(
        [
            {"role": "human", "content": "hi", "reasoning_content": None, "extra": 1},
            {"role": "gpt", "content": None, "reasoning_content": "r"},
        ],
        QWEN3_THINKING,
    )
    assert note is None
    assert turns == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "reasoning_content": "r"},
    ]
    turns, note = span_trainer_messages(
        [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}], QWEN35
    )
    assert turns == [{"role": "user", "content": "u"}] and "1 message(s) before the first user" in note
    turns, note = span_trainer_messages(
        [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "v"},
        ],
        QWEN35,
    )
    assert [t["content"] for t in turns] == ["u", "a"] and "assistant turn after a assistant turn (2" in note
    turns, note = span_trainer_messages(
        [{"role": "user", "content": "u"}, {"role": "tool", "content": "t"}], QWEN35
    )
    assert len(turns) == 1 and "tool turn after a user turn" in note


def test_a_cut_conversation_is_flagged_and_keeps_the_trainer_mask(qwen3):
    messages = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]]
    batch = build_masks(
        qwen3, messages, ["Think."], ["Answer."], MaskSpec(trainer="specforge-qwen3-thinking")
    )
    assert batch.mismatch[0].startswith("cut:")
    # the generated answer is gone; the source's assistant turn (rendered last, with a think block) is supervised
    assert batch.mask_sum[0] == len(
        qwen3.backend_tokenizer.encode(
            "<think>\n\n</think>\n\nHello there.<|im_end|>\n", add_special_tokens=False
        ).ids
    )


# --- multi-turn, system, tools ----------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need the tool."},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "21 °C.", "reasoning_content": "The tool says 21."},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "content": "Also mild.", "reasoning_content": "Guess."},
]


def test_qwen35_supervises_each_assistant_turn_the_template_gives_a_think_block(qwen35, qwen3):
    batch = build_conversation_masks(qwen35, [CONVERSATION], MaskSpec(), keep_ids=True)
    assert batch.mismatch == [None]
    # the Qwen3.5-style template renders think blocks only after the last user query: the two earlier assistant
    # turns are history without "<think>\n", so SpecForge's qwen3.5 header never matches them
    assert _supervised_text(qwen35, batch, 0) == "Guess.\n</think>\n\nAlso mild.<|im_end|>\n"
    # the draftgen template (no think blocks in history): the same
    plain = build_conversation_masks(qwen3, [CONVERSATION], MaskSpec(), keep_ids=True)
    assert _supervised_text(qwen3, plain, 0) == "Guess.\n</think>\n\nAlso mild.<|im_end|>\n"


def test_qwen35_supervises_tool_loop_turns_after_the_last_user_query(qwen35):
    batch = build_conversation_masks(qwen35, [CONVERSATION[:5]], MaskSpec(), keep_ids=True)
    assert batch.mismatch == [None]
    assert _supervised_text(qwen35, batch, 0) == (
        "Need the tool.\n</think>\n\nLet me look.<|im_end|>\n"
        + "The tool says 21.\n</think>\n\n21 °C.<|im_end|>\n"
    )


def test_qwen3_thinking_supervises_every_assistant_turn(qwen35):
    batch = build_conversation_masks(
        qwen35, [CONVERSATION], MaskSpec(trainer="specforge-qwen3-thinking"), keep_ids=True
    )
    assert _supervised_text(qwen35, batch, 0) == (
        "Let me look.<|im_end|>\n21 °C.<|im_end|>\n<think>\nGuess.\n</think>\n\nAlso mild.<|im_end|>\n"
    )
    # its data carries a system message, so the template entry's own system prompt is not added
    assert qwen35.convert_ids_to_tokens(batch.input_ids[0][:4]) == ["<|im_start|>", "system", "Ċ", "Be"]


def test_turn_objects_are_read_like_message_dicts(qwen35):
    @dataclass(frozen=True)
    class Turn:  # the shape of an assembled turn (draftgen.training.conversation): attributes, not keys
        role: str
        content: str
        reasoning_content: str | None
        generated: bool

    objects = [
        Turn(t["role"], t["content"], t.get("reasoning_content"), t["role"] == "assistant")
        for t in CONVERSATION
    ]
    from_objects = build_conversation_masks(qwen35, [objects], MaskSpec(), keep_ids=True)
    from_dicts = build_conversation_masks(qwen35, [CONVERSATION], MaskSpec(), keep_ids=True)
    assert from_objects.input_ids == from_dicts.input_ids
    assert from_objects.loss_mask(0).tolist() == from_dicts.loss_mask(0).tolist()


def test_generated_turn_conventions_supervise_only_the_last_turn(qwen35):
    batch = build_conversation_masks(
        qwen35, [CONVERSATION], MaskSpec(trainer="draftgen-think-in-target"), keep_ids=True
    )
    assert _supervised_text(qwen35, batch, 0) == "<think>\nGuess.\n</think>\n\nAlso mild.<|im_end|>"
    with pytest.raises(ValueError, match="conversation 0 does not end with the generated assistant turn"):
        build_conversation_masks(qwen35, [CONVERSATION[:2]], MaskSpec(trainer="draftgen-think-in-target"))


# --- max_length -------------------------------------------------------------------------------------------------


def test_max_length_cuts_ids_and_mask_as_the_trainer_does(qwen3):
    prompt = [{"role": "user", "content": "Count."}]
    answer = " ".join(str(n) for n in range(40))
    full = build_masks(qwen3, [prompt], ["Go."], [answer], MaskSpec(), keep_ids=True)
    n, start = int(full.n_tokens[0]), int(full.n_prompt[0])
    # the span starts after "<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    head = "<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert start == len(qwen3.backend_tokenizer.encode(head, add_special_tokens=False).ids)
    assert full.mask_sum[0] == n - start  # through "<|im_end|>\n", the last token
    cut = build_masks(qwen3, [prompt], ["Go."], [answer], MaskSpec(max_length=start + 10), keep_ids=True)
    assert cut.n_tokens[0] == n  # the length before the cut (validate's over_max_length)
    assert cut.input_ids[0] == full.input_ids[0][: start + 10]
    assert cut.loss_mask(0).tolist() == [0] * start + [1] * 10
    inside_prompt = build_masks(
        qwen3, [prompt], ["Go."], [answer], MaskSpec(max_length=start - 2), keep_ids=True
    )
    assert len(inside_prompt.input_ids[0]) == start - 2 and inside_prompt.mask_sum[0] == 0


# --- ignore strings ---------------------------------------------------------------------------------------------


def test_ignore_strings_are_unmasked(qwen3):
    spec = SpanTrainer(
        assistant_header="<|im_start|>assistant\n",
        end_of_turn="<|im_end|>\n",
        ignore_strings=("<think>\n\n</think>\n\n",),
    )
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n"
    result = span_masks(qwen3, [text], [None], spec, max_length=1000)
    ids = np.asarray(result.input_ids[0])
    kept = qwen3.backend_tokenizer.decode(ids[result.loss_masks[0] == 1].tolist(), skip_special_tokens=False)
    assert kept == "Hello.<|im_end|>\n"


# --- the fast token positions equal the literal ones ------------------------------------------------------------

PIECES = [
    "\n",
    "\n\n",
    " ",
    "  ",
    "é",
    "e\u0301",
    "🙂",
    "漢字",
    "x",
    "<think>",
    "</think>",
    "<tool_call>",
    "ab",
    "\t",
    "OK.",
]


def _literal_mask(tokenizer, text: str, spec: SpanTrainer, max_length: int) -> tuple[list[int], list[int]]:
    """The trainer's definition, done the slow way: tokenize the text before every boundary on its own."""

    def count(char: int) -> int:
        return len(tokenizer.backend_tokenizer.encode(text[:char], add_special_tokens=False).ids[:max_length])

    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids[:max_length]
    mask = [0] * len(ids)
    for start, end, _ in find_spans(text, spec):
        for k in range(min(count(start), len(ids)), min(count(end), len(ids))):
            mask[k] = 1
    return ids, mask


@pytest.mark.parametrize("trainer", [Trainer.SPECFORGE_QWEN35, Trainer.SPECFORGE_QWEN3_THINKING], ids=str)
def test_fast_positions_equal_tokenizing_every_prefix(qwen3, trainer):
    rng = random.Random(7)
    spec = TRAINERS[trainer]

    def text() -> str:
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))

    conversations = []
    for _ in range(60):
        turns = [{"role": "user", "content": text()}]
        for _ in range(rng.randint(0, 2)):
            turns += [{"role": "assistant", "content": text(), "reasoning_content": text()}]
            turns += [{"role": rng.choice(["user", "tool"]), "content": text()}]
        turns.append({"role": "assistant", "content": text(), "reasoning_content": text()})
        conversations.append(turns)
    for max_length in (10_000, 25):
        batch = build_conversation_masks(
            qwen3, conversations, MaskSpec(trainer=trainer, max_length=max_length), keep_ids=True
        )
        for i, conversation in enumerate(conversations):
            turns, _ = span_trainer_messages(conversation, spec)
            rendered = qwen3.apply_chat_template(turns, tokenize=False, enable_thinking=True)
            ids, mask = _literal_mask(qwen3, rendered, spec, max_length)
            assert batch.input_ids[i] == ids
            assert batch.loss_mask(i).tolist() == mask, (i, rendered)


# --- specforge-lfm: SpecForge's GeneralParser with its ChatML "lfm" entry, on a ChatML model's own template ---------

# SmolLM2-135M-Instruct's chat template (the real-model tier's target): its own default system message when the
# conversation has none, no reasoning.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chatml(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tok") / "chatml"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((qwen3_dir / "tokenizer.json").read_bytes())
    config = json.loads((qwen3_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)


def test_lfm_keeps_the_models_own_system_prompt_and_drops_reasoning(chatml):
    conversation = [
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "greet"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."},
    ]
    turns, note = span_trainer_messages(conversation, TRAINERS[Trainer.SPECFORGE_LFM])
    assert note is None
    assert turns == [
        {"role": r, "content": c}
        for r, c in (("user", "Hi"), ("assistant", "Hello."), ("user", "Bye"), ("assistant", "Bye."))
    ]
    batch = build_conversation_masks(chatml, [conversation], MaskSpec(trainer="specforge-lfm"), keep_ids=True)
    text = chatml.backend_tokenizer.decode(batch.input_ids[0], skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "greet" not in text
    assert _supervised_text(chatml, batch, 0) == "Hello.<|im_end|>\nBye.<|im_end|>\n"


def test_lfm_fast_positions_equal_tokenizing_every_prefix(chatml):
    rng = random.Random(11)
    spec = TRAINERS[Trainer.SPECFORGE_LFM]

    def text() -> str:
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))

    conversations = []
    for _ in range(60):
        turns = [{"role": "user", "content": text()}]
        for _ in range(rng.randint(0, 2)):
            turns += [{"role": "assistant", "content": text()}, {"role": "user", "content": text()}]
        turns.append({"role": "assistant", "content": text()})
        conversations.append(turns)
    for max_length in (10_000, 25):
        batch = build_conversation_masks(
            chatml, conversations, MaskSpec(trainer="specforge-lfm", max_length=max_length), keep_ids=True
        )
        for i, conversation in enumerate(conversations):
            turns, _ = span_trainer_messages(conversation, spec)
            rendered = chatml.apply_chat_template(turns, tokenize=False)
            ids, mask = _literal_mask(chatml, rendered, spec, max_length)
            assert batch.input_ids[i] == ids
            assert batch.loss_mask(i).tolist() == mask, (i, rendered)
