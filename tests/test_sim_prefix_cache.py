"""The simulator's prefix cache: which part of a prompt needs no prefill, what that prefill is charged, and how
SGLang reports the cached tokens (``meta_info.cached_tokens``, ``usage.prompt_tokens_details``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sim_helpers import post_json, prompt_ids, truth_for

from draftgen.sim.core import ServerConfig, SimServer
from draftgen.sim.engine import SimRequest
from draftgen.sim.prefix_cache import CHUNK, CacheSettings, PrefixCache
from draftgen.sim.profiles import get_profile

LONG = [
    {
        "role": "user",
        "content": "Summarise these notes. " + " ".join(f"note {i} says {i * 7}." for i in range(80)),
    }
]


def test_a_repeated_prompt_reuses_its_last_whole_chunk_within_all_but_its_last_token():
    cache = PrefixCache(capacity=8)
    ids = list(range(200))
    assert cache.match(ids) == 0
    cache.insert(ids)
    assert cache.match(ids) == 192  # 3 chunks of 64; the rest (8 tokens) is prefilled again
    assert cache.match([*ids, 7, 8, 9]) == 192  # a longer prompt that starts with it (a next turn)
    assert cache.match([1, *ids[1:]]) == 0  # one token differs in the first chunk: nothing
    assert cache.match(ids[:150]) == 0  # no checkpoint inside a shorter prompt (states only at prefill ends)


def test_a_prompt_of_whole_chunks_finds_nothing_of_its_own_repeat():
    """SGLang matches at most len - 1 tokens, and the state is kept at len: the repeat is prefilled in full."""
    cache = PrefixCache(capacity=8)
    ids = list(range(2 * CHUNK))
    cache.insert(ids)
    assert cache.match(ids) == 0
    assert cache.match([*ids, 5]) == 2 * CHUNK
    cache.insert(list(range(CHUNK - 1)))  # shorter than a chunk: leaves nothing
    assert len(cache) == 1


def test_least_recently_used_checkpoints_are_evicted_past_capacity():
    cache = PrefixCache(capacity=2)
    a, b, c = ([k] * 100 for k in (1, 2, 3))
    cache.insert(a)
    cache.insert(b)
    assert cache.match(a) == 64  # a is now the most recently used
    cache.insert(c)
    assert (cache.match(a), cache.match(b), cache.match(c)) == (64, 0, 64)


def _charged_steps(tokenizer_dir: Path, cache: CacheSettings, batches: list[list[str]]) -> tuple[list, list]:
    """Run a real server's engine (no HTTP) over ``batches``: the prompts of each batch submitted together, the
    next batch once they are done. Returns each batch's requests and the simulated seconds of every step as
    the engine charged them (its ground truth; the step waits themselves are skipped)."""
    server = SimServer(ServerConfig(port=0, tokenizer=tokenizer_dir, cache=cache))
    charged: list[float] = []

    async def charge(wall_seconds: float) -> None:
        charged.append(wall_seconds)  # speed 1: simulated seconds
        await asyncio.sleep(0)

    server.engine._wait_step = charge  # type: ignore[method-assign]

    async def run() -> list[list[SimRequest]]:
        loop_task = asyncio.create_task(server.engine.run())
        server.engine.mark_ready()
        done = []
        try:
            for batch in batches:
                requests = []
                for i, text in enumerate(batch):
                    ids = server.tokenizer.encode(text)
                    request = server.planner.new_request(
                        f"r{len(done)}-{i}",
                        "chat",
                        prompt_tokens=len(ids),
                        seed=len(done) * 10 + i,
                        max_tokens=8,
                        enable_thinking=True,
                        ignore_eos=True,
                        stream=False,
                        prompt_ids=tuple(ids),
                    )
                    server.engine.submit(request)
                    requests.append(request)
                await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in requests)), 30)
                done.append(requests)
        finally:
            loop_task.cancel()
        return done

    return asyncio.run(run()), charged


def test_the_prefill_is_charged_for_the_uncached_part_only(sim_tokenizer_dir):
    """The same prompt twice, one after the other: the second admission step is charged p0 + p1 · (prompt −
    cached), the first p0 + p1 · prompt; with --disable-radix-cache both pay in full."""
    profile = get_profile("b200-mtp")
    text = LONG[0]["content"]
    ((first,), (second,)), charged = _charged_steps(sim_tokenizer_dir, CacheSettings(), [[text], [text]])
    tokens = first.prompt_tokens
    assert tokens > 3 * CHUNK and first.cached_tokens == 0
    assert second.cached_tokens == (tokens - 1) // CHUNK * CHUNK
    steps_alone = first.verify_steps  # each request runs alone: its first step also prefills it
    decode = profile.step_seconds(1)
    assert charged[0] == pytest.approx(decode + profile.prefill_seconds(tokens))
    assert charged[steps_alone] == pytest.approx(
        decode + profile.prefill_seconds(tokens - second.cached_tokens)
    )

    _, uncached = _charged_steps(sim_tokenizer_dir, CacheSettings(disable_radix_cache=True), [[text], [text]])
    assert uncached[steps_alone] == pytest.approx(decode + profile.prefill_seconds(tokens))


def test_identical_prompts_admitted_in_one_step_are_both_prefilled_in_full(sim_tokenizer_dir):
    """SGLang's default fcfs policy: the tree learns a prompt after the step that prefilled it."""
    profile = get_profile("b200-mtp")
    text = LONG[0]["content"]
    (pair, (after,)), charged = _charged_steps(sim_tokenizer_dir, CacheSettings(), [[text, text], [text]])
    assert [r.cached_tokens for r in pair] == [0, 0]
    assert after.cached_tokens > 0
    assert charged[0] == pytest.approx(
        profile.step_seconds(2) + 2 * profile.prefill_seconds(pair[0].prompt_tokens)
    )


