"""Figure 30: two answers per prompt (a sampling plan's ``answers: 2``) as separate requests vs SGLang's ``n=2``.

The same prompts on a simulated fleet (``b200-mtp``, the prefix cache on as SGLang's is by default; a fresh fleet
per run, so no run finds another's prompts cached), three ways, each a pull-based loop like generate's dispatch
(every server keeps its batch cap of answers in flight, fed from one shared queue):

  * ``separate``: each answer its own request (what draftgen sends): the two answers of a prompt are next to
    each other in the queue and go to whichever server frees a slot first;
  * ``n=2``: one request per prompt with ``n: 2`` (half as many in flight, the same number of answers): SGLang
    prefills the prompt alone, then runs the two copies on the cached prefix;
  * ``same server``: each answer its own request, both on one server, the second sent once the first has
    streamed its first token (its prompt is then in that server's cache): ``n``'s saving without ``n``.

Every answer is ``--answer-tokens`` long (``ignore_eos``; the default is b200-mtp's mean completion), so the arms
do the same decode work and differ only in prefill. Two prompt sets: the bundled prompts, and the same prompts
each behind a pasted document of about ``--long-tokens`` tokens (prefill grows with the prompt).

Printed per arm, on the simulated clock: wall time (first request → last answer); the GPU's busy time (every
server's step times summed, from the simulators' own ledger: decode steps and the prefills they carry); the
prefill part of it from the ground truth (prompt tokens not found in the cache, and their seconds, also as a
share of the busy time); how many answers found their prompt cached; and the ratios to ``separate`` measured in
the same run. Busy time and prefill come from the simulators' bookkeeping, so they hold on a loaded machine;
wall time does not: ``clock_kept`` is the servers' planned ÷ actual step time (1.0: on time).

    .venv/bin/python benchmarks/plan_n_vs_separate.py [--servers 2] [--speed 10] [--prompts 150]
        [--long-tokens 8000] [--answer-tokens 1920] [--sets bundled,long]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from generate_tail_hedge import clock_kept, sim_clocks

from draftgen.client.sse import SseDecoder
from draftgen.prompts.synthetic import BUNDLED_PROMPTS
from draftgen.sampling_plan import sample_seed
from draftgen.sim import SimFleet
from draftgen.sim.profiles import get_profile
from draftgen.sim.tokenizer import SimTokenizer, default_tokenizer

PROFILE = "b200-mtp"
ARMS = ("separate", "n=2", "same server")


def document(index: int, tokenizer: SimTokenizer, tokens: int) -> str:
    """A pasted document of about ``tokens`` tokens, its own from the first line on (no prefix shared)."""
    lines, count = [], 0
    while count < tokens:
        line = f"doc{index} line {len(lines)}: reading {len(lines) * 7 % 101} at station {len(lines) % 13}."
        lines.append(line)
        count += len(tokenizer.encode(line)) + 1
    return "\n".join(lines)


def prompt_sets(tokenizer: SimTokenizer, count: int, long_tokens: int) -> dict[str, list[dict]]:
    rows = [json.loads(line) for line in BUNDLED_PROMPTS.read_text().splitlines()[:count]]
    long_rows = []
    for i, row in enumerate(rows):
        messages = [dict(m) for m in row["messages"]]
        last = max(k for k, m in enumerate(messages) if m["role"] == "user")
        messages[last]["content"] = f"{document(i, tokenizer, long_tokens)}\n\n{messages[last]['content']}"
        long_rows.append({"id": row["id"], "messages": messages})
    return {"bundled": rows, "long": long_rows}


def body(row: dict, answer_tokens: int, sample: int, **extra: object) -> dict:
    return {
        "model": "sim",
        "messages": row["messages"],
        "max_tokens": answer_tokens,
        "ignore_eos": True,
        "seed": sample_seed(f"{row['id']}#s{sample}"),  # as generate sends a plan's samples
        **extra,
    }


async def post(session: aiohttp.ClientSession, url: str, payload: dict) -> dict:
    async with session.post(f"{url}/v1/chat/completions", json=payload) as response:
        reply = await response.json()
        assert response.status == 200, reply
        return reply


async def same_server(session: aiohttp.ClientSession, url: str, row: dict, answer_tokens: int) -> None:
    """Answer 0 streamed; answer 1 sent once answer 0's first token arrives (its prefill is done)."""
    second: asyncio.Task | None = None
    async with session.post(
        f"{url}/v1/chat/completions", json=body(row, answer_tokens, 0, stream=True)
    ) as response:
        assert response.status == 200
        decoder = SseDecoder()
        async for chunk in response.content.iter_any():
            for event in decoder.feed(chunk):
                if second is None and event.data != "[DONE]":
                    choices = json.loads(event.data).get("choices") or [{}]
                    delta = choices[0].get("delta") or {}
                    if delta.get("reasoning_content") or delta.get("content"):
                        second = asyncio.create_task(post(session, url, body(row, answer_tokens, 1)))
    assert second is not None
    await second


def work(arm: str, rows: list[dict]) -> Iterator[tuple[dict, int]]:
    """The shared queue: (prompt, sample) per answer for ``separate``, (prompt, -1) per prompt otherwise."""
    for row in rows:
        if arm == "separate":
            yield from ((row, 0), (row, 1))
        else:
            yield row, -1


