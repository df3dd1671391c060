"""The README's "On the GPU node" block, run as written on a machine without GPUs, to a published export (issue 46).

The block is read from README.md (between ``<!-- runbook -->`` and ``<!-- end runbook -->``) and each command runs
in order, in a scratch project root (``DRAFTGEN_ROOT``; its ``params/`` is the checkout's), with only what a
machine without GPUs must change, each rule below a regex and its replacement. Every rule must apply at least once,
and every other word runs as written: a README line that breaks, or that a rule no longer matches, fails the test.
``draftgen serve`` runs in the foreground until Ctrl-C on the GPU node (tmux): here it runs in the background until
the end, and is stopped with SIGINT as Ctrl-C stops it.

The whole run is marked ``runbook``: ``make test-runbook`` runs it, not ``make test`` (docs/testing.md), which runs
only the check that every rule still applies.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from draftgen.sim.fleet import find_free_base_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"<!-- runbook -->\n```bash\n(.*?)```\n<!-- end runbook -->", re.S)
SERVERS = 2  # what `--gpus 0-1` starts
SERVE_READY_S = 120.0  # a wait for two simulated servers, never a measured bound
STEP_TIMEOUT_S = 900


@dataclass(frozen=True)
class Rule:
    """One change a machine without GPUs must make: ``pattern`` (a regex) becomes ``replacement``."""

    pattern: str
    replacement: str
    why: str


# What the test changes, and nothing else. {python}, {port}, {model}, {prompts}, {sample}: the test's own.
RULES = (
    Rule(
        r"^pip install -r requirements\.txt && pip install --no-deps -e \.$",
        "{python} -c 'import draftgen, smg'",
        "this checkout is installed in the test's environment from the same lock, SMG included (make: .venv); "
        "no network here",
    ),
    Rule(
        r" --python /opt/sglang/bin/python",
        "",
        "no SGLang environment here: the simulator runs in draftgen's",
    ),
    Rule(
        r"^draftgen serve ",
        "draftgen serve --engine sim --sim-speed 200 --base-port {port} ",
        "no GPU: simulated SGLang servers (B200 + MTP timing, fast clock) on ports no other test holds",
    ),
    Rule(r"--gpus 0-6", "--gpus 0-1", "two cores: two simulated servers, not seven"),
    Rule(
        r"/dev/shm/Qwen3\.6-27B",
        "{model}",
        "the model folder: a local tokenizer folder (what draftgen tokenizer writes; the simulator needs no weights)",
    ),
    Rule(r"/data/prompts\.jsonl", "{prompts}", "the prompt file: 240 synthetic prompts"),
    Rule(r"/data/sample\.jsonl", "{sample}", "the benchmark's sample: 60 synthetic prompts"),
    Rule(
        r"^draftgen run benchmark ",
        "draftgen run benchmark -p concurrencies '[1, 8, 64]' -p rounds 1 ",
        "three levels of one round each: what two cores stream in a minute (the default is eight levels of 128)",
    ),
)
# Exit codes a line may end with besides 0: the audit's 1 means findings to read first (its comment says so).
ACCEPTED = {"draftgen prompts audit": (0, 1)}


COMMENT = re.compile(r"(^|\s+)#(\s.*)?$")


def runbook(text: str) -> list[str]:
    """The block's commands as written: continuation lines joined, trailing comments dropped (no command of the
    block holds a quoted #: shlex must read each the same with or without its comment)."""
    match = BLOCK.search(text)
    assert match, "README.md has no <!-- runbook --> ```bash block"
    commands = []
    for line in re.sub(r"\\\n\s*", " ", match.group(1)).splitlines():
        command = COMMENT.sub("", line).strip()
        assert shlex.split(line, comments=True) == shlex.split(command), f"a # inside quotes: {line}"
        if command:
            commands.append(" ".join(command.split()))
    return commands


def substituted(commands: list[str], values: dict[str, str]) -> list[str]:
    """The commands with every rule applied; AssertionError naming a rule that matched nothing."""
    out = []
    used = dict.fromkeys(range(len(RULES)), 0)
    for command in commands:
        for index, rule in enumerate(RULES):
            command, count = re.subn(rule.pattern, rule.replacement.format(**values), command)
            used[index] += count
        out.append(command)
    unused = [RULES[i].pattern for i, n in used.items() if n == 0]
    assert not unused, f"the README's runbook no longer has what these rules change: {unused}"
    return out


