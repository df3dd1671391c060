"""Run draftgen's generate against one real server and print what its shards hold of the token ids, as JSON.

Run with the project's own interpreter (beside ``DRAFTGEN_BIN``): ``python generate_ids.py URL PROMPTS OUT_DIR``.
Prints {"engine_row", "servers", "rows": [{id, prompts (expanded per turn), outputs, prompt_tokens,
completion_tokens, reasoning, content, finish}]}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request

import polars as pl

from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.params import build_config
from draftgen.training.token_ids import expand


def main(url: str, prompts: str, out_dir: str) -> None:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as reply:
        model = json.loads(reply.read())["data"][0]["id"]
    config = build_config(
        GenerateConfig,
        {
            "servers": [url],
            "model": model,
            "prompts": prompts,
            "out_dir": out_dir,
            "max_tokens": 48,
            "temperature": 0.0,
            "concurrency_per_server": 2,
            "max_truncated_rate": 1.0,
            "canary": False,
            "hedge_slow_ratio": 0.0,
        },
    )

    async def go():
        plan = await preflight(config)
        await generate(config, plan, progress=False)
        return plan

    plan = asyncio.run(go())
    engine_row = next(c.detail for c in plan.checks if c.check == "engine")
    manifest = json.loads((__import__("pathlib").Path(out_dir) / "manifest.json").read_text())
    rows = []
    for row in pl.read_parquet(f"{out_dir}/shards").rows(named=True):
        rows.append(
            {
                "id": row["id"],
                "prompts": expand(row["turn_prompt_shared"], row["turn_prompt_ids"], row["turn_output_ids"]),
                "outputs": row["turn_output_ids"],
                "prompt_tokens": row["turn_prompt_tokens"],
                "completion_tokens": row["turn_completion_tokens"],
                "reasoning": row["turn_reasoning"],
                "content": row["turn_content"],
                "finish": row["turn_finish_reason"],
                "messages": row["messages"],
                "turn_after": row["turn_after"],
            }
        )
    print(
        json.dumps({"engine_row": engine_row, "servers": manifest["sessions"][-1]["servers"], "rows": rows})
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
