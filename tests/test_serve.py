"""``draftgen serve``: command lines (dry run), and the supervisor run for real on simulated servers.

The process tests start ``python -m draftgen serve --engine sim`` as a subprocess, read its event lines as they
come, poke its servers over HTTP, then stop it with SIGINT / SIGTERM / SIGKILL and check with psutil that no
process it started survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import psutil
import pytest
import yaml

from draftgen.cli import main
from draftgen.client.introspect import StartupStage
from draftgen.defaults import CONCURRENCY_PER_SERVER
from draftgen.generate import GenerateConfig, preflight
from draftgen.generate import generate as generate_run
from draftgen.params import build_config
from draftgen.prompts.synthetic import write_synthetic
from draftgen.serve.config import ROUTER_POLICIES, ServeConfig, parse_gpus, served_model_name
from draftgen.serve.preflight import port_in_use
from draftgen.serve.router import healthy_workers
from draftgen.serve.stages import ProcessStage, Stage
from draftgen.serve.view import StatusRow, TableView, render_table
from draftgen.sim.fleet import find_free_base_port

MTP_FLAGS = {
    "--speculative-algorithm": "NEXTN",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}
WAIT_S = 60.0  # a guard against hanging, never a measured bound


# ----- dry run: the command lines -----------------------------------------------------------------------------
def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> list[tuple[dict[str, str], list[str]]]:
    """Run ``draftgen serve ... --dry-run``; return each printed line as (env assignments, argv)."""
    assert main(["serve", "--dry-run", *args]) == 0
    commands = []
    for line in capsys.readouterr().out.splitlines():
        words = shlex.split(line)
        env = {}
        while words and re.match(r"^[A-Z_]+=", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        commands.append((env, words))
    return commands


def options(argv: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --switch`` → {"--flag": ["v1", "v2"], "--switch": []} (a repeated flag must not occur)."""
    parsed: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--"):
            assert word not in parsed, f"{word} given twice in {argv}"
            parsed[word] = []
            current = word
        elif current is not None:
            parsed[current].append(word)
    return parsed


def test_dry_run_seven_gpus_one_server_each_with_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    commands = dry_run(capsys, "--model", "/dev/shm/Qwen3.6-27B", "--gpus", "0-6", "--base-port", "30000")
    assert len(commands) == 7
    for gpu, (env, argv) in enumerate(commands):
        assert env == {"CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1"}
        assert argv[0] == sys.executable
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        flags = options(argv[3:])
        assert flags["--model-path"] == ["/dev/shm/Qwen3.6-27B"]
        assert flags["--host"] == ["127.0.0.1"]
        assert flags["--port"] == [str(30000 + gpu)]
        assert flags["--reasoning-parser"] == ["qwen3"]
        assert flags["--tool-call-parser"] == ["qwen3_coder"]  # Qwen3.5/3.6's calls, the default family
        assert flags["--enable-metrics"] == []
        assert flags["--enable-cache-report"] == []  # generate stores each turn's cached_tokens
        for flag, value in MTP_FLAGS.items():
            assert flags[flag] == [value], flag
        assert "--tp-size" not in flags  # one GPU per server
        assert "--mem-fraction-static" not in flags
        # with MTP on, every request generate keeps in flight runs at once (SGLang's own cap would be 48)
        assert flags["--max-running-requests"] == [str(CONCURRENCY_PER_SERVER)]
        expected = {
            "--model-path",
            "--max-running-requests",
            "--host",
            "--port",
            "--reasoning-parser",
            "--tool-call-parser",
            "--enable-metrics",
            "--enable-cache-report",
            *MTP_FLAGS,
        }
        assert set(flags) == expected


def test_dry_run_no_mtp_removes_exactly_the_speculative_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with_mtp = dry_run(capsys, "--model", "m", "--gpus", "0-6")
    without = dry_run(capsys, "--model", "m", "--gpus", "0-6", "--no-mtp")
    assert len(without) == 7
    for (env_on, on), (env_off, off) in zip(with_mtp, without, strict=True):
        assert env_on == env_off
        flags_on, flags_off = options(on[3:]), options(off[3:])
        assert not [flag for flag in flags_off if flag.startswith("--speculative")]
        # without speculation SGLang sizes its batch cap from memory: serve leaves it to SGLang
        mtp_only = {*MTP_FLAGS, "--max-running-requests"}
        assert {k: v for k, v in flags_on.items() if k not in mtp_only} == flags_off


