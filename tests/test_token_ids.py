"""The compact per-turn prompt ids of a stored row (draftgen.training.token_ids): round trip, nulls, bad rows."""

from __future__ import annotations

import random

import pytest

from draftgen.training.token_ids import TokenIdsError, common_prefix, compact, expand


def conversation(turns: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts that grow by the previous prompt + output + a new user turn, as a chat history does."""
    prompts, outputs = [], []
    history = [rng.randrange(50_000) for _ in range(rng.randrange(1, 40))]
    for _ in range(turns):
        prompts.append(list(history))
        output = [rng.randrange(50_000) for _ in range(rng.randrange(0, 600))]
        outputs.append(output)
        history = history + output + [rng.randrange(50_000) for _ in range(rng.randrange(1, 30))]
    return prompts, outputs


@pytest.mark.parametrize("seed", range(5))
def test_round_trip_stores_each_history_once(seed):
    rng = random.Random(seed)
    prompts, outputs = conversation(4, rng)
    shared, suffixes = compact(prompts, outputs)
    assert expand(shared, suffixes, outputs) == prompts
    assert shared[0] == 0 and suffixes[0] == prompts[0]
    for k in range(1, 4):  # the whole previous prompt + output is shared; only the new user turn is stored
        assert shared[k] == len(prompts[k - 1]) + len(outputs[k - 1])
        assert len(suffixes[k]) == len(prompts[k]) - shared[k]


def test_a_re_rendered_history_shares_only_its_common_prefix():
    """Qwen3's template drops an earlier answer's think block: turn 2's prompt differs from turn 1's prompt +
    output after the assistant header, and shares exactly up to there."""
    header = [1, 2, 3, 4]  # <|im_start|>user ... <|im_start|>assistant\n
    thinking, answer, end = [10, 11, 12], [20, 21], [99]
    prompts = [header, header + answer + end + [5, 6]]
    outputs = [thinking + answer + end, [30, 99]]
    shared, suffixes = compact(prompts, outputs)
    assert shared == [0, len(header)]
    assert suffixes[1] == answer + end + [5, 6]
    assert expand(shared, suffixes, outputs) == prompts


def test_unknown_ids_stay_unknown_and_the_next_known_prompt_is_stored_whole():
    prompts = [[1, 2], None, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]]
    outputs = [[3], [4], None, [8]]
    shared, suffixes = compact(prompts, outputs)
    assert shared == [0, None, 0, 0]  # turn 3's previous output is unknown: nothing to share with
    assert suffixes[1] is None and suffixes[2] == [1, 2, 3, 4, 5] and suffixes[3] == prompts[3]
    assert expand(shared, suffixes, outputs) == prompts


def test_no_ids_at_all_and_empty_rows():
    assert compact([None, None], [None, None]) == ([None, None], [None, None])
    assert expand([None, None], [None, None], [None, None]) == [None, None]
    assert expand(None, None, None) == []  # a shard written before the columns existed
    assert compact([], []) == ([], [])


@pytest.mark.parametrize(
    ("shared", "suffixes", "outputs", "message"),
    [
        ([1], [[5]], [[6]], "must be 0 on the first turn"),
        ([0, 9], [[1], [2]], [[3], [4]], "has only 2"),
        ([0, 1], [[1], [2]], [None, [4]], "unknown"),
        ([0], [[1], [2]], [[3], [4]], "one per generated turn"),
        ([0, -1], [[1], [2]], [[3], [4]], "≥ 0"),
    ],
)
def test_columns_that_do_not_fit_raise_naming_the_turn(shared, suffixes, outputs, message):
    with pytest.raises(TokenIdsError, match=message):
        expand(shared, suffixes, outputs)


def test_common_prefix_across_the_block_boundary():
    a = list(range(1000))
    for n in (0, 1, 255, 256, 257, 999, 1000):
        b = [*a[:n], -1, *a[n + 1 :]]
        assert common_prefix(a, b) == min(n, len(a))
    assert common_prefix(a, a[:300]) == 300


def test_shards_written_before_the_id_columns_read_them_as_null(tmp_path):
    import polars as pl

    from draftgen.generate.store import OUTPUT_SCHEMA, scan_shards

    row = {name: None for name in OUTPUT_SCHEMA}
    row |= {"id": "old", "turn_after": [0], "turn_content": ["hi"]}
    new = dict(row, id="new", turn_output_ids=[[1, 2, 3]], turn_prompt_ids=[[7, 8]], turn_prompt_shared=[0])
    old_schema = {
        k: v for k, v in OUTPUT_SCHEMA.items() if not k.startswith(("turn_output", "turn_prompt_ids"))
    }
    old_schema.pop("turn_prompt_shared")
    pl.DataFrame([{k: row[k] for k in old_schema}], schema=old_schema).write_parquet(tmp_path / "a.parquet")
    pl.DataFrame([new], schema=OUTPUT_SCHEMA).write_parquet(tmp_path / "b.parquet")
    frame = scan_shards([tmp_path / "a.parquet", tmp_path / "b.parquet"]).collect()
    by_id = {r["id"]: r for r in frame.rows(named=True)}
    assert by_id["old"]["turn_output_ids"] is None and by_id["old"]["turn_prompt_shared"] is None
    assert by_id["new"]["turn_output_ids"] == [[1, 2, 3]]
    assert expand(by_id["new"]["turn_prompt_shared"], by_id["new"]["turn_prompt_ids"], [[1, 2, 3]]) == [
        [7, 8]
    ]
