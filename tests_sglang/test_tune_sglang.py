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
    every level, the winner at the production concurrency the faster one measured, days and dollars priced."""
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
    at_production = table.filter(pl.col("concurrency") == production).sort("tok_s_per_gpu", descending=True)
    assert info["winner"] == at_production["candidate"][0]
    assert "against no speculation on 10,000 prompts" in info["headline"], info["headline"]
    assert {m["candidate"] for m in info["money"]} == {baseline, drafter}
    assert all(m["days"] > 0 and m["cost_usd"] > 0 for m in info["money"])
    # priced at the production concurrency, the winner there is the cheapest (the CPU's batch of 2 is faster per
    # request than its batch of 1: the estimate's rate is then flat at the production level, not at their mean)
    assert min(info["money"], key=lambda m: m["days"])["candidate"] == info["winner"], info["money"]
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
