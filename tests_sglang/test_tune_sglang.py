"""tune.ipynb over real SGLang candidates, then its winner relaunched with ``draftgen serve --settings``.

Four candidates of the random model, each started by tune's launcher (serve's command line) through the tier's
``sglang-python`` wrapper with the CPU arguments as ``extra_args``, two GPU groups at a time: speculation off, NGRAM
with 2 and with 4 draft tokens, and STANDALONE 3/1/4 with the tiny draft model. Each is measured with the
benchmark's code; the winner goes to settings.yaml, and ``draftgen serve --settings`` starts a server with exactly
those flags that answers a chat. The seeds' NEXTN baseline is off: the tiny model has no MTP heads. After the race,
the verdict (issue 21): STANDALONE with the draft model as the trained drafter, judged against speculation off
(``verdict_baseline: []``) at 1 and 2 in flight, each started once more on a GPU group.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml
from sitecustomize import FORKED_NOTE
from tier_runs import TUNE_GROUPS, VERDICT_LEVELS, TuneRun

LABELS = [
    "MTP off, 4 running",
    "STANDALONE 3/1/4, 4 running",
    "NGRAM 2 drafts, 4 running",
    "NGRAM 4 drafts, 4 running",
]
# What each candidate's SGLang must have resolved (its log's server_args), by the slug of its job folder.
RESOLVED = {
    "nomtp": ("'speculative_algorithm': None,",),
    "standalone3-1-4": (
        "'speculative_algorithm': 'STANDALONE',",
        "'speculative_num_steps': 3,",
        "'speculative_eagle_topk': 1,",
        "'speculative_num_draft_tokens': 4,",
    ),
    "ngram2": ("'speculative_algorithm': 'NGRAM',", "'speculative_num_draft_tokens': 2,"),
    "ngram4": ("'speculative_algorithm': 'NGRAM',", "'speculative_num_draft_tokens': 4,"),
}


def test_tune_measured_every_real_candidate_and_chose_the_fastest(tune_run):
    table = pl.read_parquet(tune_run.run_dir / "candidates.parquet")
    assert sorted(table["candidate"].to_list()) == sorted(LABELS)
    assert table["failure"].is_null().all(), table.select("candidate", "failure", "log_tail")
    assert (table["tok_s_per_gpu"] > 0).all() and (table["steady_requests"] > 0).all()
    best = table.sort("tok_s_per_gpu", descending=True)["candidate"][0]
    [chosen] = table.filter(pl.col("status") == "chosen")["candidate"].to_list()
    assert chosen == best
    accept = dict(zip(table["candidate"], table["accept_length"], strict=True))
    assert accept["MTP off, 4 running"] == pytest.approx(1.0)
    assert accept["STANDALONE 3/1/4, 4 running"] > 1.0  # the draft model agrees with the target often
    assert all(1.0 <= accept[label] <= 4.0 for label in LABELS)
    settings = yaml.safe_load((tune_run.run_dir / "settings.yaml").read_text())
    assert settings["tuned"]["chosen_label"] == chosen
    jobs = pl.read_parquet(tune_run.run_dir / "jobs.parquet")
    assert jobs.height == len(LABELS) and jobs["ok"].all()
    assert sorted(set(jobs["gpu_group"].to_list())) == list(range(TUNE_GROUPS))  # two candidates at a time


def test_each_candidate_ran_its_own_flags_through_the_wrapper(tune_run, models):
    """What SGLang itself resolved, from each job's server log: the candidate's speculative settings, the CPU
    arguments, and intel_amx kept by the wrapper's sitecustomize."""
    logs = {log.parent.name: log for log in (tune_run.run_dir / "servers").glob("r0-*/server-*.log")}
    assert len(logs) == len(LABELS), sorted(logs)
    seen = set()
    for folder, log in logs.items():
        text = log.read_text(errors="replace")
        assert "'attention_backend': 'intel_amx'" in text and "'device': 'cpu'" in text, folder
        assert "'max_running_requests': 4," in text, folder
        assert FORKED_NOTE in text, folder  # the wrapper's default (support/sitecustomize.py)
        [slug] = [slug for slug in RESOLVED if f"-{slug}-mrr4-" in folder]
        missing = [flag for flag in RESOLVED[slug] if flag not in text]
        assert not missing, (folder, missing)
        seen.add(slug)
        if slug.startswith("standalone"):
            assert f"'speculative_draft_model_path': '{models.draft}'" in text
    assert seen == set(RESOLVED)


