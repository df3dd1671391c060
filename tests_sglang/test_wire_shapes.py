"""Keep the simulator honest: one set of requests to ``draftgen sim`` and to real SGLang 0.5.23, the same shapes.

The set (``wire_shapes.CASES``): streaming and not, thinking on and off, truncation, token ids (body fields and
headers), ``return_spec_tokens_details`` on a speculative server, top-k logprobs, an error body, ``/generate`` (plain, streamed,
speculative), and ``/metrics`` names. Each real case goes to the tier's shared servers (``plain``: the designed
model; ``spec``: NGRAM); the simulator runs two servers of its own on the same tokenizer (b200-mtp's NEXTN, and
the instant profile without speculation). Shapes — keys, nesting, JSON types, stream event order — must agree except where
docs/simulator.md's "Known differences from real SGLang" table lists the difference with its reason.

Also here: SGLang's own token ids land in generate's shards, every turn, exactly as the server reported them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from conftest import REPO
from serve_runs import free_ports, http_status
from wire_shapes import CASES, differences, known_differences, listed, metric_types, send

DOC = REPO / "docs" / "simulator.md"
SUPPORT = Path(__file__).resolve().parent / "support"


@pytest.fixture(scope="module")
def sims(draftgen: str, models, tmp_path_factory: pytest.TempPathFactory):
    """Two ``draftgen sim`` servers speaking the tier's tokenizer: "spec" (b200-mtp, NEXTN) and "plain"
    (profile instant: no speculation, short answers that finish on their own, as the designed model's do)."""
    root = tmp_path_factory.mktemp("sims")
    procs, urls = [], {}
    try:
        for kind, extra in (("spec", ()), ("plain", ("--speculative-algorithm", "none"))):
            port = free_ports()
            command = [draftgen, "sim", "--servers", "1", "--base-port", str(port), "--speed", "200"]
            command += ["--tokenizer", str(models.designed), "--work-dir", str(root / kind), *extra]
            command += [
                "--enable-cache-report"
            ]  # as the real servers have it: draftgen serve starts them with it
            log = (root / f"{kind}.out").open("wb")
            procs.append(
                subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
            urls[kind] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        for kind, url in urls.items():
            while http_status(url + "/health") != 200:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"draftgen sim ({kind}) never answered /health 200: {(root / f'{kind}.out').read_text()}"
                    )
                time.sleep(0.3)
        yield urls
    finally:
        for proc in procs:
            with_signal(proc)


def with_signal(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def real_urls(fleet) -> dict[str, str]:
    return {"plain": fleet.plain.url, "spec": fleet.ngram.url}


def test_the_simulator_answers_every_case_in_real_sglangs_shapes(fleet, sims):
    table = known_differences(DOC)
    assert table, "docs/simulator.md lost its 'Known differences from real SGLang' table"
    real_at = real_urls(fleet)
    unlisted: list[str] = []
    used: set[tuple[str, str]] = set()
    compared = 0
    for case in CASES:
        real = send(real_at[case.server], case, "default")
        sim = send(sims[case.server], case, "default")
        assert real["status"] == sim["status"], (case.name, real, sim)
        for difference in differences(real, sim):
            entry = listed(case.name, difference, table)
            if entry is None:
                unlisted.append(f"{case.name}: {difference}")
            else:
                used.add(entry)
        compared += 1
    assert compared == len(CASES)
    stale = [f"{case} / {path}" for case, path in table if case != "metrics" and (case, path) not in used]
    assert not stale, f"docs/simulator.md lists differences that no longer occur (remove them): {stale}"
    assert not unlisted, (
        "the simulator's responses differ from real SGLang 0.5.23's where docs/simulator.md lists no reason:\n"
        + "\n".join(unlisted)
    )


@pytest.mark.parametrize("kind", ["plain", "spec"])
def test_every_metric_the_simulator_exposes_exists_in_real_sglang_with_its_type(fleet, sims, kind):
    table = known_differences(DOC)
    real, sim = metric_types(real_urls(fleet)[kind]), metric_types(sims[kind])
    assert "sglang:generation_tokens_total" in real or "sglang:generation_tokens" in real
    unlisted = [
        f"{name}: real {real.get(name, 'absent')}, sim {kind_}"
        for name, kind_ in sorted(sim.items())
        if real.get(name) != kind_ and listed("metrics", f"{name}: real ", table) is None
    ]
    assert not unlisted, "metrics the simulator exposes unlike real SGLang:\n" + "\n".join(unlisted)


def test_the_servers_own_token_ids_land_in_the_shards(draftgen, fleet, models, tmp_path):
    """generate against the real server: every turn's output ids and (expanded) prompt ids are SGLang's, which are
    the tokenizer's own rendering and the designed model's answer."""
    from transformers import AutoTokenizer

    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {
            "id": "one",
            "messages": [{"role": "user", "content": "Tell me something about the weather today."}],
        },
        {
            "id": "two",
            "messages": [
                {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "(the source's own answer, replaced by the target's)"},
                {"role": "user", "content": "And the weather?"},
            ],
        },
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    python = Path(draftgen).parent / "python"
    done = subprocess.run(
        [str(python), str(SUPPORT / "generate_ids.py"), fleet.plain.url, str(prompts), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "token ids from the server (sglext)" in report["engine_row"], report["engine_row"]
    assert [(s["url"], s["engine"], s["version"], s["token_ids"]) for s in report["servers"]] == [
        (fleet.plain.url, "sglang", "0.5.23", "sglext")
    ]
    tokenizer = AutoTokenizer.from_pretrained(models.designed)
    by_id = {row["id"]: row for row in report["rows"]}
    assert set(by_id) == {"one", "two"}
    turns = 0
    for row in by_id.values():
        for turn, (prompt, output) in enumerate(zip(row["prompts"], row["outputs"], strict=True)):
            sent = list(row["messages"][: row["turn_after"][turn] + 1])
            if turn:  # the source's assistant turn is replaced by the target's own earlier answer
                sent = [sent[0], {"role": "assistant", "content": row["content"][0] or ""}, *sent[2:]]
            rendered = tokenizer.apply_chat_template(
                sent, tokenize=True, add_generation_prompt=True, enable_thinking=True, return_dict=False
            )
            assert prompt == list(rendered), (row["id"], turn)
            assert len(prompt) == row["prompt_tokens"][turn] and len(output) == row["completion_tokens"][turn]
            assert output[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # SGLang sends the stop token
            text = tokenizer.decode(output, skip_special_tokens=True)
            assert text == row["reasoning"][turn] + "</think>" + row["content"][turn], (row["id"], turn)
            turns += 1
    assert turns == 3
    requests.get(fleet.plain.url + "/health", timeout=10).raise_for_status()  # the shared server still serves
