"""Rows from the server's token ids: the trainer's mask rule on ids equals its rule on text wherever the ids are
the text's own tokens; the row closes as the template closes a turn; differences and foreign ids are named."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from validate_helpers import clean_rows, server_ids, with_server_ids

from draftgen.training.conversation import generated_turns, request_messages
from draftgen.training.id_rows import (
    compare,
    describe_difference,
    ids_layout,
    ids_problem,
    join_turn,
    span_mask,
)
from draftgen.training.local_tokenizer import build_qwen3_tokenizer, build_tiny_tokenizer
from draftgen.training.masks import MaskSpec, build_conversation_masks, load_tokenizer
from draftgen.training.trainers import TRAINERS, SpanTrainer, Trainer
from draftgen.validate.token_rows import SERVER, server_rows
from draftgen.validate.turns import assemble_batch, turn_rows

# The thinking trainers: the server here renders reasoning, which specforge-lfm (a ChatML model's GeneralParser,
# no reasoning kept) never sees; that one is checked on a ChatML template in tests/test_trainer_masks.py.
SPAN_TRAINERS = [
    t
    for t in Trainer
    if isinstance(TRAINERS[t], SpanTrainer) and "reasoning_content" in TRAINERS[t].message_keys
]


@pytest.fixture(scope="module", params=["tiny", "qwen3"])
def tokenizer(request, tmp_path_factory: pytest.TempPathFactory):
    build = build_tiny_tokenizer if request.param == "tiny" else build_qwen3_tokenizer
    return load_tokenizer(build(tmp_path_factory.mktemp("tok") / request.param))


def _turns(tokenizer, count: int = 24):  # type: ignore[no-untyped-def]
    """Every generated turn of some helper rows: (history, reasoning, content, prompt ids, output ids)."""
    out = []
    for sample in clean_rows(count, seed=4):
        mode, points, contents, reasonings = generated_turns(sample)
        earlier: list[tuple[int, str | None]] = []
        for j, point in enumerate(points):
            history = list(request_messages(sample["messages"], point, earlier, mode))
            prompt, output = server_ids(tokenizer, history, reasonings[j], contents[j])
            out.append((history, reasonings[j], contents[j], prompt, output))
            earlier.append((point, contents[j]))
    return out


@pytest.mark.parametrize("trainer", SPAN_TRAINERS, ids=str)
def test_the_mask_rule_on_ids_is_the_trainers_rule_on_text(tokenizer, trainer):
    rules = TRAINERS[trainer]
    layout = ids_layout(tokenizer, rules)
    turns = _turns(tokenizer)
    conversations = [
        [*history, {"role": "assistant", "content": content, "reasoning_content": reasoning}]
        for history, reasoning, content, _, _ in turns
    ]
    spec = MaskSpec(trainer=trainer, max_length=None, last_turn_only=True)
    text_masks = build_conversation_masks(tokenizer, conversations, spec, keep_ids=True)
    same = 0
    for i, (_, _, _, prompt, output) in enumerate(turns):
        ids = join_turn(prompt, output, "stop", layout)
        if text_masks.input_ids[i] != ids:
            continue  # the trainer renders something the server did not send (qwen3-thinking's system prompt)
        same += 1
        assert (
            span_mask(ids, layout, last_only=True, max_length=None).tolist()
            == text_masks.loss_mask(i).tolist()
        )
        cut = span_mask(ids, layout, last_only=True, max_length=40)
        assert cut.tolist() == text_masks.loss_mask(i)[:40].tolist()
    if rules.system_prompt:
        assert same < len(turns)  # its own system prompt is in front of every conversation without one
    else:
        assert same == len(turns), "a faithful server's ids are the re-tokenized text's"


@pytest.mark.parametrize("trainer", [t for t in SPAN_TRAINERS if not TRAINERS[t].system_prompt], ids=str)
def test_thinking_off_the_header_merged_into_the_empty_think_block_is_found(tokenizer, trainer):
    """Thinking off, the prompt ends ``<think>`` ``\\n\\n`` ``</think>`` ``\\n\\n``: qwen3.5's header (ending in
    ``<think>\\n``) is nowhere as its own ids (seen on vLLM). The rule on ids still finds it, and masks where the
    trainer's rule on text does: from the token after the merged one."""
    rules = TRAINERS[trainer]
    layout = ids_layout(tokenizer, rules)
    history = [{"role": "user", "content": "What is 2 + 2?"}]
    prompt, output = server_ids(tokenizer, history, None, "4.", thinking=False)
    ids = join_turn(prompt, output, "stop", layout)
    conversation = [*history, {"role": "assistant", "content": "4.", "reasoning_content": ""}]
    text = build_conversation_masks(
        tokenizer,
        [conversation],
        MaskSpec(trainer=trainer, max_length=None, last_turn_only=True),
        keep_ids=True,
    )
    assert text.input_ids[0] == ids
    assert ids_problem(prompt, output, layout, tokenizer.decode(output), None, "4.") is None
    mask = span_mask(ids, layout, last_only=True, max_length=None)
    assert mask.tolist() == text.loss_mask(0).tolist()
    assert mask.sum() > 0


