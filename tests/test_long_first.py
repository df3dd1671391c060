"""tests/long_first.py: each long test at the start of a worker's block, as worksteal first splits the collection."""

from __future__ import annotations

from long_first import block_sizes, long_first


def test_blocks_are_worksteals_first_split():
    assert block_sizes(10, 4) == [2, 2, 3, 3] and sum(block_sizes(1812, 4)) == 1812
    assert block_sizes(3, 1) == [3]


def test_each_block_starts_with_long_tests_a_modules_together_and_nothing_is_lost():
    items = [f"t{i}" for i in range(20)]
    long = {"t3": "a", "t4": "a", "t9": "b", "t15": "c", "t19": "d"}
    weights = [{"a": 0.5}.get(long.get(i, ""), 1.0 if i in long else 0.0) for i in items]  # a: marked whole
    ordered = long_first(items, weights, [long.get(i, i) for i in items], workers=4)
    assert sorted(ordered) == sorted(items)
    blocks, start = [], 0
    for size in block_sizes(20, 4):
        blocks.append(ordered[start : start + size])
        start += size
    assert blocks[0][:2] == ["t3", "t4"]  # module a's two, together, in the first block
    assert sorted(block[0] for block in blocks[1:]) == [
        "t15",
        "t19",
        "t9",
    ]  # one long test heads each other block
    short = [i for i in ordered if i not in long]
    assert short == [i for i in items if i not in long]  # the rest keep their order
    assert long_first(items, [float(i in long) for i in items], items, workers=1)[:5] == [
        "t3",
        "t4",
        "t9",
        "t15",
        "t19",
    ]
