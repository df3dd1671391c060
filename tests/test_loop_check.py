"""The repetition-loop detector: loops of every period found at the first moment the rule holds, where they start;
near-repeats, short repeats, long periods and ordinary text never; the text path independent of how it is chunked."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from draftgen.client.loops import PIECES, Loop, LoopDetector, LoopRule, TextLoopCheck

RULE = LoopRule()
ALPHABET = 50_000  # distinct units, like a vocabulary


def _feed_chunked(detector: LoopDetector, units: list[int], rng: random.Random) -> Loop | None:
    """Feed ``units`` in random chunks of 1..6, as a stream delivers them; the loop once found."""
    i = 0
    while i < len(units):
        size = rng.randint(1, 6)
        found = detector.feed(units[i : i + size])
        if found is not None:
            return found
        i += size
    return None


def _looping(rng: random.Random, prefix: int, period: int, total: int) -> list[int]:
    """``prefix`` random units, then one random cycle of ``period`` units repeated up to ``total`` units. The prefix's
    last unit differs from the cycle's last, so the periodic stretch starts exactly at ``prefix``."""
    cycle = [rng.randrange(ALPHABET) for _ in range(period)]
    head = [rng.randrange(ALPHABET) for _ in range(prefix)]
    if head and head[-1] == cycle[-1]:
        head[-1] = (head[-1] + 1) % ALPHABET
    units = head + cycle * (total // period + 2)
    return units[:total]


@pytest.mark.parametrize("period", range(1, RULE.max_period + 1))
def test_every_period_is_found_at_the_first_moment_the_rule_holds(period: int) -> None:
    rng = random.Random(period)
    prefix = rng.randrange(0, 3000)
    units = _looping(rng, prefix, period, prefix + RULE.needed(period) + 400)
    found = _feed_chunked(LoopDetector(), units, rng)
    assert found == Loop(start=prefix, period=period, found_at=prefix + RULE.needed(period))
    assert found.kept == prefix + 2 * period


def test_the_cycle_found_is_the_shortest_even_when_it_holds_repeated_pieces() -> None:
    """A cycle whose own units recur inside it (a b a c b c ...) is still found with its true period."""
    rng = random.Random(7)
    for period in (6, 12, 40, 300):
        base = [rng.randrange(20) for _ in range(period // 2)]
        cycle = base + base[::-1]  # every unit occurs at least twice per cycle
        cycle[-1] = ALPHABET + period  # but the cycle is not a shorter one repeated
        prefix = [rng.randrange(ALPHABET, 2 * ALPHABET) for _ in range(500)]
        units = prefix + cycle * (RULE.needed(period) // period + 3)
        found = _feed_chunked(LoopDetector(), units, rng)
        assert found is not None and found.period == period and found.start == 500


def test_a_cycle_that_is_a_repeated_shorter_one_reports_the_shorter() -> None:
    rng = random.Random(3)
    unit = [rng.randrange(ALPHABET) for _ in range(5)]
    units = [rng.randrange(ALPHABET) for _ in range(100)] + (unit * 4) * 40
    found = _feed_chunked(LoopDetector(), units, rng)
    assert found is not None and found.period == 5


@pytest.mark.parametrize("period", [1, 2, 3, 17, 85, 86, 200, 512])
def test_one_unit_short_of_the_rule_never_triggers(period: int) -> None:
    rng = random.Random(period)
    units = _looping(rng, 300, period, 300 + RULE.needed(period) - 1)
    assert _feed_chunked(LoopDetector(), units, rng) is None
    detector = LoopDetector()
    detector.feed(units)
    assert detector.feed([units[-period]]) is not None  # the next unit of the cycle: found


@pytest.mark.parametrize("period", [513, 700, 1000])
def test_periods_past_max_period_are_not_loops(period: int) -> None:
    rng = random.Random(period)
    units = _looping(rng, 100, period, 100 + 5 * period)
    assert _feed_chunked(LoopDetector(), units, rng) is None


@pytest.mark.parametrize("period", [129, 200, 400, 512])
def test_a_long_stretch_said_twice_is_not_a_loop(period: int) -> None:
    """Twice over min_span units (a block of code written, then written again) is not three times."""
    rng = random.Random(period)
    units = _looping(rng, 100, period, 100 + 2 * period) + [rng.randrange(ALPHABET) for _ in range(2000)]
    assert _feed_chunked(LoopDetector(), units, rng) is None


@pytest.mark.parametrize("period", [3, 10, 50, 200, 512])
def test_a_counter_that_changes_each_time_round_is_not_a_loop(period: int) -> None:
    """'Step 1: ... Step 2: ...': the same words each time, one unit different: the run breaks every cycle."""
    rng = random.Random(period)
    cycle = [rng.randrange(ALPHABET) for _ in range(period)]
    at = rng.randrange(period)
    units = [rng.randrange(ALPHABET) for _ in range(200)]
    for i in range(max(40, 4000 // period)):
        units += [*cycle[:at], ALPHABET + i, *cycle[at + 1 :]]
    assert _feed_chunked(LoopDetector(), units, rng) is None


@pytest.mark.parametrize("seed", range(20))
def test_near_repeats_with_one_change_per_cycle_at_random_places_never_trigger(seed: int) -> None:
    rng = random.Random(seed)
    period = rng.randint(1, 512)
    cycle = [rng.randrange(ALPHABET) for _ in range(period)]
    units = [rng.randrange(ALPHABET) for _ in range(rng.randrange(1000))]
    for _ in range(max(6, 3000 // period)):
        noisy = list(cycle)
        noisy[rng.randrange(period)] = rng.randrange(ALPHABET, 2 * ALPHABET)  # never the cycle's own unit
        units += noisy
    # with one change per cycle no run reaches a whole period past the cycle, let alone the rule
    assert _feed_chunked(LoopDetector(), units, rng) is None


def test_random_units_from_a_small_alphabet_never_trigger() -> None:
    rng = random.Random(11)
    units = [rng.randrange(8) for _ in range(200_000)]  # frequent short coincidences, none of 256 units
    assert _feed_chunked(LoopDetector(), units, rng) is None


def test_a_loop_after_a_near_repeat_is_still_found_where_it_starts() -> None:
    rng = random.Random(5)
    cycle = [rng.randrange(ALPHABET) for _ in range(30)]
    near = [*cycle[:10], ALPHABET + 1, *cycle[11:]] * 3  # near-repeats first...
    start = 100 + len(near)
    units = (
        [rng.randrange(ALPHABET) for _ in range(100)] + near + [ALPHABET + 2] + cycle * 20
    )  # ...then a loop
    found = _feed_chunked(LoopDetector(), units, rng)
    assert found is not None and found.period == 30 and found.start == start + 1


def test_a_detector_remembers_only_a_bounded_window() -> None:
    detector = LoopDetector()
    rng = random.Random(1)
    sizes = (len(detector._ring), len(detector._head), len(detector._prev))
    detector.feed([rng.randrange(ALPHABET) for _ in range(100_000)])
    assert (len(detector._ring), len(detector._head), len(detector._prev)) == sizes
    assert len(detector._cands) <= 8


def test_the_rule_is_checked() -> None:
    with pytest.raises(ValueError, match="min_repeats"):
        LoopRule(min_repeats=1)
    assert LoopRule(max_period=4, min_repeats=2, min_span=3).needed(4) == 8
    rule = LoopRule(max_period=16, min_repeats=2, min_span=20)
    units = [1000 + i for i in range(50)] + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 5
    assert LoopDetector(rule).feed(units) == Loop(start=50, period=10, found_at=70)


# ----- the text path ------------------------------------------------------------------------------------------------
SENTENCE = "Wait, let me re-check the second case: if n = 12 then the sum is 78, which matches.\n"


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        size = rng.randint(1, 24)
        out.append(text[i : i + size])
        i += size
    return out


def test_a_text_loop_is_cut_at_the_end_of_its_first_repetition_whatever_the_chunking() -> None:
    prefix = "Okay, so we need the sum of the first n integers. The formula is n(n+1)/2\n"
    text = prefix + SENTENCE * 40
    results = set()
    for seed in range(30):
        check = TextLoopCheck()
        for chunk in _chunks(text, random.Random(seed)):
            if check.feed(chunk, "reasoning") is not None:
                break
        found = check.finish()
        assert found is not None
        results.add(found)
    assert len(results) == 1  # the same pieces, whatever the chunks
    (found,) = results
    assert found.period == len(PIECES.findall(SENTENCE))
    assert text[found.start_char : found.kept_chars] == SENTENCE * 2
    assert found.start_char == len(prefix)
    assert found.received_chars >= found.kept_chars


def test_the_pieces_are_about_one_qwen_token_each() -> None:
    assert PIECES.findall("Hello world, it's 2024!\n\nOK") == [
        "Hello",
        " world",
        ",",
        " it",
        "'s",
        " ",
        "2",
        "0",
        "2",
        "4",
        "!\n\n",
        "OK",
    ]


def test_a_loop_never_spans_the_switch_from_reasoning_to_answer() -> None:
    """The same sentence ending the reasoning and starting the answer is not one stretch."""
    check = TextLoopCheck(LoopRule(max_period=64, min_repeats=3, min_span=10))
    check.feed(SENTENCE * 2, "reasoning")
    check.feed(SENTENCE * 2, "content")
    assert check.finish() is None
    check.feed(SENTENCE, "content")  # a third time inside the answer
    found = check.finish()
    assert found is not None and found.start_char == len(SENTENCE) * 2


def test_prose_and_code_do_not_trigger() -> None:
    """This repository's docs and sources as answers: markdown tables, code, lists — no loop in any."""
    root = Path(__file__).resolve().parent.parent
    files = sorted([*root.glob("docs/*.md"), *root.glob("src/draftgen/**/*.py")])
    assert len(files) > 50
    for path in files:
        check = TextLoopCheck()
        check.feed(path.read_text(encoding="utf-8"), "content")
        assert check.finish() is None, path


def test_a_whole_answer_given_at_once_is_cut_at_the_right_character() -> None:
    """A non-streamed answer arrives whole: thousands of pieces before the loop, offsets still exact."""
    rng = random.Random(2)
    words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(6000)) + "\n"
    text = words + SENTENCE * 30
    check = TextLoopCheck()
    check.feed(text, "reasoning")
    found = check.finish()
    assert found is not None
    assert found.start_char == len(words)
    assert text[found.start_char : found.kept_chars] == SENTENCE * 2