def test_serve_relaunches_the_winner_from_tunes_settings_file(tune_run: TuneRun):
    relaunch = tune_run.relaunch
    algorithm = relaunch.settings["speculative_algorithm"]
    assert f"'speculative_algorithm': {repr(algorithm) if algorithm else None}," in relaunch.server_log
    assert f"'max_running_requests': {relaunch.settings['max_running_requests']}," in relaunch.server_log
    assert relaunch.server_info["speculative_algorithm"] == algorithm
    assert relaunch.reply["usage"]["completion_tokens"] == 8
    assert ("sglext" in relaunch.reply) == (algorithm is not None), relaunch.reply
    label = yaml.safe_load((tune_run.run_dir / "settings.yaml").read_text())["tuned"]["chosen_label"]
    assert label.split(",")[0] in relaunch.serve_output  # serve's header names the settings it launches
    assert "1 of 1 servers ready" in relaunch.serve_output
    assert relaunch.left == []
    # the one server of the tier started SGLang's own way: spawned children, stopped with nothing left
    assert FORKED_NOTE not in relaunch.server_log


def test_the_verdict_judged_the_real_standalone_drafter_against_no_speculation(tune_run, models):
    """The verdict's path on real SGLang: both candidates started (their own server folders, r99-...), measured at
    every level, days and dollars priced. Which one is faster on a loaded CPU is not the test's business: the
    contract is that one figure (tok/s per GPU at production, with its interval) ranks and prices, and that a
    winner is named only when its interval lies above the other's, a tie with both intervals otherwise."""
    table = pl.read_parquet(tune_run.run_dir / "verdict.parquet")
    assert table["failure"].is_null().all(), table.select("candidate", "concurrency", "failure")
    assert sorted(table["concurrency"].unique().to_list()) == list(VERDICT_LEVELS)
    roles = dict(zip(table["candidate"], table["role"], strict=True))
    [baseline] = [c for c, role in roles.items() if role == "baseline"]
    [drafter] = [c for c, role in roles.items() if role == "drafter"]
    assert baseline.startswith("MTP off") and drafter.startswith("STANDALONE 3/1/4")
    assert (table["steady_requests"] > 0).all() and (table["tok_s_per_gpu"] > 0).all()
    accept = {(r["candidate"], r["concurrency"]): r["accept_length"] for r in table.iter_rows(named=True)}
    for level in VERDICT_LEVELS:
        assert accept[(baseline, level)] == pytest.approx(1.0)
        assert accept[(drafter, level)] > 1.0  # the draft model agrees with the target often
    info = json.loads((tune_run.run_dir / "verdict.json").read_text())
    production = max(VERDICT_LEVELS)
    assert info["production_concurrency"] == production and info["baseline"] == baseline
    assert "against no speculation on 10,000 prompts" in info["headline"], info["headline"]
    at_production = {
        r["candidate"]: r for r in table.filter(pl.col("concurrency") == production).iter_rows(named=True)
    }
    assert all(
        r["tok_s_per_gpu_low"] <= r["tok_s_per_gpu"] <= r["tok_s_per_gpu_high"]
        for r in at_production.values()
    )
    fast, slow = sorted(at_production.values(), key=lambda r: r["tok_s_per_gpu"], reverse=True)
    apart = fast["tok_s_per_gpu_low"] > slow["tok_s_per_gpu_high"]
    if apart:
        assert info["winner"] == fast["candidate"] and info["tie"] == [], info["headline"]
    else:
        assert info["winner"] is None, info["headline"]
        assert [t["candidate"] for t in info["tie"]] == [fast["candidate"], slow["candidate"]]
        assert "a tie" in info["headline"]
        for row in (fast, slow):
            interval = f"{row['tok_s_per_gpu_low']:,.0f}-{row['tok_s_per_gpu_high']:,.0f}"
            assert interval in info["headline"], (interval, info["headline"])
    # the money is the ranking's figure priced: the same tok/s, and the faster one the cheaper
    money = {m["candidate"]: m for m in info["money"]}
    assert set(money) == {baseline, drafter}
    assert all(m["days"] > 0 and m["cost_usd"] > 0 for m in money.values())
    for label, row in at_production.items():
        assert money[label]["tok_s_per_gpu"] == pytest.approx(row["tok_s_per_gpu"], abs=0.05)
    assert money[fast["candidate"]]["days"] <= money[slow["candidate"]]["days"], info["money"]
    logs = {
        log.parent.name: log.read_text(errors="replace")
        for log in (tune_run.run_dir / "servers").glob("r99-*/*.log")
    }
    assert len(logs) == 2, sorted(logs)
    resolved = sorted(
        "'speculative_algorithm': 'STANDALONE'," in text
        and f"'speculative_draft_model_path': '{models.draft}'" in text
        for text in logs.values()
    )
    assert resolved == [False, True]  # one server ran the drafter, the other no speculation
    assert all(f"'max_running_requests': {production}," in text for text in logs.values())