class Serve:
    """The serve line, in the background as tmux holds it; stopped with SIGINT (Ctrl-C)."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], log: Path):
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, servers_yaml: Path) -> None:
        deadline = time.monotonic() + SERVE_READY_S
        while True:
            assert self.proc.poll() is None, (
                f"serve exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )
            if (
                servers_yaml.exists()
                and len((yaml.safe_load(servers_yaml.read_text()) or {}).get("servers") or []) == SERVERS
            ):
                return
            assert time.monotonic() < deadline, (
                f"serve not ready in {SERVE_READY_S:g} s:\n{self.log.read_text()[-3000:]}"
            )
            time.sleep(0.2)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C in its terminal: the whole foreground group
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return None
        return self.proc.returncode


@pytest.fixture
def scratch(tmp_path: Path, sim_tokenizer_dir: Path) -> Iterator[tuple[Path, dict[str, str], dict[str, str]]]:
    """A project root with the checkout's params/, the model folder, the prompt files; the environment; the
    values the rules put in."""
    import shutil

    from draftgen.prompts.synthetic import write_synthetic

    root = tmp_path / "node"
    root.mkdir()
    (root / "params").symlink_to(REPO / "params")
    model = tmp_path / "models" / "Qwen3.6-27B"
    shutil.copytree(sim_tokenizer_dir, model)
    prompts, sample = tmp_path / "data" / "prompts.jsonl", tmp_path / "data" / "sample.jsonl"
    prompts.parent.mkdir()
    write_synthetic(prompts, 240, seed=46)
    write_synthetic(sample, 60, seed=47)
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "DRAFTGEN_ROOT": str(root),
    }
    env.pop("DRAFTGEN_SGLANG_PYTHON", None)
    values = {
        "python": shlex.quote(sys.executable),
        "port": str(find_free_base_port(SERVERS)),
        "model": str(model),
        "prompts": str(prompts),
        "sample": str(sample),
    }
    yield root, env, values


@pytest.mark.runbook
def test_the_readme_runbook_runs_as_written_to_a_published_export(scratch) -> None:
    root, env, values = scratch
    commands = substituted(runbook(README.read_text()), values)
    serve: Serve | None = None
    try:
        for index, command in enumerate(commands):
            print(f"$ {command}", flush=True)
            if command.startswith("draftgen serve "):
                serve = Serve(command, root, env, root / "serve.log")
                serve.wait_ready(root / "outputs" / "serve" / "node" / "servers.yaml")
                continue
            started = time.perf_counter()
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT_S,
            )
            print(f"  exit {done.returncode} after {time.perf_counter() - started:.0f} s", flush=True)
            accepted = next((codes for start, codes in ACCEPTED.items() if command.startswith(start)), (0,))
            assert done.returncode in accepted, (
                f"runbook line {index + 1} exited {done.returncode}: {command}\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        assert serve is not None, "the runbook starts no servers"
    finally:
        stopped = serve.stop() if serve is not None else 0
    assert stopped == 0, f"serve did not stop cleanly on Ctrl-C ({stopped})"

    export = root / "outputs" / "validate" / "regen" / "export"
    for name in ("train.jsonl", "prompts.jsonl", "README.md", "counts.json"):
        assert (export / name).stat().st_size > 0, name
    assert (root / "outputs" / "validate" / "regen" / ".complete").exists()
    assert (root / "outputs" / "generate" / "regen" / ".complete").exists()
    recorded = yaml.safe_load((root / "outputs" / "generate" / "regen" / "parameters.yaml").read_text())
    # the names the runbook leaves to the servers, filled in from them
    assert recorded["model"] == values["model"] and recorded["tokenizer"] == values["model"]
    assert (
        root / "outputs" / "validate" / "smoke" / ".complete"
    ).exists()  # the smoke run passed its gate too


def test_a_readme_line_the_rules_no_longer_match_fails_before_anything_runs() -> None:
    """A runbook whose serve line lost its --gpus (or any other word a rule changes) is refused at once."""
    block = runbook(README.read_text())
    values = dict.fromkeys(("python", "port", "model", "prompts", "sample"), "x")
    substituted(block, values)  # the committed README: every rule applies
    broken = [command.replace("--gpus 0-6", "--gpu 0-6") for command in block]
    with pytest.raises(AssertionError, match=re.escape("['--gpus 0-6']")):
        substituted(broken, values)