def test_dry_run_tensor_parallel_groups_consecutive_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    commands = dry_run(capsys, "--model", "m", "--gpus", "0-3", "--tp", "2", "--base-port", "31000")
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in commands] == ["0,1", "2,3"]
    for index, (_, argv) in enumerate(commands):
        flags = options(argv[3:])
        assert flags["--tp-size"] == ["2"]
        assert flags["--port"] == [str(31000 + index)]


def test_dry_run_optional_flags_and_extra_args_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    commands = dry_run(
        capsys,
        *("--model", "/models/q", "--gpus", "2,4", "--mem-fraction", "0.85", "--max-running-requests", "64"),
        *("--host", "0.0.0.0", "--", "--context-length", "32768", "--served-model-name", "qwen"),
    )
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in commands] == ["2", "4"]
    for _, argv in commands:
        flags = options(argv[3:])
        assert flags["--mem-fraction-static"] == ["0.85"]
        assert flags["--max-running-requests"] == ["64"]
        assert flags["--host"] == ["0.0.0.0"]
        assert argv[-4:] == ["--context-length", "32768", "--served-model-name", "qwen"]


def test_dry_run_router_line_lists_every_worker(capsys: pytest.CaptureFixture[str]) -> None:
    commands = dry_run(
        capsys,
        *("--model", "m", "--gpus", "0-1", "--router", "--router-port", "8000"),
        *("--router-worker", "http://node2:30000"),
    )
    assert len(commands) == 3
    env, argv = commands[-1]
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert argv[1:4] == ["-m", "smg", "launch"]  # SMG, SGLang's gateway
    flags = options(argv[4:])
    assert flags["--worker-urls"] == [
        "http://127.0.0.1:30000",
        "http://127.0.0.1:30001",
        "http://node2:30000",
    ]
    assert flags["--policy"] == ["cache_aware"]
    assert flags["--port"] == ["8000"]
    assert flags["--prometheus-port"] == ["8001"]  # its metrics on a port of their own, next to the API's
    assert flags["--host"] == ["127.0.0.1"] and flags["--prometheus-host"] == ["127.0.0.1"]


