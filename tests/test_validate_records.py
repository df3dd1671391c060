"""validate in bounded memory: records streamed to samples.parquet batch by batch, the corpus index kept as hashes.

Each test holds the streamed path against what keeping everything in memory gives: one batch for the whole corpus,
or the corpus-wide frame of ids and answer texts the index was once built from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
from validate_helpers import clean_rows, planted_rows, row, with_server_ids, write_generation

from draftgen.params import build_config
from draftgen.validate import report
from draftgen.validate.checks import index_corpus
from draftgen.validate.config import ValidateConfig
from draftgen.validate.coverage import check_coverage
from draftgen.validate.folders import open_generations
from draftgen.validate.pipeline import RECORDS_FILE, SUMMARY_FILE, count_flags, validate_generation
from draftgen.validate.reader import open_generation
from draftgen.validate.records import PARTS, RecordsWriter


def _config(generation: Path, tokenizer_dir: Path, out: Path, **overrides) -> ValidateConfig:
    values = {
        "generation_dir": str(generation),
        "tokenizer": str(tokenizer_dir),
        "out_dir": str(out),
        "train_max_length": 512,
        "duplicate_answer_min_prompts": 3,
        "holdout_share": 0.2,  # some held-out rows, so the held-out counts are compared too
        **overrides,
    }
    return build_config(ValidateConfig, values)


def _corpus(folder: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Clean rows, every planted defect, an id stored twice in different shards; the server's ids on all."""
    clean = clean_rows(30)
    repeat = row(
        clean[2]["id"], reasoning="a second answer for an id", content="Stored twice by a bad resume."
    )
    rows = clean[:15] + [r for r, _ in planted_rows()] + clean[15:] + [repeat]
    write_generation(folder, [with_server_ids(r, tokenizer) for r in rows], shard_size=9)


def test_records_streamed_in_small_batches_equal_one_batch_of_everything(tmp_path, tokenizer_dir, tokenizer):
    _corpus(tmp_path / "gen", tokenizer)
    whole = validate_generation(
        _config(tmp_path / "gen", tokenizer_dir, tmp_path / "whole", batch_size=10_000),
        tokenizer=tokenizer,
        progress=False,
    )
    streamed = validate_generation(
        _config(tmp_path / "gen", tokenizer_dir, tmp_path / "streamed", batch_size=4),
        tokenizer=tokenizer,
        progress=False,
    )
    assert whole.records.height == streamed.records.height > 50
    assert whole.records.equals(streamed.records)  # same rows, same order, same schema
    assert streamed.counts == whole.counts
    assert streamed.counts["held_out"]["rows"] and streamed.counts["dropped"]  # both paths exercised
    # The lazy counts are what counting the whole frame in memory gives.
    assert count_flags(streamed.records, streamed.config) == streamed.counts
    summary = json.loads((tmp_path / "streamed" / SUMMARY_FILE).read_text())
    assert summary["counts"] == json.loads(json.dumps(whole.counts))
    assert not (tmp_path / "streamed" / PARTS).exists()  # the per-batch parts are combined and removed
    assert pl.read_parquet(tmp_path / "streamed" / RECORDS_FILE).equals(streamed.records)
    for flag in ("empty_answer", "duplicate_id", "duplicate_answer"):
        assert report.flag_examples(streamed, flag).equals(report.flag_examples(whole, flag))
        assert report.flag_examples(streamed, flag).height
    assert report.flag_table(streamed).equals(report.flag_table(whole))


def test_mask_sum_histogram_from_counts_per_value_has_the_bars_of_every_sample(
    tmp_path, tokenizer_dir, tokenizer
):
    import matplotlib

    matplotlib.use("Agg")
    _corpus(tmp_path / "gen", tokenizer)
    result = validate_generation(
        _config(tmp_path / "gen", tokenizer_dir, tmp_path / "out"), tokenizer=tokenizer, progress=False
    )
    bars = report.plot_mask_sums(result).patches
    edges = [bar.get_x() for bar in bars] + [bars[-1].get_x() + bars[-1].get_width()]
    expected, _ = np.histogram(result.records["mask_sum"].to_numpy(), bins=edges)
    assert [bar.get_height() for bar in bars] == expected.tolist()
    assert expected.sum() == result.samples


