"""``draftgen serve`` supervising real SGLang: a crash at start, a SIGKILLed server brought back, a clean stop.

The restart and stop tests change the shared servers, so they are marked ``stops_servers`` and run after every
other test of the session (conftest.py orders them), restart first. The server the restart test watches come
back was SIGKILLed mid-run by ``plain_killed_mid_run`` (a generate run that fails over meanwhile).
"""

from __future__ import annotations

import signal

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


@pytest.mark.stops_servers
@pytest.mark.parametrize(
    ("name", "sig"), [("plain", signal.SIGINT), ("ngram", signal.SIGTERM), ("standalone", signal.SIGTERM)]
)
def test_ctrl_c_or_sigterm_stops_serve_and_every_sglang_process(fleet, name, sig):
    run = getattr(fleet, name)
    family = run.descendants()
    assert any("sglang.launch_server" in " ".join(p.cmdline()) for p in family)
    assert len(family) >= 3, family  # SGLang's launcher forks a scheduler and a detokenizer
    left = run.stop(sig, grace_s=60)
    assert run.process.returncode == 0, run.describe()
    assert left == [], left
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert "every server stopped" in run.output()
