"""Preflight against live (simulated) servers: every problem in one table, before any prompt is sent."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import polars as pl
import pytest
from aiohttp import web

from draftgen.client.served import same_tokenizer
from draftgen.generate import PreflightError, generate, preflight
from draftgen.generate.config import GenerateConfig
from draftgen.generate.store import RunStore
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.sim.fleet import find_free_base_port


def make(fleet_urls, tmp_path, **changes) -> GenerateConfig:
    values = {
        "servers": fleet_urls,
        "model": "Qwen/Qwen3.6-27B",
        "prompts": "synthetic",
        "out_dir": str(tmp_path / "run"),
        "max_tokens": 256,
        "limit": 200,
        "concurrency_per_server": 4,
    }
    values.update(changes)
    return build_config(GenerateConfig, values)


def test_every_problem_is_one_row_of_one_table(sim_fleet, tmp_path, monkeypatch):
    fleet = sim_fleet(servers=1, profile="instant")
    dead = f"http://127.0.0.1:{find_free_base_port(1)}"
    monkeypatch.delenv("DRAFTGEN_MISSING_KEY", raising=False)
    config = make([*fleet.urls, dead], tmp_path, model="Qwen/Other", api_key_env="DRAFTGEN_MISSING_KEY")
    with pytest.raises(PreflightError) as caught:
        asyncio.run(preflight(config))
    failed = {(c.check, c.target) for c in caught.value.checks if c.status == "fail"}
    assert ("api key", "DRAFTGEN_MISSING_KEY") in failed
    assert ("model", fleet.urls[0]) in failed
    assert ("reachable", dead) in failed
    message = str(caught.value)
    assert "'Qwen/Qwen3.6-27B'" in message  # what the server does serve
    assert "nothing was sent" in message


def test_stored_rows_with_other_parameters_fail_preflight(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="instant")
    first = make(fleet.urls, tmp_path, limit=30)
    asyncio.run(_run(first))
    changed = make(fleet.urls, tmp_path, limit=30, temperature=1.0)
    with pytest.raises(PreflightError, match=r"temperature: stored 0\.6, now 1\.0"):
        asyncio.run(preflight(changed))
    plan = asyncio.run(preflight(make(fleet.urls, tmp_path, limit=30, temperature=1.0, force=True)))
    assert any(c.status == "warn" and c.check == "out_dir" for c in plan.checks)
    assert plan.todo == 0


async def _run(config: GenerateConfig):
    plan = await preflight(config)
    return await generate(config, plan, progress=False)


def test_streaming_run_records_time_to_first_token(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=2, profile="b200-mtp", speed=100.0)
    prompts = tmp_path / "p.jsonl"
    write_synthetic(prompts, 120, seed=5)
    config = make(
        fleet.urls, tmp_path, prompts=str(prompts), stream=True, max_truncated_rate=1.0, batch_save_size=50
    )
    result = asyncio.run(_run(config))
    assert result.completed == 120
    frame = pl.read_parquet(tmp_path / "run" / "shards" / "*.parquet")
    assert frame["ttft_s"].null_count() == 0 and (frame["ttft_s"] <= frame["latency_s"]).all()
    assert frame["spec_accept_length"].null_count() == 0  # sglext arrives in its own streamed chunk
    assert frame.height == frame["id"].n_unique() == 120


def test_lock_held_by_another_run_fails_preflight(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="instant")
    config = make(fleet.urls, tmp_path)
    with RunStore.open(config), pytest.raises(PreflightError, match="another process"):
        asyncio.run(preflight(config))


def test_preflight_warns_that_a_loop_check_without_streaming_saves_no_gpu_time(tmp_path):
    from draftgen.generate.preflight import check_environment

    servers = ["http://127.0.0.1:30000"]
    said = [c for c in check_environment(make(servers, tmp_path, stream=False)) if c.check == "loop check"]
    assert [(c.status, c.target) for c in said] == [("warn", "stream: false")]
    assert "stream: true ends it live" in said[0].detail
    assert not [c for c in check_environment(make(servers, tmp_path)) if c.check == "loop check"]  # streams
    assert not [
        c for c in check_environment(make(servers, tmp_path, loop_check=False)) if c.check == "loop check"
    ]


# ----- what the config leaves to the servers, and the bad starts refused in seconds --------------------------------
def sglang_like(model: str, *, model_path: str | None = None, models_status: int = 200) -> web.Application:
    """The GETs a real SGLang 0.5.23 server answers before any chat, in its shapes: one card whose id and root are
    the served name (``--served-model-name``, else ``--model-path``), the resolved launch arguments in /server_info,
    and no /sim/info. ``models_status`` 500 stands for transformers serve, which lists nothing there."""
    path = model_path or model

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        if models_status != 200:
            return web.json_response({"error": "Internal Server Error"}, status=models_status)
        card = {"id": model, "object": "model", "owned_by": "sglang", "root": model, "max_model_len": 262144}
        return web.json_response({"object": "list", "data": [card]})

    async def info(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": path,
                "tokenizer_path": path,
                "served_model_name": model,
                "max_running_requests": 64,
                "speculative_algorithm": "EAGLE",
                "internal_states": [{"effective_max_running_requests_per_dp": 64}],
                "version": "0.5.23",
            }
        )

    app = web.Application()
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/health_generate", health),
            web.get("/v1/models", models),
            web.get("/server_info", info),
        ]
    )
    return app


def _refused(apps: list[web.Application], tmp_path, **changes) -> tuple[PreflightError, float]:
    """Preflight against ``apps`` (each on a free port): the error it raised, and how long it took."""

    async def go() -> tuple[PreflightError, float]:
        runners, urls = [], []
        for app in apps:
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
        started = time.perf_counter()
        try:
            with pytest.raises(PreflightError) as caught:
                await preflight(make(urls, tmp_path, **changes))
            return caught.value, time.perf_counter() - started
        finally:
            for runner in runners:
                await runner.cleanup()

    return asyncio.run(go())


def test_model_left_empty_is_refused_naming_each_servers_list_when_they_disagree(tmp_path):
    apps = [sglang_like("/dev/shm/Qwen3.6-27B"), sglang_like("qwen")]  # one launched with --served-model-name
    error, took = _refused(apps, tmp_path, model="", tokenizer=str(tmp_path))
    (row,) = [c for c in error.checks if c.status == "fail"]
    assert (
        row.check == "model" and "lists '/dev/shm/Qwen3.6-27B'" in row.detail and "lists 'qwen'" in row.detail
    )
    assert "-p model NAME" in row.detail  # the fix
    assert took < 10 and not (tmp_path / "run" / "shards").exists()  # seconds; nothing sent, nothing stored


def test_model_left_empty_is_refused_when_a_server_lists_none(tmp_path):
    error, _ = _refused([sglang_like("m", models_status=500)], tmp_path, model="", tokenizer=str(tmp_path))
    (row,) = [c for c in error.checks if c.status == "fail"]
    assert row.check == "model" and "lists none (GET /v1/models answered 500)" in row.detail
    assert "set model to the name to use (-p model NAME)" in row.detail


def test_real_servers_without_a_tokenizer_are_refused_naming_the_fix(tmp_path):
    """The trainer's cap needs a tokenizer: real engines whose model folder is not on this machine, and none given,
    are refused before anything is sent (a run made without the cap resumes without it)."""
    missing = str(tmp_path / "elsewhere" / "Qwen3.6-27B")
    error, took = _refused([sglang_like(missing)] * 2, tmp_path, model="")
    failed = [c for c in error.checks if c.status == "fail"]
    assert [(c.check, c.target) for c in failed] == [("tokenizer", "(none)")]
    assert f"the servers loaded {missing}, not a folder on this machine" in failed[0].detail
    assert (
        "-p tokenizer /path/to/model-folder" in failed[0].detail
        and "-p train_max_length 0" in failed[0].detail
    )
    assert any(c.check == "model" and c.status == "ok" and missing in c.detail for c in error.checks)
    assert took < 10
    # without the cap (train_max_length 0) nothing needs the tokenizer: the same servers get past this row
    error, _ = _refused([sglang_like(missing)], tmp_path, model="", train_max_length=0)
    assert not [c for c in error.checks if c.check == "tokenizer"]


def test_model_folders_with_the_same_tokenizer_files_are_one_tokenizer_and_others_are_refused(
    tokenizer_dir, tmp_path
):
    """Servers that loaded different folders on this machine (copies of one model; models built on one tokenizer,
    as the SGLang tier's designed and random ones) count every prompt alike: the first folder is taken. Folders
    whose tokenizer files differ are ambiguous: refused, naming them."""
    first, second = (shutil.copytree(tokenizer_dir, tmp_path / name) for name in ("first", "second"))
    (second / "config.json").write_text('{"note": "other weights"}\n')  # not a tokenizer file: may differ

    def apps() -> list[web.Application]:
        return [sglang_like("m", model_path=str(first)), sglang_like("m", model_path=str(second))]

    error, _ = _refused(apps(), tmp_path, model="")  # refused later: these servers answer no chat
    row = next(c for c in error.checks if c.check == "tokenizer")  # filled in (the trainer's fit follows)
    assert (row.status, row.target) == ("ok", str(first)), row
    assert f"the servers loaded {first}, {second}, whose tokenizer files are the same" in row.detail

    config = json.loads((second / "tokenizer_config.json").read_text())
    config["chat_template"] += " "  # one byte of the template: prompts could count differently
    (second / "tokenizer_config.json").write_text(json.dumps(config))
    error, took = _refused(apps(), tmp_path, model="")
    failed = [c for c in error.checks if c.status == "fail"]
    assert [(c.check, c.target) for c in failed] == [("tokenizer", "(none)")]
    assert (
        f"the servers loaded {first}, {second}: more than one, and their tokenizer files differ"
        in failed[0].detail
    )
    assert "-p tokenizer /path/to/model-folder" in failed[0].detail and took < 10


def test_folders_without_a_tokenizer_are_never_the_same_tokenizer(tokenizer_dir, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert not same_tokenizer([str(first), str(second)])  # nothing to load in either
    assert same_tokenizer([str(tokenizer_dir), str(shutil.copytree(tokenizer_dir, tmp_path / "copy"))])


def test_the_servers_model_folder_is_taken_as_the_tokenizer_and_the_model_name_from_their_list(
    sim_fleet, tokenizer_dir, tmp_path
):
    """Servers launched on a local model folder (``draftgen serve --model DIR`` starts the simulator with that
    --model-path) name it in /server_info: generate takes it as the tokenizer, and the one name they list as
    the model; the run made with both is recorded with both."""
    fleet = sim_fleet(
        servers=2,
        profile="instant",
        model=str(tokenizer_dir),
        server_args=("--model-path", str(tokenizer_dir)),
        tokenizer=tokenizer_dir,
    )
    config = make(fleet.urls, tmp_path, model="", limit=6, max_tokens=64)
    assert config.model is None and config.tokenizer == ""
    plan = asyncio.run(preflight(config))
    try:
        assert plan.config.model == str(tokenizer_dir) and plan.config.tokenizer == str(tokenizer_dir)
        assert plan.config.length_cap == config.train_max_length
        said = [(c.check, c.status, c.detail) for c in plan.checks if c.check in ("tokenizer", "model")]
        assert any(
            check == "tokenizer" and status == "ok" and "the model folder the servers loaded" in detail
            for check, status, detail in said
        ), said
        assert (
            "model",
            "ok",
            f'"" → {str(tokenizer_dir)!r}: the one model every server lists in GET /v1/models',
        ) in said
    finally:
        plan.release()


def test_a_batch_cap_below_the_concurrency_is_refused_naming_the_cap_and_both_fixes(sim_fleet, tmp_path):
    fleet = sim_fleet(servers=1, profile="b200-mtp", speed=50.0)  # SGLang's own cap with MTP: 48
    started = time.perf_counter()
    with pytest.raises(PreflightError) as caught:
        asyncio.run(preflight(make(fleet.urls, tmp_path, concurrency_per_server=64, canary=False)))
    assert time.perf_counter() - started < 30
    (row,) = [c for c in caught.value.checks if c.status == "fail"]
    assert (row.check, row.target) == ("batch cap", fleet.urls[0])
    assert "runs 48 at once, fewer than concurrency_per_server 64" in row.detail
    assert "--max-running-requests 64" in row.detail and "-p concurrency_per_server 48" in row.detail
    plan = asyncio.run(preflight(make(fleet.urls, tmp_path, concurrency_per_server=48, canary=False)))
    plan.release()
    assert [c.status for c in plan.checks if c.check == "batch cap"] == ["ok"]