def test_records_writer_gives_every_part_one_schema_and_keeps_batch_order(tmp_path):
    writer = RecordsWriter(tmp_path / RECORDS_FILE)
    writer.write(pl.DataFrame({"id": ["a", "b"], "finish_reason": ["stop", None], "n": [1, 2]}))
    writer.write(pl.DataFrame({"id": ["c"], "finish_reason": [None], "n": [3]}))  # finish_reason: Null dtype
    writer.write(pl.DataFrame({"id": ["d"], "finish_reason": ["length"], "n": [4]}))
    path = writer.close()
    frame = pl.read_parquet(path)
    assert frame["id"].to_list() == ["a", "b", "c", "d"]
    assert frame["finish_reason"].to_list() == ["stop", None, None, "length"]
    assert frame.schema["finish_reason"] == pl.String
    assert not (tmp_path / PARTS).exists()


def _reference_index(folder: Path, min_prompts: int) -> tuple[set[tuple[str, int]], dict[str, int]]:
    """The index as the whole corpus in memory gives it: repeats of an id (shard, row), and shared answers
    (the first 80 characters of the first occurrence) with how many rows hold each."""
    output = open_generation(folder)
    corpus = pl.concat(
        pl.read_parquet(s, columns=["id", "content"]).with_columns(
            pl.lit(s.name).alias("shard"), pl.int_range(pl.len()).alias("row")
        )
        for s in output.shards
    ).with_columns(pl.col("content").fill_null("").str.strip_chars().alias("answer"))
    repeats = corpus.filter(~pl.col("id").is_first_distinct())
    shared = (
        corpus.filter(pl.col("answer") != "")
        .group_by("answer", maintain_order=True)
        .len()
        .filter(pl.col("len") >= min_prompts)
    )
    return (
        set(repeats.select("shard", "row").iter_rows()),
        {answer[:80]: n for answer, n in shared.iter_rows()},
    )


def test_index_of_hashes_finds_what_the_whole_corpus_in_memory_finds(tmp_path):
    clean = clean_rows(12)
    long_shared = "The same long answer, " + "word " * 40  # previews are its first 80 characters
    rows = [
        *clean[:5],
        row("late-1", reasoning="r", content=long_shared),
        row(clean[1]["id"], reasoning="r", content="a repeat of an early id, in a later shard"),
        *clean[5:],
        row("late-2", reasoning="r", content="  " + long_shared + "\n"),  # the same once stripped
        row("late-3", reasoning="r", content=long_shared),
        row(clean[1]["id"], reasoning="r", content="and again"),
        row("blank-1", reasoning="r", content="   "),  # blank answers are never "shared"
        row("blank-2", reasoning="r", content=None),
        row("blank-3", reasoning="r", content=""),
    ]
    write_generation(tmp_path / "gen", rows, shard_size=4)
    repeats, shared = _reference_index(tmp_path / "gen", min_prompts=3)
    assert len(repeats) == 2 and len(shared) == 1  # the corpus holds what the test means it to
    index = index_corpus([open_generation(tmp_path / "gen")], min_prompts=3)
    assert {(shard, row_) for _, shard, row_ in index.duplicate_rows} == repeats
    examples = index.duplicate_answer_examples
    assert dict(examples.select("answer", "count").iter_rows()) == shared
    assert examples["answer_hash"].to_list() == index.duplicate_answers.to_list()
    coverage = check_coverage(open_generations([str(tmp_path / "gen")]))
    ids = [r["id"] for r in rows]
    assert coverage.stored == len(set(ids)) == len(ids) - 2
    assert coverage.duplicates.select("id", "copies").rows() == [(clean[1]["id"], 3)]
    assert coverage.duplicates["folders"].to_list() == [[str(tmp_path / "gen")] * 3]
