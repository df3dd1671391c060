"""What top-k logprobs cost, against the same requests without them: bytes on the wire, client CPU, server speed.

The same chat requests (greedy, thinking on, ``max_tokens`` each) go to one server with logprobs off and with
``logprobs: true`` at ``top_logprobs`` 0, 5 and 20, streamed and whole, in rounds (each round runs every setting
once, in a rotated order, so a slow spell of a shared machine falls on all of them). Per setting:

* **bytes per token**: the response body's bytes (the SSE stream's, or the JSON's) over the completion tokens;
* **client CPU per token**: draftgen's own reading of those recorded bodies, replayed in this process — a stream
  through ``SseDecoder`` and ``ChatAccumulator`` (loop check on, as generate runs), a whole answer through the
  openai SDK's model and ``ChatAccumulator.add_response``, as ``ServerClient.chat`` reads them — CPU time over
  tokens; ``+entropy`` adds what storing a per-turn entropy summary costs on top (``client.entropy``);
* **server tok/s**: completion tokens over the wall time of the setting's requests in each round (``--concurrency``
  in flight), summed over the rounds;
* **server CPU per token**, read from /proc around each setting's requests, over their tokens (a server on this
  machine only): the process listening on the server's port (SGLang's tokenizer manager and HTTP server, where the
  logprobs are detokenized, built into the answer's objects and written out: the figure that carries to a GPU
  node, whose CPU does the same work; the simulator: its one process) and, apart, what it started (SGLang's
  scheduler, which on this CPU also runs the model, and detokenizer).

Each figure is printed with its ratio to logprobs off in the same mode, measured in the same run.

    .venv/bin/python benchmarks/logprobs_cost.py                       # draftgen sim (b200-mtp, speed 20)
    .venv/bin/python benchmarks/logprobs_cost.py --sglang              # real SGLang 0.5.23 on this CPU (NGRAM)
    .venv/bin/python benchmarks/logprobs_cost.py --url URL --model M   # any running OpenAI-compatible server

``--sglang`` needs ``make .venv-sglang/.installed-stamp``: it runs tests_sglang/support/serve_one.py with the tier's
interpreter (the tier's random tiny Qwen3, NGRAM speculation, float32) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from openai._models import construct_type
from openai.types.chat import ChatCompletion

from draftgen.client.loops import LoopRule
from draftgen.client.sse import SseDecoder
from draftgen.client.stream import ChatAccumulator
from draftgen.sim import SimFleet

REPO = Path(__file__).resolve().parents[1]
SETTINGS = (None, 0, 5, 20)  # top_logprobs; None: logprobs off
PROMPTS = [f"Question {i}: tell me about the weather, the sea and the mountains in detail." for i in range(8)]


@dataclass
class Setting:
    stream: bool
    top: int | None

    @property
    def name(self) -> str:
        how = "streamed" if self.stream else "whole"
        return f"{how}, logprobs off" if self.top is None else f"{how}, top_logprobs {self.top}"


@dataclass
class Measured:
    bodies: list[bytes] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    front_cpu_s: float = 0.0  # the listening process (SGLang's tokenizer manager)
    back_cpu_s: float = 0.0  # its children (SGLang's scheduler and detokenizer)


def server_processes(url: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """([the process listening on ``url``'s port], its descendants); both empty when the server is elsewhere."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            listener = psutil.Process(connection.pid)
            return [listener], listener.children(recursive=True)
    return [], []


def cpu_of(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def body(model: str, prompt: str, max_tokens: int, setting: Setting) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    if setting.stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    if setting.top is not None:
        request |= {"logprobs": True, "top_logprobs": setting.top}
    return request


def completion_tokens(raw: bytes, stream: bool) -> int:
    if not stream:
        return json.loads(raw)["usage"]["completion_tokens"]
    usage = [
        json.loads(e.data)["usage"]
        for e in SseDecoder().feed(raw)
        if e.data != "[DONE]" and json.loads(e.data).get("usage")
    ]
    return usage[-1]["completion_tokens"]


async def one_round(url: str, model: str, max_tokens: int, setting: Setting, concurrency: int) -> Measured:
    measured = Measured()
    queue: asyncio.Queue[str] = asyncio.Queue()
    for prompt in PROMPTS:
        queue.put_nowait(prompt)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            prompt = queue.get_nowait()
            async with session.post(
                f"{url}/v1/chat/completions", json=body(model, prompt, max_tokens, setting)
            ) as r:
                raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{setting.name}: HTTP {r.status}: {raw[:300]!r}")
            measured.bodies.append(raw)
            measured.tokens += completion_tokens(raw, setting.stream)

    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        measured.wall_s = time.perf_counter() - started
    return measured


def read_as_draftgen(raw: bytes, stream: bool, entropy: bool) -> None:
    """One recorded body through the code generate runs on it (ServerClient.chat / stream_chat)."""
    answer = ChatAccumulator("bench", stream=stream, loop_rule=LoopRule(), entropy=entropy)
    if stream:
        for event in SseDecoder().feed(raw):
            answer.add_event(event)
    else:
        reply = construct_type(type_=ChatCompletion, value=json.loads(raw))
        answer.add_response(reply.model_dump(warnings=False))
    answer.result()


def client_cpu_per_token(measured: Measured, stream: bool, entropy: bool, repeat: int) -> float:
    """CPU seconds per token of reading the recorded bodies, the median of ``repeat`` passes after one unmeasured
    (imports, the SDK's model classes built on first use)."""
    for raw in measured.bodies:
        read_as_draftgen(raw, stream, entropy)
    passes = []
    for _ in range(repeat):
        started = time.process_time()
        for raw in measured.bodies:
            read_as_draftgen(raw, stream, entropy)
        passes.append((time.process_time() - started) / measured.tokens)
    return statistics.median(passes)


def off_name(setting: Setting) -> str:
    return Setting(setting.stream, None).name


def measure(url: str, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = [Setting(stream, top) for stream in (True, False) for top in SETTINGS]
    totals = {s.name: Measured() for s in settings}
    front, back = server_processes(url)
    for round_index in range(args.rounds):
        shift = round_index % len(settings)
        for setting in settings[shift:] + settings[:shift]:
            front_before, back_before = cpu_of(front), cpu_of(back)
            got = asyncio.run(one_round(url, model, args.max_tokens, setting, args.concurrency))
            total = totals[setting.name]
            total.bodies += got.bodies
            total.tokens += got.tokens
            total.wall_s += got.wall_s
            total.front_cpu_s += cpu_of(front) - front_before
            total.back_cpu_s += cpu_of(back) - back_before
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    rows = []
    cpus = {s.name: client_cpu_per_token(totals[s.name], s.stream, False, args.repeat) for s in settings}
    for setting in settings:
        total = totals[setting.name]
        off = totals[off_name(setting)]
        cpu, cpu_off = cpus[setting.name], cpus[off_name(setting)]
        row = {
            "setting": setting.name,
            "tokens": total.tokens,
            "bytes_per_token": sum(map(len, total.bodies)) / total.tokens,
            "bytes_ratio": (sum(map(len, total.bodies)) / total.tokens)
            / (sum(map(len, off.bodies)) / off.tokens),
            "client_us_per_token": cpu * 1e6,
            "client_ratio": cpu / cpu_off,
            "server_tok_s": total.tokens / total.wall_s,
            "server_ratio": (total.tokens / total.wall_s) / (off.tokens / off.wall_s),
            "front_us_per_token": total.front_cpu_s / total.tokens * 1e6 if front else None,
            "front_ratio": (total.front_cpu_s / total.tokens) / (off.front_cpu_s / off.tokens)
            if front and off.front_cpu_s
            else None,
            "back_us_per_token": total.back_cpu_s / total.tokens * 1e6 if back else None,
        }
        if setting.top:
            with_entropy = client_cpu_per_token(total, setting.stream, True, args.repeat)
            row["entropy_us_per_token"] = with_entropy * 1e6
            row["entropy_ratio"] = with_entropy / cpu_off
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], server: str) -> None:
    print(f"\n{server}")
    print(
        f"{'setting':<28} {'tokens':>7} {'bytes/tok':>10} {'×off':>6} {'client µs/tok':>14} {'×off':>6} "
        f"{'+entropy µs':>12} {'×off':>6} {'server tok/s':>13} {'×off':>6} {'front µs/tok':>13} {'×off':>6} "
        f"{'back µs/tok':>12}"
    )
    for r in rows:
        entropy = (
            f"{r['entropy_us_per_token']:>12.1f} {r['entropy_ratio']:>6.2f}"
            if "entropy_ratio" in r
            else " " * 19
        )
        cpu = (
            f"{r['front_us_per_token']:>13.0f} {r['front_ratio']:>6.2f} "
            + (f"{r['back_us_per_token']:>12.0f}" if r["back_us_per_token"] is not None else f"{'–':>12}")
            if r["front_ratio"] is not None
            else f"{'(elsewhere)':>13}"
        )
        print(
            f"{r['setting']:<28} {r['tokens']:>7} {r['bytes_per_token']:>10.0f} {r['bytes_ratio']:>6.2f} "
            f"{r['client_us_per_token']:>14.1f} {r['client_ratio']:>6.2f} {entropy} "
            f"{r['server_tok_s']:>13.1f} {r['server_ratio']:>6.2f} {cpu}"
        )


@contextmanager
def sim_server(speed: float):
    with tempfile.TemporaryDirectory() as work:
        fleet = SimFleet(servers=1, profile="b200-mtp", speed=speed, work_dir=Path(work))
        fleet.start()
        try:
            yield fleet.urls[0], "Qwen/Qwen3.6-27B", f"draftgen sim (b200-mtp, speed {speed:g})"
        finally:
            fleet.cleanup()


@contextmanager
def sglang_server(spec: str):
    python = REPO / ".venv-sglang" / "bin" / "python"
    if not python.exists():
        raise SystemExit("no .venv-sglang: make .venv-sglang/.installed-stamp first")
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.Popen(
            [str(python), str(REPO / "tests_sglang/support/serve_one.py"), work, "--spec", spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line:
                raise SystemExit(f"serve_one.py ended without a server (exit {proc.wait()})")
            ready = json.loads(line)
            yield (
                ready["url"],
                ready["model"],
                f"SGLang 0.5.23 on this CPU ({spec}, the tier's random tiny Qwen3)",
            )
        finally:
            if proc.stdin:
                proc.stdin.close()  # serve_one stops serve and every SGLang process
            proc.wait(timeout=180)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sglang", action="store_true", help="start real SGLang 0.5.23 (the tier's venv)")
    where.add_argument("--url", help="a running server's base URL (with --model)")
    parser.add_argument("--model", default=None, help="the served model name, with --url")
    parser.add_argument(
        "--spec", default="ngram", choices=("ngram", "standalone", "none"), help="with --sglang"
    )
    parser.add_argument("--speed", type=float, default=20.0, help="the simulator's clock (default 20)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5, help="replays of the recorded bodies for client CPU")
    args = parser.parse_args()
    if args.url:
        server = contextmanager(lambda: iter([(args.url, args.model or "default", args.url)]))()
    elif args.sglang:
        server = sglang_server(args.spec)
    else:
        server = sim_server(args.speed)
    with server as (url, model, label):
        rows = measure(url, model, args)
    print_table(
        rows,
        f"{label}: {len(PROMPTS)} prompts × {args.rounds} rounds, max_tokens {args.max_tokens}, "
        f"{args.concurrency} in flight",
    )


if __name__ == "__main__":
    main()