@pytest.mark.parametrize("policy", ROUTER_POLICIES)
def test_dry_run_router_line_is_read_by_smgs_own_parser(
    capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    _, argv = dry_run(capsys, "--model", "m", "--gpus", "0-1", "--router", "--router-policy", policy)[-1]
    # the pinned smg wheel's own argument parser (what `smg launch` runs) reads the printed line
    from smg.launch_router import parse_router_args

    parsed = parse_router_args(argv[4:])
    assert parsed.policy == policy
    assert parsed.worker_urls == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert (parsed.host, parsed.port, parsed.prometheus_port) == ("127.0.0.1", 30100, 30101)


def test_dry_run_sim_engine_picks_the_profile_from_mtp(capsys: pytest.CaptureFixture[str]) -> None:
    def profile(*extra: str) -> list[str]:
        commands = dry_run(capsys, "--engine", "sim", "--gpus", "0-1", *extra)
        assert all(argv[1:3] == ["-m", "draftgen.sim.server"] for _, argv in commands)
        return [options(argv[3:])["--profile"][0] for _, argv in commands]

    assert profile() == ["b200-mtp", "b200-mtp"]
    assert profile("--no-mtp") == ["rtx-pro-6000", "rtx-pro-6000"]
    assert profile("--no-mtp", "--sim-profile", "instant") == ["instant", "instant"]
    _, argv = dry_run(capsys, "--engine", "sim", "--gpus", "0", "--sim-fault", "load_delay=2")[0]
    assert options(argv[3:])["--fault"] == ["load_delay=2"]
    # as SGLang is started: --model is the path it loads (and its served name unless --served-model-name says
    # otherwise), and MTP on brings the production batch cap
    _, argv = dry_run(
        capsys, "--engine", "sim", "--gpus", "0", "--model", "/m/Q", "--", "--served-model-name", "q"
    )[0]
    flags = options(argv[3:])
    assert (flags["--model-path"], flags["--model"]) == (["/m/Q"], ["q"])
    assert flags["--max-running-requests"] == [str(CONCURRENCY_PER_SERVER)]


def test_a_simulated_server_reports_its_model_path_and_speaks_the_tokenizer_there(tmp_path: Path) -> None:
    """SGLang loads its tokenizer from --model-path and names that folder in /server_info (model_path,
    tokenizer_path) while /v1/models lists the served name: the simulator started as serve starts it (no
    --tokenizer) does the same. The folder's tokenizer is a smaller vocabulary than the default one, so the prompt
    count says which one the server spoke."""
    from draftgen.client.introspect import parse_model_ids, parse_model_roots
    from draftgen.sim.tokenizer import SimTokenizer, default_tokenizer
    from draftgen.training.local_tokenizer import build_tiny_tokenizer

    model = build_tiny_tokenizer(tmp_path / "Qwen3.6-27B", vocab_size=700)
    messages = [
        {"role": "user", "content": "Explain how a speculative decoding drafter is trained, briefly."}
    ]
    ours, default = SimTokenizer(str(model)), SimTokenizer(str(default_tokenizer()))
    counts = [len(t.encode(t.render(messages, True, None))) for t in (ours, default)]
    assert counts[0] != counts[1]  # the two tokenizers tell themselves apart
    port = find_free_base_port(1)
    argv = [sys.executable, "-m", "draftgen.sim.server", "--port", str(port), "--profile", "instant"]
    server = subprocess.Popen([*argv, "--model", "q", "--model-path", str(model)], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while http_status(f"{url}/health") != 200:
            assert server.poll() is None and time.monotonic() < deadline, "the simulated server did not start"
            time.sleep(0.1)
        listed = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=10).read())
        info = json.loads(urllib.request.urlopen(f"{url}/server_info", timeout=10).read())
        body = json.dumps({"model": "q", "messages": messages, "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert parse_model_ids(listed) == parse_model_roots(listed) == ("q",)
    assert (info["model_path"], info["tokenizer_path"], info["served_model_name"]) == (
        str(model),
        str(model),
        "q",
    )
    assert answer["usage"]["prompt_tokens"] == counts[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "m", "--gpus", "0-6", "--tp", "2"], "--tp 2 does not divide the 7 GPUs"),
        (["--model", "m", "--gpus", "3-1"], "runs backwards"),
        (["--model", "m", "--gpus", "0,1,1"], "GPU 1 listed twice"),
        (["--model", "m", "--gpus", "0", "--mem-fraction", "1.5"], "--mem-fraction 1.5"),
        (["--gpus", "0-6"], "--model is required"),
        (["--model", "m", "--gpus", "0", "--sim-fault", "load_delay=1"], "only apply with --engine sim"),
        (["--engine", "sim", "--gpus", "0", "--sim-fault", "bogus=1"], "unknown fault 'bogus'"),
        (["--model", "m", "--gpus", "0-1", "--router", "--router-port", "30001"], "also a server port"),
        (
            ["--model", "m", "--gpus", "0-1", "--router", "--router-port", "29999"],
            "--router-metrics-port 30000",
        ),
        (["--model", "m", "--gpus", "0", "stray"], "extra server arguments go after --"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["serve", "--dry-run", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftgen serve: error:"), err
    assert message in err[0]


def test_parse_gpus_keeps_order_and_expands_ranges() -> None:
    assert parse_gpus("0-6") == (0, 1, 2, 3, 4, 5, 6)
    assert parse_gpus("0,2,4") == (0, 2, 4)
    assert parse_gpus("4-5,0") == (4, 5, 0)
    with pytest.raises(ValueError, match="not a GPU index"):
        parse_gpus("gpu0")


def test_served_model_name_follows_the_extra_args() -> None:
    assert served_model_name("/dev/shm/Q", ()) == "/dev/shm/Q"
    assert served_model_name("/dev/shm/Q", ("--served-model-name", "qwen")) == "qwen"
    assert served_model_name("/dev/shm/Q", ("--served-model-name=qwen2",)) == "qwen2"
    config = ServeConfig(model="/m", gpus="0", extra_args=["--served-model-name", "q"], run_name="r")
    assert config.served_model == "q"


def test_sglang_engine_refuses_an_interpreter_that_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho broken >&2; exit 1\n")  # fails whatever it is asked
    fake.chmod(0o755)
    code = main(["serve", "--model", "m", "--gpus", "0", "--python", str(fake), "--out", str(tmp_path / "o")])
    assert code == 3  # refused before anything started
    err = capsys.readouterr().err
    assert f"--python {fake}: cannot run it (broken)" in err
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


# ----- the status table ---------------------------------------------------------------------------------------
def _row(port: int, stage: Stage, **changes: object) -> StatusRow:
    values: dict[str, object] = dict(
        name=f"server-{port}",
        port=port,
        gpus=(port - 30000,),
        stage=stage,
        detail="",
        in_stage_s=5.0,
        up_s=65.0,
        restarts=0,
        pid=1234,
    )
    values.update(changes)
    return StatusRow(**values)  # type: ignore[arg-type]


def test_status_table_shows_stage_meaning_and_restarts() -> None:
    lines = render_table(
        [_row(30000, StartupStage.WARMING), _row(30001, ProcessStage.FAILED, restarts=3, pid=None, up_s=None)]
    )
    assert lines[0].split() == ["port", "GPUs", "stage", "for", "up", "restarts", "pid", "meaning"]
    assert lines[1].split()[:7] == ["30000", "0", "503", "5s", "1m05s", "0", "1234"]
    assert "warm-up not finished" in lines[1]
    assert lines[2].split()[:7] == ["30001", "1", "failed", "5s", "-", "3", "-"]


def test_table_view_redraws_in_place_below_event_lines() -> None:
    stream = io.StringIO()
    view = TableView(stream)
    view.refresh([_row(30000, StartupStage.REFUSED)])
    view.event("server :30000 (GPU 0): 503")
    view.refresh([_row(30000, StartupStage.WARMING)])
    text = stream.getvalue()
    # the first table (2 lines) is erased before the event line, then a new table is drawn
    first_table, rest = text.split("\x1b[2F\x1b[J", 1)
    assert "refused" in first_table
    assert rest.startswith("server :30000 (GPU 0): 503\n")
    assert "503" in rest.splitlines()[2]


# ----- the supervisor, for real on simulated servers ----------------------------------------------------------
class Serve:
    """``draftgen serve`` as a subprocess whose stdout lines are collected as they arrive."""

    def __init__(self, tmp_path: Path, servers: int, *args: str, env: dict[str, str] | None = None):
        self.base_port = find_free_base_port(servers)
        self.ports = [self.base_port + i for i in range(servers)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.run_dir = tmp_path / "serve" / "run"
        command = [
            *(sys.executable, "-m", "draftgen", "serve", "--engine", "sim", "--gpus", f"0-{servers - 1}"),
            *("--base-port", str(self.base_port), "--out", str(tmp_path / "serve"), "--run", "run"),
            *("--sim-speed", "50", "--poll-interval", "0.1", "--grace", "5", "--plain", *args),
        ]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # so the test can clean up after a failure without touching itself
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.seen: set[int] = set()  # every pid ever observed under draftgen serve

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, count: int = 1) -> list[str]:
        """Block until ``count`` lines matched ``pattern`` (regex) in total; fail with the output otherwise."""
        deadline = time.monotonic() + WAIT_S
        while True:
            self.note_children()
            matches = [line for line in self.lines if re.search(pattern, line)]
            if len(matches) >= count:
                return matches
            try:
                line = self._queue.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                line = ""
            if line is None:
                pytest.fail(f"draftgen serve ended before {pattern!r}:\n{self.output()}")
            if line:
                self.lines.append(line)
            if time.monotonic() > deadline:
                pytest.fail(f"no {count} line(s) matching {pattern!r} within {WAIT_S}s:\n{self.output()}")

    def finish(self) -> int:
        """Wait for the process to exit; collect the rest of its output."""
        code = self.proc.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        while True:
            line = self._queue.get()
            if line is None:
                break
            self.lines.append(line)
        return code

    def note_children(self) -> None:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        self.seen.update(child.pid for child in children)

    def live_children(self) -> list[str]:
        """Command lines of the processes running under draftgen serve right now."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(child.cmdline()))
        return alive

    def server_pid(self, port: int) -> int:
        self.note_children()
        for pid in self.seen:
            try:
                if f"--port {port}" in " ".join(psutil.Process(pid).cmdline()):
                    return pid
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"no live server process on port {port} among {self.seen}")

    def listener_pid(self, port: int) -> int:
        """The child listening on ``port``: SMG renames its process (``smg::router``), so no command line says."""
        self.note_children()
        for pid in self.seen:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                for conn in psutil.Process(pid).net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                        return pid
        raise AssertionError(f"no live process listening on port {port} among {self.seen}")

    def signal(self, sig: int) -> None:
        self.note_children()
        self.proc.send_signal(sig)

    def survivors(self) -> list[int]:
        """Processes this serve started that are still alive, after giving them a moment to go."""
        alive = []
        for pid in self.seen:
            try:
                process = psutil.Process(pid)
                process.wait(timeout=10)  # SIGKILLed children are reaped by then; a survivor stays
            except psutil.NoSuchProcess:
                continue
            except psutil.TimeoutExpired:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if process.status() != psutil.STATUS_ZOMBIE:  # a zombie is dead, just not reaped yet
                        alive.append(pid)
        return alive

    def kill_everything(self) -> None:
        for pid in [self.proc.pid, *self.seen]:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=10)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def start(servers: int, *args: str, **kwargs: object) -> Serve:
        instance = Serve(tmp_path, servers, *args, **kwargs)  # type: ignore[arg-type]
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.kill_everything()


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def generate(url: str) -> None:
    """One native /generate request (the sim counts it towards ``crash_after``)."""
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()
    request = urllib.request.Request(
        f"{url}/generate", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except OSError:
        pass  # the injected crash drops the connection: that is the point


def servers_yaml(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "servers.yaml").read_text())


def stages_of(lines: list[str], port: int) -> list[str]:
    pattern = re.compile(rf"server :{port} \(GPU \d+\): (starting|refused|503|ready)\b")
    return [m.group(1) for m in map(pattern.search, lines) if m]


def launcher(tmp_path: Path) -> Path:
    """An interpreter stand-in that, like SGLang's launcher, runs the real server in a child process.

    The server is then a grandchild of draftgen serve: only a signal to the whole process group reaches it.
    """
    script = tmp_path / "launcher.sh"
    script.write_text(f'#!/bin/sh\n{shlex.quote(sys.executable)} "$@" &\nchild=$!\nwait $child\n')
    script.chmod(0o755)
    return script


def test_readiness_stages_servers_yaml_and_sigint_stops_everything(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = serve(
        2,
        *("--sim-fault", "load_delay=1", "--sim-fault", "startup_delay=1"),
        *("--python", str(launcher(tmp_path))),
    )
    run.wait_for(r"2 of 2 servers ready")
    # the start's outcome under it, grouped: one row for both servers
    run.wait_for(r"^  ok +ready +2/2 servers +/health_generate answered 200, [\d.–]+ s after start$")
    run.wait_for(r"wrote .*servers\.yaml")
    for port in run.ports:
        # the port opens only after "loading", and /health_generate says 503 until warm-up ran
        assert stages_of(run.lines, port) == ["starting", "refused", "503", "ready"], run.output()
    assert servers_yaml(run.run_dir) == {"servers": run.urls, "model": "Qwen/Qwen3.6-27B"}
    assert all(http_status(f"{url}/health_generate") == 200 for url in run.urls)
    assert len(run.seen) == 4  # two launchers, two servers
    commands = (run.run_dir / "commands.sh").read_text()
    assert all(f"--port {port}" in commands for port in run.ports)
    for port in run.ports:
        log = (run.run_dir / f"server-{port}.log").read_text()
        assert log.startswith("==> draftgen serve") and "CUDA_VISIBLE_DEVICES=" in log

    run.signal(signal.SIGINT)
    assert run.finish() == 0, run.output()
    assert "every server stopped" in run.output()
    assert run.survivors() == []
    assert not any(port_in_use("127.0.0.1", port) for port in run.ports)


def test_crashed_server_reported_with_log_tail_others_keep_serving(serve) -> None:  # type: ignore[no-untyped-def]
    run = serve(2, "--sim-fault", "crash_after=1")  # the first real request kills a server
    run.wait_for(r"2 of 2 servers ready")
    crashed, healthy = run.ports
    generate(run.urls[0])
    report = run.wait_for(rf"server :{crashed} .*exited with code 70")[0]
    assert "(was ready)" in report
    run.wait_for(rf"last \d+ lines of .*server-{crashed}\.log")
    run.wait_for(rf"\| sim server on port {crashed}: injected crash")  # the log tail is in the output
    run.wait_for(rf"server :{crashed} .*not restarted \(start with --restart")
    run.wait_for(rf"wrote .*servers\.yaml: servers http://127\.0\.0\.1:{healthy}$")
    assert servers_yaml(run.run_dir)["servers"] == [run.urls[1]]
    assert http_status(f"{run.urls[1]}/health_generate") == 200  # the other server is untouched

    run.signal(signal.SIGTERM)
    assert run.finish() == 0, run.output()
    assert run.survivors() == []


def test_restart_brings_a_crashed_server_back(serve) -> None:  # type: ignore[no-untyped-def]
    run = serve(
        1, "--sim-fault", "crash_after=1", "--restart", "--restart-backoff", "0.2", "--max-restarts", "2"
    )
    run.wait_for(r"1 of 1 servers ready")
    (port,) = run.ports
    first_pid = run.server_pid(port)
    generate(run.urls[0])
    run.wait_for(rf"server :{port} .*exited with code 70")
    run.wait_for(rf"server :{port} .*restarting in 0\.2s \(restart 1 of at most 2")
    run.wait_for(rf"server :{port} .*: ready after", count=2)
    run.wait_for(rf"wrote .*servers\.yaml: servers {run.urls[0]}$", count=2)
    assert http_status(f"{run.urls[0]}/health_generate") == 200
    assert run.server_pid(port) != first_pid
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE

    # A second and third crash exhaust --max-restarts 2: the supervisor gives up and says so.
    generate(run.urls[0])
    run.wait_for(rf"server :{port} .*: ready after", count=3)
    generate(run.urls[0])
    run.wait_for(rf"server :{port} .*gave up after 3 failures in a row")
    run.wait_for(r"every server has failed")
    assert run.finish() == 1
    assert servers_yaml(run.run_dir)["servers"] == []
    assert run.survivors() == []


def test_dead_launcher_takes_its_process_group_with_it(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # SGLang's launcher dying leaves scheduler processes holding GPU memory unless the group is cleared.
    run = serve(1, "--python", str(launcher(tmp_path)))
    run.wait_for(r"1 of 1 servers ready")
    (port,) = run.ports
    (leader,) = psutil.Process(run.proc.pid).children()
    (server,) = leader.children()
    leader.kill()
    run.wait_for(rf"server :{port} .*exited with code -9")
    run.wait_for(rf"server :{port} .*not restarted")
    run.wait_for(r"every server has failed")
    assert run.finish() == 1
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert run.survivors() == []


def test_startup_timeout_names_the_stuck_stage(serve) -> None:  # type: ignore[no-untyped-def]
    run = serve(1, "--sim-fault", "load_delay=30", "--timeout", "1", "--grace", "1")
    (port,) = run.ports
    run.wait_for(rf"server :{port} .*not ready after 1s \(stuck at refused: connection refused")
    run.wait_for(r"every server has failed")
    run.wait_for(
        rf"^  FAIL +ready +{run.urls[0]} +not ready after 1s \(stuck at refused: .*; log .*server-{port}\.log$"
    )
    assert run.finish() == 1
    assert not (run.run_dir / "servers.yaml").exists()
    assert run.survivors() == []


def test_killing_serve_itself_leaves_no_orphan(serve) -> None:  # type: ignore[no-untyped-def]
    run = serve(2)
    run.wait_for(r"2 of 2 servers ready")
    run.signal(signal.SIGKILL)  # no chance to clean up: the children must go by themselves
    assert run.finish() == -signal.SIGKILL
    assert len(run.seen) == 2
    assert run.survivors() == []


def test_port_already_in_use_is_one_line_and_exit_3(tmp_path: Path) -> None:
    base = find_free_base_port(2)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + 1))
        blocker.listen()
        result = subprocess.run(
            [
                *(sys.executable, "-m", "draftgen", "serve", "--engine", "sim", "--gpus", "0-1"),
                *("--base-port", str(base), "--out", str(tmp_path / "serve"), "--run", "r"),
            ],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
    assert result.returncode == 3, result  # refused before anything started (draftgen.exit_codes)
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftgen serve: error: port"), result.stderr
    assert f"port {base + 1} on 127.0.0.1 already in use" in err[0]
    assert result.stdout == ""
    assert not (tmp_path / "serve").exists()


def _gateway_run(run, tmp_path: Path, router_port: int) -> str:  # type: ignore[no-untyped-def]
    """Wait for serve's SMG (ready, servers.yaml naming it, every worker registered); its URL."""
    run.wait_for(r"2 of 2 servers ready")
    run.wait_for(rf"router :{router_port} \(router\): ready")
    router_url = f"http://127.0.0.1:{router_port}"
    run.wait_for(rf"wrote .*servers\.yaml: router {router_url}$")
    assert servers_yaml(run.run_dir)["servers"] == [router_url]
    # SMG's own worker list: ready (/readiness) means at least one worker registered and healthy; the rest of
    # the initial list may still be registering in the background.
    expected = dict.fromkeys(run.urls, True)
    for _ in range(100):
        if healthy_workers(router_url) == expected:
            break
        time.sleep(0.1)
    assert healthy_workers(router_url) == expected
    return router_url


def _through(router_url: str, tmp_path: Path, prompts: int, seed: int) -> GenerateConfig:
    path = tmp_path / "p.jsonl"
    write_synthetic(path, prompts, seed=seed)
    return build_config(
        GenerateConfig,
        {
            "servers": [router_url],
            "model": "Qwen/Qwen3.6-27B",
            "prompts": str(path),
            "out_dir": str(tmp_path / "gen"),
            "max_tokens": 64,
            "concurrency_per_server": 16,
            "batch_save_size": 50,
            "max_truncated_rate": 1.0,
            "backoff_base_s": 0.05,
            "backoff_max_s": 0.5,
            "probe_interval_s": 0.5,
            "probe_max_interval_s": 2.0,
            "canary": False,
            # behind SMG the simulated workers look like real engines (no /sim/info) serving a model whose folder
            # this machine lacks: without a tokenizer, the trainer's cap must be turned off (not this test's subject)
            "train_max_length": 0,
        },
    )


def _kill_after_two_shards(config: GenerateConfig, pid: Callable[[], int]):  # type: ignore[no-untyped-def]
    """Run generate; SIGKILL ``pid()`` once two shards are stored; the run's result."""

    async def scenario():  # type: ignore[no-untyped-def]
        plan = await preflight(config)
        task = asyncio.create_task(generate_run(config, plan, progress=False))
        while len(list((Path(config.out_dir) / "shards").glob("*.parquet"))) < 2:
            assert not task.done(), task
            await asyncio.sleep(0.05)
        os.kill(pid(), signal.SIGKILL)
        return await task

    return asyncio.run(scenario())


def _stored_once(config: GenerateConfig, prompts: int, seed: int) -> pl.DataFrame:
    frame = pl.read_parquet(sorted((Path(config.out_dir) / "shards").glob("*.parquet")))
    assert frame.height == prompts
    assert sorted(frame["id"].to_list()) == [f"syn-{seed}-{i:07d}" for i in range(prompts)]
    return frame


def test_smg_with_a_worker_gone_for_good_the_run_continues_on_the_rest(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # smg (a dev dependency): SGLang's real gateway in front of two simulated workers; no --restart, so the
    # killed worker stays gone and SMG carries on with the other.
    router_port = find_free_base_port(2)
    run = serve(2, *("--router", "--router-port", str(router_port), "--router-policy", "round_robin"))
    router_url = _gateway_run(run, tmp_path, router_port)
    assert (
        http_status(f"http://127.0.0.1:{router_port + 1}/metrics") == 200
    )  # its metrics port, not the API's
    assert len(run.live_children()) == 3, run.live_children()  # two servers and SMG

    config = _through(router_url, tmp_path, 400, seed=31)
    victim = run.ports[0]
    result = _kill_after_two_shards(config, lambda: run.server_pid(victim))  # a worker dies behind SMG
    run.wait_for(rf"server :{victim} .*exited with code -9")
    run.wait_for(rf"server :{victim} .*not restarted")
    assert result.status == "complete" and result.failed == 0
    frame = _stored_once(config, 400, seed=31)
    assert set(frame["server"].to_list()) == {router_url}
    assert servers_yaml(run.run_dir)["servers"] == [router_url]  # SMG still stands for the fleet

    run.signal(signal.SIGHUP)  # the terminal went away: a clean stop too
    assert run.finish() == 0, run.output()
    assert run.survivors() == []


def test_smg_killed_mid_run_is_restarted_by_serve_and_generate_stores_every_id_once(
    serve, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # The gateway is the run's only server: killing it is "every server down". generate benches it, waits
    # (spending no attempts), probes it and carries on once serve --restart has brought SMG back.
    router_port = find_free_base_port(2)
    run = serve(
        2,
        *("--router", "--router-port", str(router_port), "--router-policy", "cache_aware"),
        *("--restart", "--restart-backoff", "0.5"),
    )
    router_url = _gateway_run(run, tmp_path, router_port)
    config = _through(router_url, tmp_path, 400, seed=37)
    result = _kill_after_two_shards(config, lambda: run.listener_pid(router_port))
    run.wait_for(rf"router :{router_port} \(router\): exited with code -9")
    run.wait_for(rf"router :{router_port} \(router\): restarting in")
    run.wait_for(rf"router :{router_port} \(router\): ready after", count=2)  # serve brought SMG back
    assert result.status == "complete" and result.failed == 0, result
    frame = _stored_once(config, 400, seed=37)
    assert set(frame["server"].to_list()) == {router_url}
    said = [what for _, server, what in result.events if server in (router_url, "fleet")]
    assert any(what.startswith("marked down after") for what in said), said  # the gateway was benched ...
    assert any("every server is down" in what for what in said), said  # ... the run waited for it ...
    assert any(what.startswith("healthy again") for what in said), said  # ... and it rejoined
    assert servers_yaml(run.run_dir)["servers"] == [router_url]

    run.signal(signal.SIGTERM)
    assert run.finish() == 0, run.output()
    assert run.survivors() == []


def test_a_start_whose_deadline_passed_before_the_first_probe_is_probed_once_and_names_its_stage() -> None:
    """On a loaded machine the start-up deadline can pass before the watch first asks: the server is still asked
    once, so the timeout says what it was doing (refused here), never 'not probed yet'."""
    from draftgen.serve.startup import StartupWatch, wait_until_ready

    async def go():  # type: ignore[no-untyped-def]
        process = await asyncio.create_subprocess_exec("sleep", "30")
        try:
            with socket.socket() as bound:  # bound, never listening: connections are refused
                bound.bind(("127.0.0.1", 0))
                url = f"http://127.0.0.1:{bound.getsockname()[1]}"
                watch = StartupWatch(timeout_s=1.0, probe_timeout_s=1.0, poll_interval_s=0.1)
                return await wait_until_ready(
                    process, url, "/health", watch, started_at=time.monotonic() - 60
                )
        finally:
            process.kill()
            await process.wait()

    outcome = asyncio.run(go())
    assert outcome.result == "timeout" and outcome.last is not None
    assert outcome.last_stage == StartupStage.REFUSED.value


def test_a_start_is_not_ready_while_another_simulated_server_answers_on_its_port(sim_fleet) -> None:
    """Another process can bind the port between tune's free-port check and its own server's bind (the started one is
    still importing). Its /health 200 is not this start's readiness: the watch names the answering process and keeps
    asking until its own server exits, here the deadline passes first."""
    from draftgen.serve.startup import StartupWatch, wait_until_ready

    other = sim_fleet(profile="instant")

    async def go(argv: list[str]):  # type: ignore[no-untyped-def]
        process = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
        try:
            watch = StartupWatch(timeout_s=1.5, probe_timeout_s=2.0, poll_interval_s=0.1)
            return await wait_until_ready(
                process, other.urls[0], "/health", watch, started_at=time.monotonic()
            )
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()

    stranger = asyncio.run(go(["sleep", "30"]))
    assert stranger.result == "timeout" and stranger.last is not None
    assert stranger.last.stage is StartupStage.ERROR
    assert f"pid {other.info(0)['pid']}" in stranger.last.detail
    assert asyncio.run(go(["sleep", "0.3"])).result == "exited"  # its own server gone: the start failed


def test_a_start_is_ready_when_the_server_answering_is_the_one_it_started(sim_tokenizer_dir) -> None:
    """The same check passes the watch's own simulated server, started the way serve and tune start it."""
    from draftgen.serve.startup import StartupWatch, wait_until_ready

    port = find_free_base_port(1)
    argv = [
        sys.executable,
        "-m",
        "draftgen.sim.server",
        "--port",
        str(port),
        "--profile",
        "instant",
        "--tokenizer",
        str(sim_tokenizer_dir),
    ]

    async def go():  # type: ignore[no-untyped-def]
        process = await asyncio.create_subprocess_exec(
            *argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            watch = StartupWatch(timeout_s=60.0, probe_timeout_s=5.0, poll_interval_s=0.1)
            return await wait_until_ready(
                process, f"http://127.0.0.1:{port}", "/health", watch, started_at=time.monotonic()
            )
        finally:
            process.terminate()
            await process.wait()

    outcome = asyncio.run(go())
    assert outcome.result == "ready", outcome


def test_the_tool_call_parser_follows_the_model_family_and_yields_to_one_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Qwen3.5/3.6 write calls that SGLang's qwen3_coder parser reads, Qwen3 those its qwen parser reads
    (sglang_rules.parsers); a parser named after -- is the operator's choice and is not doubled; the simulated
    servers get the same flag."""
    args = ("--model", "/m", "--gpus", "0", "--no-mtp")
    ((_, qwen3),) = dry_run(capsys, *args, "--model-family", "qwen3")
    assert options(qwen3[3:])["--tool-call-parser"] == ["qwen"]
    ((_, given),) = dry_run(capsys, *args, "--", "--tool-call-parser", "hermes")
    assert options(given[3:])["--tool-call-parser"] == ["hermes"]
    ((_, sim),) = dry_run(capsys, "--engine", "sim", "--gpus", "0")
    assert options(sim[3:])["--tool-call-parser"] == ["qwen3_coder"]
    with pytest.raises(SystemExit):
        dry_run(capsys, *args, "--model-family", "llama")
