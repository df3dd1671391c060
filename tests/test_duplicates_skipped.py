"""Duplicate conversations skipped by generate: never sent, never lost, kept apart from malformed rows.

A prompt file where each of K system-prompted conversations (the only system prompts in the file, so the
simulator's ground truth tells their requests apart: its category "system") has a copy under another id. Preflight
passes at 5% duplicates with max_rejected_rate 1% and shows the audit; a run SIGKILLed mid-way and resumed stores
every other id exactly once, lists every copy in rejected.parquet as "duplicate of ID", and the simulator saw each
original sent once in the first session and only the unstored ones again in the resume, never a copy.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import polars as pl
import pytest
from generate_helpers import generate_here, sigkill_client_after_shards
from test_generate_notebook import base_params

from draftgen.generate import PreflightError, preflight
from draftgen.generate.config import GenerateConfig
from draftgen.generate.store import read_done_ids
from draftgen.params import build_config
from draftgen.prompts.synthetic import LONG_CHAT, synthetic_rows
from draftgen.validate.coverage import check_coverage
from draftgen.validate.folders import open_generations

K = 20  # conversations that have a copy


def _prompt_file(path: Path, malformed: int = 0) -> tuple[Path, dict[str, str]]:
    """400 synthetic rows without system prompts, K system-prompted originals among the first 100 rows and a copy
    of each further on (another id, other fields, half in ShareGPT form); returns {copy id: original id}."""
    # no system prompt, and none of the generator's long chats (some have one, and it plants copies of its own)
    base = [row for row in synthetic_rows(480, seed=31) if row["category"] not in ("system", LONG_CHAT)][:400]
    originals = [
        {
            "id": f"orig-{i}",
            "messages": [
                {"role": "system", "content": "You answer in one paragraph."},
                {"role": "user", "content": f"Describe harbour number {i} and its {i * 7 % 13} cranes."},
            ],
        }
        for i in range(K)
    ]
    copies = {}
    rows: list = []
    for index, row in enumerate(base):
        rows.append(row)
        if index < 2 * K and index % 2 == 0:
            rows.append(originals[index // 2])
    for i, original in enumerate(originals):
        copy = {"id": f"copy-{i}", "source": "mirror", "timestamp": 1_700_000_000 + i}
        if i % 2:
            copy["messages"] = original["messages"]
        else:
            speaker = {"system": "system", "user": "human"}
            copy["conversations"] = [
                *({"from": speaker[m["role"]], "value": m["content"]} for m in original["messages"]),
                {"from": "gpt", "value": "a source answer, dropped by the reader"},
            ]
        rows.insert(150 + 10 * i, copy)
        copies[copy["id"]] = original["id"]
    rows[300:300] = ["{broken"] * malformed
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path, copies


def test_preflight_keeps_duplicates_apart_from_malformed_rows_and_shows_the_audit(instant_fleet, tmp_path):
    fleet = instant_fleet()
    prompts, copies = _prompt_file(tmp_path / "p.jsonl", malformed=2)
    values = {
        "servers": fleet.urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": str(prompts),
        "out_dir": str(tmp_path / "run"),
        "max_tokens": 64,
        "max_rejected_rate": 0.01,  # 20 duplicates are 4.5% of the rows: not malformed, not counted
    }
    plan = asyncio.run(preflight(build_config(GenerateConfig, values)))
    try:
        rows = {c.check: c for c in plan.checks}
        assert rows["malformed rows"].status == "warn" and rows["malformed rows"].detail.startswith(
            "2 malformed"
        )
        assert rows["audit: duplicates"].status == "info"
        assert rows["audit: duplicates"].detail.startswith(f"{K} exact duplicate conversations")
        assert plan.scan.duplicates == K and plan.scan.rejected == K + 2 and plan.scan.valid == 400 + K
        rejected = pl.read_parquet(tmp_path / "run" / "rejected.parquet")
        reasons = dict(zip(rejected["id"], rejected["reason"], strict=False))
        assert all(reasons[copy].startswith(f"duplicate of {original} ") for copy, original in copies.items())
    finally:
        plan.release()
    # more malformed rows than max_rejected_rate allows: refused for those, the duplicates still apart
    prompts, _ = _prompt_file(tmp_path / "bad.jsonl", malformed=10)
    values.update(prompts=str(prompts), out_dir=str(tmp_path / "bad"))
    with pytest.raises(PreflightError) as caught:
        asyncio.run(preflight(build_config(GenerateConfig, values)))
    failed = [c for c in caught.value.checks if c.status == "fail"]
    assert [c.check for c in failed] == ["malformed rows"] and failed[0].detail.startswith("10 malformed")


def _records_per_server(fleet) -> list[list[dict]]:
    return [fleet.truth(i) for i in range(fleet.servers)]


def _settled(fleet, timeout: float = 30.0) -> list[list[dict]]:
    """The ground truth once the servers stop adding to it (requests in flight at the kill end or abort)."""
    deadline = time.monotonic() + timeout
    last = [len(r) for r in _records_per_server(fleet)]
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = [len(r) for r in _records_per_server(fleet)]
        if now == last:
            break
        last = now
    return _records_per_server(fleet)


def _system_chats(records: list[dict]) -> int:
    return sum(1 for r in records if r.get("kind") == "chat" and r.get("category") == "system")


def test_skipped_duplicates_are_never_sent_and_never_lost_through_a_sigkill_and_resume(sim_fleet, tmp_path):
    prompts, copies = _prompt_file(tmp_path / "p.jsonl")
    fleet = sim_fleet(servers=3, profile="b200-mtp", speed=20.0)
    params = base_params(fleet, prompts, max_truncated_rate=1.0, hedge_slow_ratio=0.0)
    run_dir = tmp_path / "run"
    sigkill_client_after_shards(
        run_dir, params, 2
    )  # 200 rows stored: every row of the first 100, originals sent
    first = _settled(fleet)
    stored_before = set(read_done_ids(run_dir).to_list())
    assert 0 < len(stored_before) < 400
    assert sum(_system_chats(r) for r in first) == K  # each original sent once; no copy sent

    assert generate_here(run_dir, params).result.status == "complete"  # the resume
    second = [
        records[len(before) :] for records, before in zip(_records_per_server(fleet), first, strict=True)
    ]
    unstored = {f"orig-{i}" for i in range(K)} - stored_before
    assert sum(_system_chats(r) for r in second) == len(unstored)  # only what was not stored; still no copy

    shards = pl.read_parquet(sorted((run_dir / "shards").glob("part-*.parquet")))
    ids = shards["id"].to_list()
    assert len(ids) == len(set(ids)) == 400 + K  # every other id exactly once
    assert not set(copies) & set(ids)
    rejected = pl.read_parquet(run_dir / "rejected.parquet")
    reasons = dict(zip(rejected["id"], rejected["reason"], strict=True))
    assert set(reasons) == set(copies)  # every duplicate recorded, nothing else rejected
    assert all(reasons[copy].startswith(f"duplicate of {original} ") for copy, original in copies.items())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["counts"]["done"] == 400 + K
    assert manifest["fingerprint_fields"]["keep_duplicates"] is False
    coverage = check_coverage(open_generations([run_dir]))  # validate expects what the run selected
    assert coverage.checked and coverage.expected == 400 + K
    assert coverage.missing == 0 and coverage.unexpected == 0
