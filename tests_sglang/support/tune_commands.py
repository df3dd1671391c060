"""Print, as JSON, every SGLang command ``draftgen tune`` would launch on the GPU node for a tune parameter file.

Run by the project's own interpreter (``.venv/bin/python``), not the SGLang venv: it imports draftgen and asks
tune's launcher (``draftgen.tune.launch.launch_spec``, the one tune itself uses) for the command of every candidate
of the file, the seeds' baseline too, on every GPU group, at ``--tp 1`` over 7 GPUs and at ``--tp 2`` over 6.
The SGLang tier parses each with SGLang's own argument parser (tests_sglang/test_server_args.py).

    python tune_commands.py params/tune.yaml  ->  [{"label": ..., "argv": [...]}, ...]
"""

from __future__ import annotations

import json
import sys

import yaml

from draftgen.params import build_config
from draftgen.tune.config import TuneConfig
from draftgen.tune.launch import launch_spec

LAYOUTS = ({"gpus": "0-6", "tp": 1}, {"gpus": "0-5", "tp": 2})  # the 7-GPU node; tp 2 leaves one GPU out


def commands(path: str) -> list[dict]:
    with open(path) as handle:
        values = yaml.safe_load(handle)
    out = []
    for layout in LAYOUTS:
        config = build_config(TuneConfig, {**values, **layout})
        candidates = [*config.candidates(), config.baseline_candidate(concurrency=48)]
        for candidate in candidates:
            for group in range(len(config.groups)):
                spec = launch_spec(config, candidate, group, run_name=f"{candidate.slug}-g{group}")
                out.append(
                    {"label": f"tune tp{config.tp} {candidate.label} group {group}", "argv": list(spec.argv)}
                )
    return out


if __name__ == "__main__":
    json.dump(commands(sys.argv[1]), sys.stdout)