async def run_arm(urls: list[str], rows: list[dict], arm: str, cap: int, answer_tokens: int) -> None:
    queue: asyncio.Queue[tuple[dict, int]] = asyncio.Queue()
    for item in work(arm, rows):
        queue.put_nowait(item)
    per_server = cap if arm == "separate" else cap // 2  # the same answers in flight

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        while not queue.empty():
            row, sample = queue.get_nowait()
            if arm == "separate":
                await post(session, url, body(row, answer_tokens, sample))
            elif arm == "n=2":
                reply = await post(session, url, body(row, answer_tokens, 0, n=2))
                assert [c["index"] for c in reply["choices"]] == [0, 1]
            else:
                await same_server(session, url, row, answer_tokens)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        # interleaved, so the queue's first items go to different servers, as with generate
        await asyncio.gather(*(worker(session, url) for _ in range(per_server) for url in urls))


def measure(fleet: SimFleet, started: float, ended: float, clocks: tuple[list, list], speed: float) -> dict:
    """The run's figures from the ground truth and the servers' step ledger, on the simulated clock."""
    profile = get_profile(PROFILE)
    records = [
        r
        for r in fleet.truth()
        if r.get("kind") in ("chat", "prefill")
        and r.get("outcome") == "ok"
        and started <= r["arrival"] <= ended
    ]
    answers = [r for r in records if r["kind"] == "chat"]
    uncached = [r["prompt_tokens"] - r["cached_tokens"] for r in records]
    prefill_s = sum(profile.prefill_seconds(tokens) for tokens in uncached)
    before, after = clocks
    busy_s = sum(a["planned_s"] - b["planned_s"] for b, a in zip(before, after, strict=True)) * speed
    return {
        "wall_s": round((ended - started) * speed, 1),
        "gpu_busy_s": round(busy_s, 1),
        "answers": len(answers),
        "completion_tokens": sum(r["completion_tokens"] for r in answers),
        "prefill_tokens": sum(uncached),
        "prefill_s": round(prefill_s, 2),
        "prefill_share_of_busy": round(prefill_s / busy_s, 4),
        "answers_cached": sum(r["cached_tokens"] > 0 for r in answers),
        "clock_kept": round(clock_kept(before, after), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--speed", type=float, default=10.0, help="simulated clock speed-up")
    parser.add_argument("--prompts", type=int, default=150, help="per set (2 answers each)")
    parser.add_argument("--long-tokens", type=int, default=8000, help="pasted document per long prompt")
    parser.add_argument("--answer-tokens", type=int, default=1920, help="every answer's length")
    parser.add_argument("--sets", default="bundled,long", help="the prompt sets to run, comma-separated")
    args = parser.parse_args()
    cap = get_profile(PROFILE).max_running_requests
    results = []
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp_name:
        tmp = Path(tmp_name)
        tokenizer_dir = default_tokenizer(tmp / "tokenizer")
        tokenizer = SimTokenizer(tokenizer_dir)
        sets = prompt_sets(tokenizer, args.prompts, args.long_tokens)
        print(
            f"{args.servers} x {PROFILE} (speed {args.speed:g}, prefix cache on, a fresh fleet per run), "
            f"{args.prompts} prompts x 2 answers of {args.answer_tokens} tokens per set, {cap} answers in flight "
            "per server",
            flush=True,
        )
        for name in args.sets.split(","):
            rows = sets[name]
            lengths = sorted(len(tokenizer.encode(tokenizer.render(r["messages"], True))) for r in rows)
            print(
                f"{name} prompts: tokens median {lengths[len(lengths) // 2]}, max {lengths[-1]}", flush=True
            )
            base = None
            for arm in ARMS:
                fleet = SimFleet(
                    servers=args.servers,
                    profile=PROFILE,
                    speed=args.speed,
                    tokenizer=tokenizer_dir,
                    work_dir=tmp / f"sim-{len(results)}",
                )
                with fleet:  # empty caches: no run finds another's prompts
                    before = sim_clocks(fleet)
                    started = time.time()
                    asyncio.run(run_arm(fleet.urls, rows, arm, cap, args.answer_tokens))
                    ended = time.time()
                    time.sleep(0.5)  # the last truth lines
                    clocks = (before, sim_clocks(fleet))
                    row = {"set": name, "arm": arm, **measure(fleet, started, ended, clocks, args.speed)}
                base = base or row
                for key in ("wall_s", "gpu_busy_s", "prefill_tokens"):
                    row[f"{key}_ratio"] = round(row[key] / base[key], 3)
                results.append(row)
                print(
                    f"  {arm:12} wall {row['wall_s']:7.1f} s ({row['wall_s_ratio']:.3f}), GPU busy "
                    f"{row['gpu_busy_s']:7.1f} s ({row['gpu_busy_s_ratio']:.3f}); prefill "
                    f"{row['prefill_tokens']:9,} tokens ({row['prefill_tokens_ratio']:.3f}), "
                    f"{row['prefill_s']:.1f} s = {row['prefill_share_of_busy']:.2%} of busy; "
                    f"{row['answers_cached']}/{row['answers']} answers found their prompt cached; "
                    f"clock kept {row['clock_kept']:.2f}",
                    flush=True,
                )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
