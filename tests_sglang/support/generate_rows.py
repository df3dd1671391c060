"""Run draftgen's generate (preflight, then one session) and print the stored rows' per-turn columns, as JSON.

Run with the project's own interpreter (beside ``DRAFTGEN_BIN``): ``python generate_rows.py PARAMS_JSON``, where
PARAMS_JSON is generate's parameters (``servers``, ``model``, ``prompts``, ``out_dir``, ...). Prints
{"servers": the manifest's servers, "rows": [{id, response_id, server, turn_server, turn_spec_verify_ct,
turn_completion_tokens, turn_drafts_histogram, turn_after}]}. No kernel: seconds, where ``draftgen run`` takes a
notebook's start.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import polars as pl

from draftgen.generate import GenerateConfig, generate, preflight
from draftgen.params import build_config

COLUMNS = (
    "id",
    "response_id",
    "server",
    "turn_after",
    "turn_server",
    "turn_spec_verify_ct",
    "turn_completion_tokens",
    "turn_finish_reason",
    "turn_drafts_histogram",
)


def main(params: str) -> None:
    config = build_config(GenerateConfig, json.loads(params))

    async def go() -> None:
        plan = await preflight(config)
        await generate(config, plan, progress=False)

    asyncio.run(go())
    out = Path(config.out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    rows = pl.read_parquet(out / "shards").select(COLUMNS).to_dicts()
    print(json.dumps({"servers": manifest["sessions"][-1]["servers"], "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1])
