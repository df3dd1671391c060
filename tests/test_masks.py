"""Loss masks (draftgen.training.masks) and the local tokenizer folders (draftgen.training.local_tokenizer, `draftgen tokenizer`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftgen.cli import main
from draftgen.training.local_tokenizer import (
    TokenizerBuildError,
    build_qwen3_tokenizer,
    build_tiny_tokenizer,
    qwen3_chat_template,
)
from draftgen.training.masks import MaskSpec, TokenizerLoadError, build_masks, load_tokenizer

CONVENTIONS = ("think_in_prompt", "think_in_target")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tiny")


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path):
    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(build_qwen3_tokenizer(tmp_path_factory.mktemp("tok") / "qwen3"))


def _with_template(base: Path, folder: Path, template: str) -> Path:
    """A copy of a tokenizer folder with another chat template."""
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((base / "tokenizer.json").read_bytes())
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _masked_text(tokenizer, batch, index: int) -> str:
    ids = np.asarray(batch.input_ids[index])
    kept = ids[batch.loss_mask(index) == 1].tolist()
    return tokenizer.backend_tokenizer.decode(kept, skip_special_tokens=False)


# --- the tokenizer folders ------------------------------------------------------------------------------------


def test_tiny_tokenizer_has_qwen3_tokens_and_renders_our_template(tiny):
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        ids = tiny.backend_tokenizer.encode(token, add_special_tokens=False).ids
        assert len(ids) == 1, f"{token} must be one token, got {ids}"
    assert tiny.eos_token == "<|im_end|>"
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "history thinking is not rendered"},
        {"role": "user", "content": "Sum 2+2?"},
    ]
    prompt = tiny.apply_chat_template(
        history, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nSum 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    off = tiny.apply_chat_template(history, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    full = tiny.apply_chat_template(
        [*history, {"role": "assistant", "content": "4", "reasoning_content": "\n2+2 is 4.\n"}],
        tokenize=False,
    )
    assert full == prompt + "2+2 is 4.\n</think>\n\n4<|im_end|>\n"


def test_tokenizer_command_builds_once_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "tok"
    assert main(["tokenizer", "--out", str(out), "--vocab-size", "400"]) == 0
    assert load_tokenizer(out).chat_template == qwen3_chat_template()
    assert main(["tokenizer", "--out", str(out)]) == 2
    assert "already holds a tokenizer" in capsys.readouterr().err
    assert main(["tokenizer", "--out", str(out), "--force", "--vocab-size", "400"]) == 0
    with pytest.raises(TokenizerBuildError, match="too small"):
        build_tiny_tokenizer(tmp_path / "other", vocab_size=10)


def test_qwen3_folder_uses_the_real_vocabulary_and_our_template(qwen3):
    assert len(qwen3) > 151_000
    assert qwen3.chat_template == qwen3_chat_template()
    assert qwen3.convert_tokens_to_ids("<|im_end|>") == 151645


# --- the masks -------------------------------------------------------------------------------------------------

SAMPLES = [
    ([{"role": "user", "content": "What is 2+2?"}], "Add two and two.", "It is 4."),
    (
        [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "Name a prime."}],
        "\nSeven is prime; so is 2.\n",
        "7",
    ),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Write code."},
        ],
        "A short function will do. Let me write it:\n\ndef f(x):\n    return x",
        "```python\ndef f(x):\n    return x\n```",
    ),
]


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_mask_covers_exactly_the_generated_turn(tiny, convention):
    messages, reasoning, content = map(list, zip(*SAMPLES, strict=True))
    batch = build_masks(tiny, messages, reasoning, content, MaskSpec(trainer=convention), keep_ids=True)
    assert batch.mismatch == [None] * len(SAMPLES)
    for i, (_, thought, answer) in enumerate(SAMPLES):
        target = thought.strip("\n") + "\n</think>\n\n" + answer + "<|im_end|>"
        if convention == "think_in_target":
            target = "<think>\n" + target
        assert _masked_text(tiny, batch, i) == target
        mask = batch.loss_mask(i)
        assert mask.sum() == batch.mask_sum[i]
        assert np.flatnonzero(mask)[0] == batch.n_prompt[i]  # supervision starts right after the prompt
        last = np.flatnonzero(mask)[-1]
        assert batch.input_ids[i][last] == tiny.convert_tokens_to_ids("<|im_end|>")
        assert last == batch.n_tokens[i] - 2  # the template's trailing "\n" is not supervised


def test_prompt_tokens_are_those_of_the_prompt_alone(tiny):
    messages = [SAMPLES[0][0]]
    batch = build_masks(
        tiny,
        messages,
        ["Thinking."],
        ["Answer."],
        MaskSpec(trainer="draftgen-think-in-prompt"),
        keep_ids=True,
    )
    prompt = tiny.apply_chat_template(messages[0], tokenize=False, add_generation_prompt=True)
    prompt_ids = tiny.backend_tokenizer.encode(prompt, add_special_tokens=False).ids
    assert batch.input_ids[0][: batch.n_prompt[0]] == prompt_ids
    assert batch.n_prompt[0] == len(prompt_ids)


def test_empty_think_block_merges_across_the_boundary_only_when_think_is_prompt(tiny):
    messages = [SAMPLES[0][0]] * 2
    inside = build_masks(tiny, messages, ["", "Fine."], ["OK.", "OK."], MaskSpec(trainer="think_in_prompt"))
    assert inside.mismatch[0].startswith("boundary")
    assert inside.mismatch[1] is None
    target = build_masks(tiny, messages, ["", "Fine."], ["OK.", "OK."], MaskSpec(trainer="think_in_target"))
    assert target.mismatch == [None, None]


# The failure of the user's last run, with Qwen3's real vocabulary: an empty think block and "OK.".
SIX = {
    # (convention, content): (mask sum, the supervised tokens)
    ("think_in_prompt", "OK."): (6, ["Ċ", "</think>", "ĊĊ", "OK", ".", "<|im_end|>"]),
    ("think_in_target", "OK."): (7, ["<think>", "ĊĊ", "</think>", "ĊĊ", "OK", ".", "<|im_end|>"]),
    ("think_in_prompt", "OK"): (5, ["Ċ", "</think>", "ĊĊ", "OK", "<|im_end|>"]),
    ("think_in_target", "OK"): (6, ["<think>", "ĊĊ", "</think>", "ĊĊ", "OK", "<|im_end|>"]),
}


@pytest.mark.parametrize(("convention", "content"), list(SIX), ids=lambda v: str(v))
def test_mask_sum_of_an_empty_think_block_with_the_real_qwen3_vocabulary(qwen3, convention, content):
    expected_sum, expected_tokens = SIX[(convention, content)]
    prompt = [{"role": "user", "content": "Reply with OK."}]
    batch = build_masks(qwen3, [prompt], [""], [content], MaskSpec(trainer=convention), keep_ids=True)
    assert batch.mask_sum[0] == expected_sum
    target = "<think>\n\n</think>\n\n" if convention == "think_in_target" else "\n</think>\n\n"
    ids = qwen3.backend_tokenizer.encode(target + content + "<|im_end|>", add_special_tokens=False).ids
    assert qwen3.convert_ids_to_tokens(ids) == expected_tokens
    if convention == "think_in_prompt":
        # the prompt's "\n" and the target's "\n" become one "\n\n" token in the full conversation
        assert batch.mismatch[0].startswith("boundary")
    else:
        assert batch.mismatch[0] is None
        assert _masked_text(qwen3, batch, 0) == target + content + "<|im_end|>"


def test_real_qwen3_vocabulary_with_reasoning_has_no_mismatch(qwen3):
    prompt = [{"role": "user", "content": "Reply with OK."}]
    batch = build_masks(
        qwen3,
        [prompt],
        ["The user wants OK."],
        ["OK."],
        MaskSpec(trainer="draftgen-think-in-prompt"),
        keep_ids=True,
    )
    assert batch.mismatch == [None]
    assert _masked_text(qwen3, batch, 0) == "The user wants OK.\n</think>\n\nOK.<|im_end|>"


def test_template_that_renders_history_differently_is_flagged_not_guessed(tiny_dir, tmp_path):
    counting = (
        "{{ '<|im_start|>system\\nturns: ' ~ (messages | length) ~ '<|im_end|>\\n' }}"
        "{% for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    tokenizer = load_tokenizer(_with_template(tiny_dir, tmp_path / "counting", counting))
    batch = build_masks(
        tokenizer,
        [SAMPLES[0][0]],
        ["Think."],
        ["Answer."],
        MaskSpec(trainer="draftgen-think-in-prompt"),
        keep_ids=True,
    )
    assert batch.mismatch[0].startswith("text")
    assert batch.mask_sum[0] == 0 and batch.loss_mask(0).sum() == 0


def test_template_error_marks_only_the_sample_that_raised(tiny_dir, tmp_path):
    picky = (
        "{% for m in messages %}{% if 'BOOM' in m.content %}{{ raise_exception('no BOOM allowed') }}{% endif %}"
        "{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
    )
    tokenizer = load_tokenizer(_with_template(tiny_dir, tmp_path / "picky", picky))
    messages = [[{"role": "user", "content": "fine"}], [{"role": "user", "content": "BOOM"}]]
    batch = build_masks(tokenizer, messages, ["a", "b"], ["c", "d"], MaskSpec(trainer="think_in_target"))
    assert batch.mismatch[0] is None
    assert "no BOOM allowed" in batch.mismatch[1]
    assert batch.n_prompt[1] == 0 and batch.mask_sum[1] == 0


def test_answer_without_end_of_turn_is_flagged(tiny_dir, tmp_path):
    no_end = (
        "{% for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content }}"
        "{% if m.role != 'assistant' %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    tokenizer = load_tokenizer(_with_template(tiny_dir, tmp_path / "noend", no_end))
    batch = build_masks(tokenizer, [SAMPLES[0][0]], ["x"], ["y"], MaskSpec(trainer="think_in_target"))
    assert batch.mismatch[0].startswith("no end-of-turn")


def test_unusable_tokenizer_paths_name_the_folder(tmp_path, tiny_dir):
    with pytest.raises(TokenizerLoadError, match=r"nowhere.*does not exist.*draftgen tokenizer"):
        load_tokenizer(tmp_path / "nowhere")
    file_path = tmp_path / "file.txt"
    file_path.write_text("x")
    with pytest.raises(TokenizerLoadError, match="not a folder"):
        load_tokenizer(file_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerLoadError, match=str(empty)):
        load_tokenizer(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerLoadError, match=str(broken)):
        load_tokenizer(broken)
    no_template = _with_template(tiny_dir, tmp_path / "no_template", "")
    with pytest.raises(TokenizerLoadError, match="no chat template"):
        load_tokenizer(no_template)
