"""The process fleet (kill one, restart it), `draftgen sim` shutdown without orphans, and bad CLI input."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from sim_helpers import USER, post_json, wait_for

from draftgen.cli import main
from draftgen.sim.fleet import ephemeral_port_range, find_free_base_port, http_status, port_is_free


def answer(url: str, messages=USER) -> tuple[str, str]:
    status, reply = post_json(
        f"{url}/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 300}
    )
    assert status == 200, reply
    message = reply["choices"][0]["message"]
    return message["reasoning_content"], message["content"]


def test_one_server_killed_alone_and_restarted(sim_fleet):
    fleet = sim_fleet(profile="b200-mtp", speed=50, servers=2)
    first = answer(fleet.urls[0])
    assert answer(fleet.urls[1]) == first  # same prompt, same completion on every server
    fleet.kill(0)
    assert not fleet.alive(0) and fleet.returncode(0) == -signal.SIGKILL
    assert http_status(f"{fleet.urls[0]}/health") is None  # refused
    assert fleet.alive(1) and answer(fleet.urls[1]) == first  # the neighbour carries on
    fleet.restart(0)
    assert fleet.alive(0) and http_status(f"{fleet.urls[0]}/health") == 200
    assert answer(fleet.urls[0]) == first  # and across runs of the process
    assert answer(fleet.urls[0], [{"role": "user", "content": "Something else."}]) != first
    assert [r["kind"] for r in fleet.truth(0)].count("warmup") == 2  # truth survives the restart


# ----- `draftgen sim` as a subprocess ----------------------------------------------------------------------
def _draftgen() -> str:
    return str(Path(sys.executable).with_name("draftgen"))


def _start_cli(tmp_path: Path, servers: int = 2) -> tuple[subprocess.Popen, list[psutil.Process], int]:
    base = find_free_base_port(servers)
    proc = subprocess.Popen(
        [
            _draftgen(),
            "sim",
            "--servers",
            str(servers),
            "--base-port",
            str(base),
            "--speed",
            "50",
            "--work-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a shell job
        # A terminal's default: a test run started in the background (`pytest &`) inherits SIGINT ignored,
        # and Python keeps ignoring it, so the Ctrl-C case would test the launcher instead of draftgen sim.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    while True:
        line = proc.stdout.readline()
        lines.append(line)
        if not line or "listening" in line:
            break
    assert "listening" in lines[-1], "".join(lines) + proc.stderr.read()
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) == servers
    wait_for(
        lambda: all(http_status(f"http://127.0.0.1:{base + i}/health") == 200 for i in range(servers)),
        60,
        "healthy",
    )
    return proc, children, base


def _assert_no_orphans(children: list[psutil.Process], base: int, servers: int) -> None:
    _, alive = psutil.wait_procs(children, timeout=15)
    assert alive == [], [p.pid for p in alive]
    assert wait_for(lambda: all(port_is_free(base + i) for i in range(servers)), 10, "ports to be released")


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_draftgen_sim_stops_every_server(tmp_path, how):
    proc, children, base = _start_cli(tmp_path)
    try:
        if how == "ctrl-c":
            import os

            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
        else:
            proc.send_signal(signal.SIGTERM)  # e.g. `kill PID` or a job scheduler, parent only
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "stopped" in out
    _assert_no_orphans(children, base, 2)


def test_draftgen_sim_killed_hard_leaves_no_servers(tmp_path):
    proc, children, base = _start_cli(tmp_path)
    proc.kill()  # SIGKILL: no chance to clean up; the servers must notice their parent is gone
    proc.wait(timeout=10)
    _assert_no_orphans(children, base, 2)


# ----- bad CLI input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "h100"], "unknown profile 'h100'"),
        (["--fault", "bogus=1"], "unknown fault 'bogus'"),
        (["--fault", "error_rate"], "expected KEY=VALUE"),
        (["--fault", "error_rate=2"], "between 0 and 1"),
        (["--fault", "crash_after=soon"], "crash_after"),
        (["--servers", "0"], "--servers"),
        (["--speed", "0"], "speed"),
        (["--base-port", "70000"], "70000"),
    ],
)
def test_bad_sim_arguments_give_one_line_and_exit_2(capsys, args, message):
    assert main(["sim", "--base-port", str(find_free_base_port(1)), *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftgen sim: error:"), captured.err
    assert message in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_port_in_use_gives_one_line_and_exit_3(tmp_path):
    base = find_free_base_port(3)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + 1))  # the second port of the range
        blocker.listen()
        started = time.monotonic()
        result = subprocess.run(
            [_draftgen(), "sim", "--servers", "3", "--base-port", str(base), "--work-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 3, result  # refused before anything started (draftgen.exit_codes)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {base + 1} already in use" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60
    assert all(port_is_free(base + i) for i in (0, 2))  # nothing was left listening


def test_a_server_whose_fleet_died_during_its_start_up_exits_at_once():
    """The parent-death signal is armed only once the server runs: an already-dead parent must end it too."""
    import os

    from draftgen.sim.defaults import PARENT_PID_ENV
    from draftgen.sim.fleet import find_free_base_port

    port = find_free_base_port(1)
    env = dict(os.environ, **{PARENT_PID_ENV: str(os.getpid() + 999_999)})  # not this server's parent
    done = subprocess.run(
        [sys.executable, "-m", "draftgen.sim.server", "--port", str(port), "--die-with-parent"],
        env=env,
        timeout=30,
        capture_output=True,
    )
    assert done.returncode == 0
    env[PARENT_PID_ENV] = str(os.getpid())  # the real parent: the server starts and serves until stopped
    server = subprocess.Popen(
        [sys.executable, "-m", "draftgen.sim.server", "--port", str(port), "--die-with-parent"], env=env
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(timeout=3)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_free_ports_are_chosen_below_the_ephemeral_range():
    # A port in the ephemeral range with no listener yet can self-connect (source port = destination port) and
    # read its own request back; fleets therefore pick their ports below the range.
    ephemeral_low, _ = ephemeral_port_range()
    bases = {find_free_base_port(7) for _ in range(50)}
    assert all(base + 6 < ephemeral_low for base in bases)


def test_http_status_is_none_for_a_peer_that_does_not_speak_http():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def echo() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(conn.recv(1024))  # the request line comes back where a status line belongs

        thread = threading.Thread(target=echo)
        thread.start()
        assert http_status(f"http://127.0.0.1:{port}/health", timeout=2.0) is None
        thread.join(timeout=5)


def test_a_fleet_whose_picked_port_is_taken_before_its_server_binds_picks_again(monkeypatch, tmp_path):
    """Free when picked, taken by another process before our server bound it (two test workers, or two fleets,
    picking at once): the server exits 'port in use' and the fleet picks new ports; ports the caller named are
    not changed behind its back."""
    import draftgen.sim.fleet as fleet_module

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", find_free_base_port(1)))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy])
        real_pick = fleet_module.find_free_base_port
        monkeypatch.setattr(fleet_module, "find_free_base_port", lambda n: next(picks, None) or real_pick(n))
        monkeypatch.setattr(fleet_module, "port_is_free", lambda port, host="127.0.0.1": True)  # the race
        fleet = fleet_module.SimFleet(servers=1, profile="instant", work_dir=tmp_path / "picked")
        try:
            fleet.start()
            assert fleet.base_port != busy and http_status(f"{fleet.urls[0]}/health") == 200
        finally:
            fleet.cleanup()
        named = fleet_module.SimFleet(
            servers=1, profile="instant", base_port=busy, work_dir=tmp_path / "named"
        )
        with pytest.raises(fleet_module.PortInUse, match=f"port {busy} already in use"):
            named.start()


def test_a_fleet_whose_port_another_simulated_server_answers_on_is_not_taken_for_ready(monkeypatch, tmp_path):
    """Two fleets that picked the same free ports at once: the first binds them, the second's servers exit 'port in
    use' — but until they do, the first's servers answer /health on those ports. The second fleet must not take
    them for its own (its run would go to servers another test stops under it)."""
    import draftgen.sim.fleet as fleet_module

    first = fleet_module.SimFleet(servers=1, profile="instant", work_dir=tmp_path / "first").start()
    try:
        assert first.info(0)["pid"] == first._procs[0].pid
        monkeypatch.setattr(fleet_module, "port_is_free", lambda port, host="127.0.0.1": True)  # the race
        second = fleet_module.SimFleet(
            servers=1, profile="instant", base_port=first.base_port, work_dir=tmp_path / "second"
        )
        with pytest.raises(fleet_module.PortInUse, match=f"port {first.base_port} already in use"):
            second.start()
        assert not second.alive(0) and first.alive(0)  # ours stopped; the other fleet's server untouched
        assert http_status(f"{first.urls[0]}/health") == 200
    finally:
        first.cleanup()
