"""``n > 1`` on the simulator's chat surface, as SGLang 0.5.23 serves it: the prompt prefilled alone first, then
``n`` independent copies that find it cached, answered as one reply with a choice per copy."""

from __future__ import annotations

from sim_helpers import post_json, prompt_ids, truth_for

from draftgen.sim.prefix_cache import CHUNK

LONG = [
    {
        "role": "user",
        "content": "Summarise these notes. " + " ".join(f"note {i} says {i * 7}." for i in range(80)),
    }
]


def test_n2_reply_has_a_choice_per_copy_and_counts_the_prompt_once(sim_fleet):
    fleet = sim_fleet(profile="b200-mtp", speed=50, server_args=("--enable-cache-report",))
    body = {
        "model": "m",
        "messages": LONG,
        "max_tokens": 300,
        "n": 2,
        "seed": 5,
        "rid": "pair",
        "return_spec_tokens_details": True,
        "return_output_ids_in_sglext": True,
    }
    status, reply = post_json(f"{fleet.urls[0]}/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["id"] == "pair-0"
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    first, second = (truth_for(fleet, f"pair-{i}") for i in range(2))
    assert first["seed"] != second["seed"]  # two draws, whatever the request's seed
    texts = [c["message"]["reasoning_content"] for c in reply["choices"]]
    assert texts[0] != texts[1]

    tokens = len(prompt_ids(fleet, LONG))
    cached = (tokens - 1) // CHUNK * CHUNK
    usage = reply["usage"]
    completions = first["completion_tokens"] + second["completion_tokens"]
    assert usage["prompt_tokens"] == tokens  # once, not twice
    assert usage["completion_tokens"] == completions
    assert usage["total_tokens"] == tokens + completions
    assert usage["prompt_tokens_details"] == {"cached_tokens": cached}  # the first copy's
    sglext = reply["sglext"]
    assert [len(ids) for ids in sglext["output_ids"]] == [
        first["completion_tokens"],
        second["completion_tokens"],
    ]
    assert [d["spec_verify_ct"] for d in sglext["spec_tokens_details"]] == [
        first["verify_steps"],
        second["verify_steps"],
    ]


def test_n2_prefills_the_prompt_once_before_its_copies(sim_fleet):
    """Ground truth: a prefill-only request (no tokens) finishes before either copy is admitted, and each copy
    prefills only what the cache does not hold."""
    fleet = sim_fleet(profile="b200-mtp", speed=50)
    body = {"model": "m", "messages": LONG, "max_tokens": 64, "n": 2, "rid": "two"}
    status, _ = post_json(f"{fleet.urls[0]}/v1/chat/completions", body)
    assert status == 200
    warm_up = truth_for(fleet, "two-prefill")
    copies = [truth_for(fleet, f"two-{i}") for i in range(2)]
    assert (warm_up["kind"], warm_up["completion_tokens"], warm_up["cached_tokens"]) == ("prefill", 0, 0)
    assert all(c["admitted"] >= warm_up["finished"] for c in copies)
    cached = (warm_up["prompt_tokens"] - 1) // CHUNK * CHUNK
    assert [c["cached_tokens"] for c in copies] == [cached, cached]


def test_n_is_refused_with_a_stream_or_below_one(sim_fleet):
    fleet = sim_fleet(profile="instant")
    url = f"{fleet.urls[0]}/v1/chat/completions"
    streamed = post_json(url, {"model": "m", "messages": LONG, "n": 2, "stream": True})
    assert streamed[0] == 400 and "n > 1" in streamed[1]["message"]
    assert post_json(url, {"model": "m", "messages": LONG, "n": 0})[0] == 400
    assert post_json(url, {"model": "m", "messages": LONG, "n": 1, "max_tokens": 4})[0] == 200
