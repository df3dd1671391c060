"""``draftgen serve`` supervising real SGLang: a crash at start, a SIGKILLed server brought back, a clean stop.

The restart and stop tests change the shared servers, so they are marked ``stops_servers`` and run after every
other test of the session (conftest.py orders them), restart first; the three stops happen at once. The server
the restart test watches come back was SIGKILLed mid-run by ``plain_killed_mid_run`` (a generate run that fails
over meanwhile).
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import pytest
from chat import chat
from serve_runs import http_status
from tiny_qwen3 import DESIGNED_ANSWER


def test_a_server_that_crashes_at_start_is_reported_with_its_log_tail(fleet):
    run = fleet.crash
    code = run.process.wait(timeout=300)
    output = run.output()
    assert code == 1, output  # every server failed: serve gives up
    assert "exited with code 2" in output and "stages seen: starting" in output
    assert f"last 20 lines of {run.server_log}" in output
    # SGLang's own argparse message, quoted from the server's log in serve's report
    assert "| " in output and "invalid choice: 'amx'" in output
    assert "not restarted (start with --restart" in output
    assert "every server has failed" in output
    assert not run.launchers()


@pytest.mark.stops_servers
def test_restart_brings_a_sigkilled_server_back(fleet, models, plain_killed_mid_run):
    """plain's SGLang was SIGKILLed in the middle of a generate run (conftest.py, plain_killed_mid_run)."""
    run = fleet.plain
    restarting = "restarting in 1s (restart 1 of at most 2 in a row)"
    run.wait_output(restarting, 60)
    assert "exited with code -9" in run.output().partition(restarting)[0]
    # serve's own account of the new attempt: started, then ready (its /health_generate probe), then servers.yaml
    after = run.wait_output(f"server :{run.port} (GPU 0): ready after", 300, after=restarting)
    assert "starting (pid " in after.partition("ready after")[0]
    run.wait_output(f"servers.yaml: servers {run.url}", 60, after=restarting)
    [new] = run.launchers()
    assert new.pid != plain_killed_mid_run.launcher_pid
    assert http_status(run.url + "/health") == 200
    reply = chat(run.url, str(models.designed), "Again?", thinking=False, max_tokens=64)
    assert reply["choices"][0]["message"]["content"] == DESIGNED_ANSWER


STOPS = {"plain": signal.SIGINT, "ngram": signal.SIGTERM, "standalone": signal.SIGTERM}


@dataclass(frozen=True)
class Stopped:
    family: list[psutil.Process]  # serve's descendants just before the signal
    commands: list[str]  # their command lines then
    left: list[psutil.Process]  # still alive after serve exited
    returncode: int | None
    output: str
    described: str


@pytest.fixture(scope="module")
def stopped(fleet) -> dict[str, Stopped]:
    """The three servers stopped at the same time, plain with Ctrl-C (SIGINT), the others with SIGTERM: each
    stop waits about 5 s on SGLang's own pause before crash diagnostics, so one after another took 23 s."""

    def stop(name: str) -> Stopped:
        run = getattr(fleet, name)
        family = run.descendants()
        commands = [" ".join(p.cmdline()) for p in family]
        left = run.stop(STOPS[name], grace_s=60)
        return Stopped(family, commands, left, run.process.returncode, run.output(), run.describe())

    with ThreadPoolExecutor(len(STOPS)) as pool:
        return dict(zip(STOPS, pool.map(stop, STOPS), strict=True))


@pytest.mark.stops_servers
@pytest.mark.parametrize("name", list(STOPS))
def test_ctrl_c_or_sigterm_stops_serve_and_every_sglang_process(stopped, name):
    done = stopped[name]
    assert any("sglang.launch_server" in command for command in done.commands), done.commands
    assert len(done.family) >= 3, done.family  # SGLang's launcher starts a scheduler and a detokenizer
    assert done.returncode == 0, done.described
    assert done.left == [], done.left
    assert not [p for p in done.family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert "every server stopped" in done.output
