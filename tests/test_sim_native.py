"""Raw HTTP against the simulator: native /generate, /server_info, /metrics and the health endpoints."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time

import aiohttp
import pytest
from sim_helpers import (
    USER,
    count,
    eos_id,
    get,
    get_json,
    post,
    post_json,
    post_many,
    sample_value,
    scrape,
    sse_json,
    tokenizer_of,
    truth_for,
    wait_for,
)

from draftgen.sim.fleet import http_status

SHAPES = {"0.5.4": 0, "0.5.9": 1, "0.5.23": 2}  # shared fleet server index per SGLang shape
# A chat prompt as the Qwen3 template renders USER, thinking on and off (/generate takes raw text)
HEADER = f"<|im_start|>user\n{USER[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
PROMPT = HEADER + "<think>\n"
NO_THINK = HEADER + "<think>\n\n</think>\n\n"
SPEC_KEYS = {
    "0.5.4": {"spec_verify_ct"},
    "0.5.9": {
        "spec_verify_ct",
        "spec_accept_length",
        "spec_accept_rate",
        "spec_accept_token_num",
        "spec_draft_token_num",
        "spec_accept_histogram",
    },
    "0.5.23": {
        "spec_verify_ct",
        "spec_accept_length",
        "spec_accept_rate",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_correct_drafts_histogram",
    },
}
ALL_SPEC_KEYS = set().union(*SPEC_KEYS.values())


def generate(
    url: str, max_new_tokens: int, stream: bool = False, text: str = PROMPT, **body
) -> tuple[int, bytes]:
    payload = {
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.6},
        "stream": stream,
    }
    payload.update(body)
    return post(f"{url}/generate", payload)


def generate_json(url: str, max_new_tokens: int, **body) -> dict:
    status, reply = post_json(
        f"{url}/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens}, **body}
    )
    assert status == 200, reply
    return reply


# ----- /generate -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", list(SHAPES))
def test_generate_meta_info_per_sglang_shape(shared_sim_fleet, shape):
    url = shared_sim_fleet.urls[SHAPES[shape]]
    reply = generate_json(url, 8192)
    assert set(reply) == {"text", "output_ids", "meta_info"}
    meta = reply["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": eos_id(shared_sim_fleet)}
    assert meta["prompt_tokens"] == count(shared_sim_fleet, PROMPT)
    assert (
        meta["completion_tokens"] == count(shared_sim_fleet, reply["text"]) + 1
    )  # the EOS is counted, not shown
    assert len(reply["output_ids"]) == meta["completion_tokens"]
    tokenizer = tokenizer_of(shared_sim_fleet)  # the ids are the text's, the EOS last (as SGLang sends them)
    assert reply["output_ids"] == [*tokenizer.encode(reply["text"]), tokenizer.eos_id]
    assert meta["e2e_latency"] > 0
    assert "</think>" in reply["text"]  # /generate returns raw text: no reasoning parser
    assert set(meta) & ALL_SPEC_KEYS == SPEC_KEYS[shape]
    truth = truth_for(shared_sim_fleet, meta["id"], SHAPES[shape])
    assert meta["spec_verify_ct"] == truth["verify_steps"]
    assert meta["completion_tokens"] == truth["completion_tokens"]
    if shape != "0.5.4":
        verify, tokens = meta["spec_verify_ct"], meta["completion_tokens"]
        assert meta["spec_accept_length"] == pytest.approx(tokens / verify)
        histogram = meta["spec_accept_histogram" if shape == "0.5.9" else "spec_correct_drafts_histogram"]
        assert sum(histogram) == verify
        assert sum((i + 1) * n for i, n in enumerate(histogram)) == tokens
        correct = meta["spec_accept_token_num" if shape == "0.5.9" else "spec_num_correct_drafts"]
        proposed = meta["spec_draft_token_num" if shape == "0.5.9" else "spec_num_proposed_drafts"]
        assert correct == tokens - verify and proposed == 3 * verify
        assert meta["spec_accept_rate"] == pytest.approx(correct / proposed)


def test_generate_length_finish(shared_sim_fleet):
    meta = generate_json(shared_sim_fleet.urls[2], 37)["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 37}
    assert meta["completion_tokens"] == 37


def test_generate_from_input_ids_and_without_thinking(shared_sim_fleet):
    url = shared_sim_fleet.urls[2]
    status, reply = post_json(
        f"{url}/generate", {"input_ids": list(range(123)), "sampling_params": {"max_new_tokens": 16}}
    )
    assert status == 200 and reply["meta_info"]["prompt_tokens"] == 123
    status, reply = post_json(
        f"{url}/generate", {"text": NO_THINK, "sampling_params": {"max_new_tokens": 4096}}
    )
    assert status == 200 and "</think>" not in reply["text"]
    assert reply["meta_info"]["completion_tokens"] == count(shared_sim_fleet, reply["text"]) + 1


def test_generate_streaming_is_cumulative_and_ends_with_done(shared_sim_fleet):
    url = shared_sim_fleet.urls[2]
    full = generate_json(url, 8192)
    status, raw = generate(url, 8192, stream=True)
    assert status == 200
    events, done = sse_json(raw)
    assert done and len(events) > 2
    texts = [e["text"] for e in events]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert texts[-1] == full["text"]
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts)
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]
    truth = truth_for(shared_sim_fleet, events[-1]["meta_info"]["id"], 2)
    assert truth["stream"] and sum(truth["emit_counts"]) == truth["completion_tokens"] == counts[-1]


def test_generate_rejects_a_body_without_text(shared_sim_fleet):
    status, reply = post_json(f"{shared_sim_fleet.urls[2]}/generate", {"sampling_params": {}})
    assert status == 400 and "text or input_ids" in reply["message"]


# ----- /server_info ----------------------------------------------------------------------------------------
def _states(url: str, path: str = "/server_info") -> list[dict]:
    info = get_json(f"{url}{path}")
    assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1  # one DP rank
    return info["internal_states"]


def test_server_info_fresh_server_has_no_acceptance_yet(sim_fleet):
    fleet = sim_fleet(profile="b200-mtp", speed=50)
    url = fleet.urls[0]
    for path in ("/server_info", "/get_server_info"):
        state = _states(url, path)[0]
        assert {"last_gen_throughput", "memory_usage", "effective_max_running_requests_per_dp"} <= set(state)
        assert state["effective_max_running_requests_per_dp"] == 48
        assert "avg_spec_accept_length" not in state
    assert get_json(f"{url}/server_info").keys() == get_json(f"{url}/get_server_info").keys()


def test_avg_spec_accept_length_is_cumulative_and_refreshed_every_40_steps(sim_fleet):
    """One streamed request alone in the batch, so its per-step token counts give every step of the server."""
    fleet = sim_fleet(profile="b200-mtp", speed=50)
    url = fleet.urls[0]
    status, raw = generate(url, 300, stream=True)
    assert status == 200
    rid = sse_json(raw)[0][-1]["meta_info"]["id"]
    request = truth_for(fleet, rid)
    (warmup,) = [r for r in fleet.truth() if r["kind"] == "warmup"]
    w = warmup["verify_steps"]
    counts = request["emit_counts"]
    assert len(counts) == request["verify_steps"]
    assert 80 <= w + len(counts) < 120, "the test needs exactly two refreshes (steps 40 and 80)"

    def tokens_through(step: int) -> int:  # cumulative tokens after server decode step ``step``
        return warmup["completion_tokens"] + sum(counts[: step - w])

    state = _states(url)[0]
    assert state["avg_spec_accept_length"] == pytest.approx(tokens_through(80) / 80)  # cumulative, warm-up in
    interval = (tokens_through(80) - tokens_through(40)) / 40
    assert sample_value(scrape(url), "sglang:spec_accept_length") == pytest.approx(interval)


def test_avg_spec_accept_length_absent_without_speculation(sim_fleet):
    fleet = sim_fleet(profile="rtx-pro-6000", speed=100)
    generate_json(fleet.urls[0], 60)
    state = _states(fleet.urls[0])[0]
    assert "avg_spec_accept_length" not in state and state["effective_max_running_requests_per_dp"] == 64
    assert "sglang:spec_accept_length" not in scrape(fleet.urls[0])


# ----- /metrics --------------------------------------------------------------------------------------------
METRIC_TYPES = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:spec_accept_length": "gauge",
    "sglang:prompt_tokens": "counter",
    "sglang:generation_tokens": "counter",
    "sglang:num_requests": "counter",
    "sglang:num_aborted_requests": "counter",
    "sglang:spec_verify_calls": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}


def test_metrics_names_and_types(shared_sim_fleet):
    families = scrape(shared_sim_fleet.urls[2])
    for name, kind in METRIC_TYPES.items():
        assert name in families, name
        assert families[name].type == kind, name
    for name in METRIC_TYPES:
        for sample in families[name].samples:
            assert sample.labels.get("model_name") == "Qwen/Qwen3.6-27B"
    assert sample_value(families, "sglang:generation_tokens", "sglang:generation_tokens_total") > 0


def test_metrics_counter_window_equals_the_truth(shared_sim_fleet):
    fleet, index = shared_sim_fleet, 2
    url = fleet.urls[index]
    before = scrape(url)
    rids = []
    for max_tokens, stream in ((200, False), (8192, False), (90, True)):
        status, raw = post(
            f"{url}/v1/chat/completions",
            {"model": "m", "messages": USER, "max_tokens": max_tokens, "stream": stream},
        )
        assert status == 200
        rids.append(sse_json(raw)[0][0]["id"] if stream else json.loads(raw)["id"])
    rids.append(generate_json(url, 120)["meta_info"]["id"])
    records = [truth_for(fleet, rid, index) for rid in rids]
    after = scrape(url)

    def delta(family: str, sample: str) -> float:
        return sample_value(after, family, sample) - sample_value(before, family, sample)

    assert delta("sglang:generation_tokens", "sglang:generation_tokens_total") == sum(
        r["completion_tokens"] for r in records
    )
    assert delta("sglang:spec_verify_calls", "sglang:spec_verify_calls_total") == sum(
        r["verify_steps"] for r in records
    )
    assert delta("sglang:prompt_tokens", "sglang:prompt_tokens_total") == sum(
        r["prompt_tokens"] for r in records
    )
    assert delta("sglang:num_requests", "sglang:num_requests_total") == len(records)
    assert delta("sglang:num_aborted_requests", "sglang:num_aborted_requests_total") == 0
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        name = f"sglang:{histogram}"
        assert delta(name, f"{name}_count") == len(records)
    assert (
        sample_value(after, "sglang:num_running_reqs") == 0
        and sample_value(after, "sglang:num_queue_reqs") == 0
    )


# ----- health ----------------------------------------------------------------------------------------------
def test_health_transitions_refused_then_503_then_200(sim_fleet):
    fleet = sim_fleet(
        profile="b200-mtp", speed=50, faults=["load_delay=1.5", "startup_delay=1.5"], wait="none"
    )
    url = fleet.urls[0]
    seen: list[int | None] = []
    early: dict = {}

    def early_request() -> None:
        early["reply"] = post_json(
            f"{url}/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 20}
        )

    sender = None
    while not seen or seen[-1] != 200:
        status = http_status(f"{url}/health", timeout=2)
        if status == 503 and sender is None:
            assert http_status(f"{url}/health_generate", timeout=5) == 503
            sender = threading.Thread(target=early_request)  # /v1 is not gated by health: it queues
            sender.start()
        seen.append(status)
        assert len(seen) < 2000, seen[-20:]
        time.sleep(0.05)
    phases = [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]
    assert phases == [None, 503, 200], phases
    assert http_status(f"{url}/health", timeout=2) == 200
    assert sender is not None
    sender.join(30)
    status, reply = early["reply"]
    assert status == 200 and reply["choices"][0]["finish_reason"] == "length"
    warmup = next(r for r in fleet.truth() if r["kind"] == "warmup")
    assert truth_for(fleet, reply["id"])["admitted"] >= warmup["finished"]  # queued until warm-up ran


def test_health_generate_runs_a_one_token_generation(sim_fleet):
    fleet = sim_fleet(profile="b200-mtp", speed=50)
    url = fleet.urls[0]
    before = sample_value(scrape(url), "sglang:num_requests", "sglang:num_requests_total")
    assert get(f"{url}/health_generate")[0] == 200
    probes = wait_for(lambda: [r for r in fleet.truth() if r["kind"] == "health"], what="health probe record")
    assert probes[0]["completion_tokens"] == 1 and probes[0]["outcome"] == "ok"
    # SGLang sends its probe with log_metrics=False: request counters do not move.
    assert sample_value(scrape(url), "sglang:num_requests", "sglang:num_requests_total") == before


def test_health_generate_on_a_full_batch_answers_from_the_running_steps(sim_fleet):
    # 4 slots, 8 long requests: the probe queues behind them, yet the steps already prove the scheduler alive.
    fleet = sim_fleet(profile="b200-mtp", speed=5.0, max_running_requests=4)
    url = fleet.urls[0]
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "max_tokens": 4096,
    }
    sender = threading.Thread(target=lambda: asyncio.run(post_many(f"{url}/v1/chat/completions", [body] * 8)))
    sender.start()
    running = "sglang:num_running_reqs"
    wait_for(lambda: sample_value(scrape(url), running, running) == 4, what="a full batch")
    assert get(f"{url}/health_generate", timeout=10)[0] == 200
    probes = wait_for(lambda: [r for r in fleet.truth() if r["kind"] == "health"], what="health probe record")
    assert probes[-1]["outcome"] == "health_answered" and probes[-1]["completion_tokens"] == 0  # never ran
    sender.join(60)


def test_get_load_counts_running_and_waiting_requests_and_model_info(sim_fleet):
    # SGLang's router polls /get_load (load balancing) and /model_info (worker metadata).
    fleet = sim_fleet(profile="b200-mtp", speed=1, max_running_requests=2)
    url = fleet.urls[0]
    info = get_json(f"{url}/model_info")
    assert info["model_path"] == "Qwen/Qwen3.6-27B" and info["is_generation"] is True
    assert get_json(f"{url}/get_model_info") == info
    body = {"text": "hello there", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}

    async def busy():
        async with aiohttp.ClientSession() as session:
            sends = [asyncio.create_task(session.post(f"{url}/generate", json=body)) for _ in range(3)]
            while True:
                async with session.get(f"{url}/get_load") as reply:
                    (rank,) = await reply.json()
                if rank["num_reqs"] == 3 and rank["num_waiting_reqs"] == 1:
                    break  # all three arrived (each is planned on arrival) and the cap of 2 admitted two
                await asyncio.sleep(0.05)
            for task in sends:
                task.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            return rank

    rank = asyncio.run(asyncio.wait_for(busy(), 30))
    assert rank["dp_rank"] == 0 and rank["num_waiting_reqs"] == 1  # a batch cap of 2: the third waits
    assert rank["num_tokens"] > 0