def test_every_assistant_span_or_only_the_last(tokenizer):
    # qwen3-thinking masks from the bare assistant header, which the history's earlier turn also has (qwen3.5's
    # header ends in <think>\n, which only the last turn renders: earlier turns go unsupervised there anyway)
    layout = ids_layout(tokenizer, TRAINERS[Trainer.SPECFORGE_QWEN3_THINKING])
    history = [
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "Second question?"},
    ]
    prompt, output = server_ids(tokenizer, history, "Think it over.", "Second answer.")
    ids = join_turn(prompt, output, "stop", layout)
    every = span_mask(ids, layout, last_only=False, max_length=None)
    last = span_mask(ids, layout, last_only=True, max_length=None)
    decode = tokenizer.backend_tokenizer.decode
    array = np.asarray(ids)
    assert decode(array[last == 1].tolist(), skip_special_tokens=False) == (
        "<think>\nThink it over.\n</think>\n\nSecond answer.<|im_end|>\n"
    )
    earlier = decode(array[(every == 1) & (last == 0)].tolist(), skip_special_tokens=False)
    assert earlier == "First answer.<|im_end|>\n"  # the earlier turn's span, under its own header


def test_the_row_closes_as_the_template_closes_a_turn(tokenizer):
    layout = ids_layout(tokenizer, TRAINERS[Trainer.SPECFORGE_QWEN35])
    assert layout.tail == tuple(tokenizer.backend_tokenizer.encode("\n", add_special_tokens=False).ids)
    with_stop = join_turn([1, 2], [3, layout.eot_id], "stop", layout)
    assert with_stop == [1, 2, 3, layout.eot_id, *layout.tail]
    without = join_turn([1, 2], [3], "stop", layout)  # a server that leaves the stop token out of its ids
    assert without == with_stop
    assert join_turn([1, 2], [3, 4], "length", layout) == [1, 2, 3, 4]  # cut by max_tokens: nothing closes it


def test_differences_are_located_and_shown(tokenizer):
    assert compare([1, 2, 3], [1, 2, 3]) is None
    assert compare([1, 2, 3], [1, 9, 3]) == 1
    assert compare([1, 2], [1, 2, 3]) == 2 and compare([1, 2, 3], [1, 2]) == 2
    server = tokenizer.backend_tokenizer.encode("the answer", add_special_tokens=False).ids
    shown = describe_difference(tokenizer, server, [*server[:1], 0], 1)
    assert shown.startswith("at token 1: server ") and repr(tokenizer.decode([server[1]])) in shown


def test_ids_that_are_not_this_tokenizers_are_named(tokenizer):
    layout = ids_layout(tokenizer, TRAINERS[Trainer.SPECFORGE_QWEN35])
    prompt, output = server_ids(tokenizer, [{"role": "user", "content": "Hi?"}], "Greet back.", "Hello.")
    decoded = tokenizer.backend_tokenizer.decode(output, skip_special_tokens=False)
    assert ids_problem(prompt, output, layout, decoded, "Greet back.", "Hello.") is None
    beyond = [*output[:-1], layout.vocab_size + 3]
    assert ids_problem(prompt, beyond, layout, decoded, "Greet back.", "Hello.").startswith("foreign: id ")
    headless = [t for t in prompt if t not in layout.header]
    assert "header is nowhere" in ids_problem(headless, output, layout, decoded, "Greet back.", "Hello.")
    assert ids_problem(prompt, output, layout, decoded, "Greet back.", "Goodbye.").startswith("text:")


def test_server_rows_use_the_servers_ids_and_count_what_they_supervise(tokenizer):
    rows = [with_server_ids(r, tokenizer) for r in clean_rows(8, seed=2)]
    frame = turn_rows(_as_stored(rows)).frame
    spec = MaskSpec(trainer=Trainer.SPECFORGE_QWEN35, max_length=4096, last_turn_only=True)
    conversations = assemble_batch(frame).conversations
    retokenized = build_conversation_masks(tokenizer, conversations, spec, keep_ids=True)
    layout = ids_layout(tokenizer, spec.rules)
    tokens = server_rows(tokenizer, layout, frame, retokenized, last_only=True, max_length=4096)
    assert tokens.source == [SERVER] * frame.height and not any(tokens.differs_at)
    outputs = frame["output_ids"].to_list()
    assert tokens.generated.tolist() == [len(o) for o in outputs]
    assert tokens.supervised_generated.tolist() == [len(o) for o in outputs]  # every generated token trains
    short = server_rows(
        tokenizer, layout, frame, _cut(tokenizer, conversations, 30), last_only=True, max_length=30
    )
    assert (short.cut_generated > 0).all() and (
        short.supervised_generated < tokens.supervised_generated
    ).all()


def _as_stored(rows: list[dict]) -> pl.DataFrame:
    from validate_helpers import SCHEMA

    return pl.DataFrame(rows, schema=SCHEMA).with_columns(
        pl.lit("f").alias("folder"), pl.lit("s").alias("shard"), pl.int_range(pl.len()).alias("row")
    )


def _cut(tokenizer, conversations, max_length: int):  # type: ignore[no-untyped-def]
    spec = MaskSpec(trainer=Trainer.SPECFORGE_QWEN35, max_length=max_length, last_turn_only=True)
    return build_conversation_masks(tokenizer, conversations, spec, keep_ids=True)
