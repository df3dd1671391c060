"""The simulator's b200-mtp profile against a real hybrid MTP server: what draftgen reads from both must agree.

b200-mtp simulates Qwen3.6-27B with NEXTN 3/1/4 on a B200; the real counterpart here is the tier's ``qwen3_5``
hybrid served with NEXTN 3/1/4 (test_mtp_server.py). Per request ``sglext.spec_tokens_details`` (keys, types, the
histogram's length), ``/server_info`` (every field the simulator reports exists, with its type; the speculative
settings SGLang resolved; the hybrid cache fields), ``/model_info``'s family and every metric the simulator exposes
(with its type). Values that differ because one is a GPU node and the other this CPU are asserted as such.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from chat import chat, chat_stream
from mtp_runs import MTP_SERVED_MODEL
from serve_runs import free_ports, http_status
from wire_shapes import known_differences, listed, metric_types

DOC = Path(__file__).resolve().parents[1] / "docs" / "simulator.md"


@pytest.fixture(scope="module")
def sim_url(draftgen, models, tmp_path_factory):
    """``draftgen sim`` with its default profile (b200-mtp) speaking the hybrid's tokenizer."""
    root = tmp_path_factory.mktemp("sim-b200-mtp")
    port = free_ports()
    command = [draftgen, "sim", "--servers", "1", "--base-port", str(port), "--speed", "200"]
    command += ["--tokenizer", str(models.hybrid), "--work-dir", str(root)]
    with (root / "sim.out").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while http_status(url + "/health") != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"draftgen sim never answered /health 200: {(root / 'sim.out').read_text()}")
            time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kind(value: object) -> str:
    return (
        "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__
    )


def test_spec_details_have_the_same_fields_and_shape(mtp_server, sim_url):
    real = chat(
        mtp_server.url,
        MTP_SERVED_MODEL,
        "Hello?",
        thinking=True,
        max_tokens=32,
        return_spec_tokens_details=True,
    )["sglext"]["spec_tokens_details"]
    sim = chat(sim_url, "m", "Hello?", thinking=True, max_tokens=32, return_spec_tokens_details=True)[
        "sglext"
    ]["spec_tokens_details"]
    assert {k: kind(v) for k, v in sim.items()} == {k: kind(v) for k, v in real.items()}
    assert len(sim["spec_correct_drafts_histogram"]) == len(real["spec_correct_drafts_histogram"]) == 3 + 1


def test_server_info_fields_and_the_resolved_speculation_agree(mtp_server, sim_url):
    real = requests.get(f"{mtp_server.url}/server_info", timeout=30).json()
    sim = requests.get(f"{sim_url}/server_info", timeout=30).json()
    unlike = {
        key: (kind(real.get(key, "absent")), kind(value))
        for key, value in sim.items()
        if key != "internal_states"
        and value is not None
        and real.get(key) is not None
        and kind(real[key]) != kind(value)
    }
    assert not (set(sim) - set(real)) and not unlike, (set(sim) - set(real), unlike)
    assert not set(sim["internal_states"][0]) - set(real["internal_states"][0])
    for key in (
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "uses_mamba_radix_cache",
        "reasoning_parser",
        "tool_call_parser",  # serve's for the qwen3_5 family, and draftgen sim's default: qwen3_coder
    ):
        assert sim[key] == real[key], key
    # the GPU node resolves extra_buffer with the overlap schedule on; this CPU only no_buffer without it
    assert (sim["mamba_radix_cache_strategy"], sim["disable_overlap_schedule"]) == ("extra_buffer", False)
    assert (real["mamba_radix_cache_strategy"], real["disable_overlap_schedule"]) == ("no_buffer", True)
    real_model = requests.get(f"{mtp_server.url}/model_info", timeout=30).json()
    sim_model = requests.get(f"{sim_url}/model_info", timeout=30).json()
    assert real_model["model_type"].startswith("qwen3_5") and sim_model["model_type"].startswith("qwen3_5")
    assert all(a.startswith("Qwen3_5For") for a in real_model["architectures"] + sim_model["architectures"])


def test_the_model_list_names_the_served_model_as_sglang_does(mtp_server, sim_url, models):
    """One card whose id and root are the served name (SGLang's --served-model-name, else its --model-path), the
    folder in /server_info's model_path: what a notebook's ``model: ""`` resolves from (draftgen.client.served).
    The real server was started with --served-model-name, the simulator without one (its path is its name)."""
    for url, name, path in (
        (mtp_server.url, MTP_SERVED_MODEL, str(models.hybrid)),
        (sim_url, "Qwen/Qwen3.6-27B", "Qwen/Qwen3.6-27B"),
    ):
        [card] = requests.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert (card["id"], card["root"], card["object"], card["owned_by"]) == (name, name, "model", "sglang")
        info = requests.get(f"{url}/server_info", timeout=30).json()
        assert (info["served_model_name"], info["model_path"], info["tokenizer_path"]) == (
            name,
            path,
            path,
        ), url


def test_every_metric_the_simulator_exposes_exists_on_the_hybrid_with_its_type(mtp_server, sim_url):
    for url, model in ((mtp_server.url, MTP_SERVED_MODEL), (sim_url, "m")):  # every series observed once
        chat(url, model, "Count me.", thinking=False, max_tokens=8, return_spec_tokens_details=True)
        chat_stream(url, model, "Stream me.", thinking=False, max_tokens=8)
    real, sim = metric_types(mtp_server.url), metric_types(sim_url)
    table = known_differences(DOC)
    unlisted = [
        f"{name}: real {real.get(name, 'absent')}, sim {type_}"
        for name, type_ in sorted(sim.items())
        if real.get(name) != type_ and listed("metrics", f"{name}: real ", table) is None
    ]
    assert not unlisted, "metrics the simulator exposes unlike the real hybrid:\n" + "\n".join(unlisted)
    assert {"sglang:spec_verify_calls_total", "sglang:generation_tokens_total"} <= set(real) & set(sim)
