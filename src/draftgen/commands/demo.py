"""``draftgen demo``: the README's first command. Brings up a simulated 7-server fleet and runs the pipeline."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from openai import AsyncOpenAI

from draftgen.sim.fleet import SimFleet
from draftgen.synthetic import BUNDLED_PROMPTS


def add_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole job on a simulated 7-server fleet and the bundled synthetic prompts",
        description="Start a simulated 7-GPU fleet, run the pipeline on bundled prompts, write outputs/demo/.",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("outputs/demo"), help="output folder (default outputs/demo)"
    )
    parser.add_argument("--servers", type=int, default=7)
    parser.add_argument("--speed", type=float, default=20.0, help="simulated clock speed-up (default 20x)")
    parser.add_argument("--requests", type=int, default=14, help="requests to send in the smoke step")
    parser.set_defaults(handler=run)


async def _smoke(urls: list[str], prompts: list[dict], max_tokens: int) -> list[dict]:
    clients = [AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=120) for url in urls]
    try:

        async def one(index: int, row: dict) -> dict:
            client = clients[index % len(clients)]
            started = time.perf_counter()
            reply = await client.chat.completions.create(
                model="Qwen/Qwen3.6-27B",
                messages=row["messages"],
                max_tokens=max_tokens,
                temperature=0.6,
                top_p=0.95,
                extra_body={"chat_template_kwargs": {"enable_thinking": True}},
            )
            message = reply.choices[0].message
            return {
                "id": row["id"],
                "server": urls[index % len(urls)],
                "finish_reason": reply.choices[0].finish_reason,
                "completion_tokens": reply.usage.completion_tokens if reply.usage else None,
                "reasoning_chars": len(getattr(message, "reasoning_content", None) or ""),
                "answer_chars": len(message.content or ""),
                "latency_s": time.perf_counter() - started,
            }

        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(prompts))))
    finally:
        for client in clients:
            await client.close()


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = [
        json.loads(line) for _, line in zip(range(args.requests), BUNDLED_PROMPTS.open(), strict=False)
    ]
    with SimFleet(servers=args.servers, speed=args.speed, work_dir=args.out / "sim") as fleet:
        print(f"simulated fleet healthy: {', '.join(fleet.urls)}")
        started = time.perf_counter()
        rows = asyncio.run(_smoke(fleet.urls, prompts, max_tokens=1024))
        elapsed = time.perf_counter() - started
    tokens = sum(r["completion_tokens"] or 0 for r in rows)
    print(
        f"{len(rows)} requests, {tokens} completion tokens in {elapsed:.1f}s wall ({args.speed:g}x simulated clock)"
    )
    for row in rows:
        print(
            f"  {row['id']}  {row['server']}  {row['finish_reason']:<6}  {row['completion_tokens']:>5} tok  "
            f"reasoning {row['reasoning_chars']:>5} chars  answer {row['answer_chars']:>5} chars"
        )
    (args.out / "smoke.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.out / 'smoke.json'}")
    return 0
