"""validate on the real model's answers: the export's masks are SpecForge 0.2.0's own for SmolLM2's template
(GeneralParser with its "lfm" chat-template entry), built from vLLM's ids, and the held-out answers are set apart."""

from __future__ import annotations

import json
import warnings

import polars as pl
from conftest import TRAIN_MAX_LENGTH
from recording_proxy import vllm_ids


def _export(pipeline):
    return pipeline.validate_dir / "export"


def _tokens(export) -> dict[str, tuple[list[int], list[int]]]:
    frame = pl.concat([pl.read_parquet(p) for p in sorted((export / "tokens").glob("*.parquet"))])
    return {r["id"]: (list(r["input_ids"]), list(r["loss_mask"])) for r in frame.iter_rows(named=True)}


def specforge_general(
    tokenizer, conversations: list[list[dict]], max_length: int
) -> list[tuple[list[int], list[int]]]:
    """SpecForge 0.2.0's own parser for its "lfm" template, a row per turn (train_only_last_turn), as its trainer
    parses each train.jsonl row."""
    from specforge.data.parse import GeneralParser
    from specforge.data.template import TEMPLATE_REGISTRY

    template = TEMPLATE_REGISTRY.get("lfm")
    assert template.parser_type == "general"
    parser = GeneralParser(tokenizer, template)
    out = []
    for conversation in conversations:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ids, mask = parser.parse(conversation, max_length, train_only_last_turn=True)
        out.append((ids.tolist(), mask.tolist()))
    return out


def test_export_masks_equal_specforges_parser_for_smollm2(pipeline):
    from transformers import AutoTokenizer

    export = _export(pipeline)
    tokenizer = AutoTokenizer.from_pretrained(pipeline.params["model"])
    rows = [json.loads(line) for line in (export / "train.jsonl").read_text().splitlines()]
    assert len(rows) >= 20
    oracle = dict(
        zip(
            [r["id"] for r in rows],
            specforge_general(tokenizer, [r["conversations"] for r in rows], TRAIN_MAX_LENGTH),
            strict=True,
        )
    )
    records = pl.read_parquet(pipeline.validate_dir / "samples.parquet")
    differs = dict(records.filter(pl.col("differs_at").is_not_null()).select("id", "differs_at").iter_rows())
    tokens = _tokens(export)
    compared = 0
    for key, (ids, mask) in oracle.items():
        ours_ids, ours_mask = tokens[key]
        at = differs.get(key)
        if (
            at is not None
        ):  # the server's ids, which re-tokenizing the text changes: equal up to the difference
            assert ours_ids[:at] == ids[:at] and ours_mask[:at] == mask[:at], key
            continue
        assert (ours_ids, ours_mask) == (ids, mask), key
        compared += 1
    assert compared >= len(oracle) * 3 // 4
    assert sum(sum(m) for _, m in tokens.values()) > 1000, "real answers: hundreds of supervised tokens"
    print(
        f"\nSpecForge 0.2.0 lfm parser vs validate specforge-lfm: {compared} rows identical, {len(differs)} from ids"
    )


def test_export_rows_carry_vllms_own_ids(pipeline):
    export = _export(pipeline)
    records = pl.read_parquet(pipeline.validate_dir / "samples.parquet")
    source = dict(records.select("id", "token_source").iter_rows())
    wire = [vllm_ids(e) for e in pipeline.proxy.chats()]
    wire = [(p, o) for p, o in wire if p and o]
    tokens = _tokens(export)
    from_server = [k for k in tokens if source[k] == "server"]
    assert len(from_server) >= len(tokens) * 3 // 4
    for key in from_server:
        ids, mask = tokens[key]
        # a row per turn is its request's prompt ids, its output ids, then the newline the template puts after
        # <|im_end|>; an earlier turn's request is a prefix of it too, so the request is the longest that fits
        matches = [(p, o) for p, o in wire if ids[: len(p) + len(o)] == p + o]
        assert matches, f"{key}: no request of the run sent these prompt and output ids"
        prompt, output = max(matches, key=lambda m: len(m[0]) + len(m[1]))
        assert len(ids) - len(prompt) - len(output) <= 1, (
            f"{key}: more than the closing newline after the answer"
        )
        assert all(mask[len(prompt) :]), key


def test_held_out_answers_are_an_eval_set_apart_from_training(pipeline):
    export = _export(pipeline)
    train = {json.loads(x)["id"] for x in (export / "prompts.jsonl").read_text().splitlines()}
    held = [json.loads(x) for x in (export / "holdout" / "eval.jsonl").read_text().splitlines()]
    held_prompts = {
        json.loads(x)["id"] for x in (export / "holdout" / "prompts.jsonl").read_text().splitlines()
    }
    assert held and not {r["id"] for r in held} & train
    assert {r["id"].partition("#")[0] for r in held} <= held_prompts
    assert all(sum(r["loss_mask"]) > 0 for r in held)


def test_validate_flags_and_drops_every_turn_the_loop_check_ended(pipeline):
    records = pl.read_parquet(pipeline.validate_dir / "samples.parquet")
    looped = records.filter(pl.col("flags").list.contains("repetition_loop"))
    assert looped.height > 0 and looped["dropped"].all()
    exported = {json.loads(x)["id"] for x in (_export(pipeline) / "prompts.jsonl").read_text().splitlines()}
    assert not exported & set(looped["id"].to_list())