def test_generate_reports_the_cached_tokens_of_a_repeated_prompt(sim_fleet):
    """``meta_info.cached_tokens`` and SGLang's ``cached_tokens_details`` (null when nothing was cached)."""
    fleet = sim_fleet(profile="b200-mtp", speed=50)
    ids = prompt_ids(fleet, LONG)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}}
    url = f"{fleet.urls[0]}/generate"
    (s1, first), (s2, second) = post_json(url, body), post_json(url, body)
    assert (s1, s2) == (200, 200)
    cached = (len(ids) - 1) // CHUNK * CHUNK
    assert first["meta_info"]["cached_tokens"] == 0 and first["meta_info"]["cached_tokens_details"] is None
    assert second["meta_info"]["cached_tokens"] == cached > 0
    assert second["meta_info"]["cached_tokens_details"] == {"device": cached, "host": 0}
    assert truth_for(fleet, second["meta_info"]["id"])["cached_tokens"] == cached


def test_chat_usage_reports_cached_tokens_only_with_enable_cache_report(sim_fleet):
    fleet = sim_fleet(profile="b200-mtp", speed=50, servers=2)
    reporting = sim_fleet(profile="b200-mtp", speed=50, server_args=("--enable-cache-report",))
    body = {"model": "m", "messages": LONG, "max_tokens": 8}
    cached = (len(prompt_ids(fleet, LONG)) - 1) // CHUNK * CHUNK
    plain = [post_json(f"{fleet.urls[0]}/v1/chat/completions", body)[1] for _ in range(2)]
    assert [r["usage"]["prompt_tokens_details"] for r in plain] == [None, None]
    assert truth_for(fleet, plain[1]["id"])["cached_tokens"] == cached  # cached all the same
    reported = [post_json(f"{reporting.urls[0]}/v1/chat/completions", body)[1] for _ in range(2)]
    assert [r["usage"]["prompt_tokens_details"] for r in reported] == [
        {"cached_tokens": 0},
        {"cached_tokens": cached},
    ]
    other_server = post_json(f"{fleet.urls[1]}/v1/chat/completions", body)[1]
    assert truth_for(fleet, other_server["id"])["cached_tokens"] == 0  # each server has its own cache
