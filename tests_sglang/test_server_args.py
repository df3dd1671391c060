"""Every SGLang command draftgen would run on the GPU node, parsed by SGLang 0.5.23's own argument parser.

The commands come from draftgen itself: ``draftgen serve --dry-run`` (7 GPUs; ``--tp 2``; ``--no-mtp`` with a memory
fraction and a cap; ``--settings FILE`` written as ``draftgen tune`` writes them, NGRAM and STANDALONE ones too) and
tune's launcher for every candidate of ``params/tune.yaml`` and of a space with STANDALONE (a draft model) and NGRAM
candidates (support/tune_commands.py). Each is parsed with ``ServerArgs.add_cli_args`` and
built into ``ServerArgs`` as ``python -m sglang.launch_server`` does, and fails on anything SGLang rejects, any
warning it logs or raises while parsing (its retired flags log "... is deprecated ..."), and any flag whose help
text SGLang marks as deprecated. What does not run here: SGLang's resolution against the real model's config
(the 27B checkpoint is not on this machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MODEL = "/dev/shm/Qwen3.6-27B"
DRAFT = "/dev/shm/Qwen3-0.6B"  # STANDALONE's draft: a smaller model of the family
# A tune space with the algorithms the SGLang tier runs for real on the CPU (test_tune_sglang.py), as the GPU
# node would tune them: STANDALONE with a draft model (chain and tree) and NGRAM at two draft-token counts.
TUNE_OTHER_ALGORITHMS = {
    "engine": "sglang",
    "model": MODEL,
    "mtp_off": True,
    "speculative_algorithm": "STANDALONE",
    "speculative_draft_model_path": DRAFT,
    "spec_candidates": [[3, 1, 4], [2, 4, 8]],
    "ngram_draft_tokens": [4, 8],
    # the trained drafters beside them (DFLASH and EAGLE3 need a GPU to run; their commands still parse)
    "drafters": [
        {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": DRAFT, "block_sizes": [8, 16]},
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": DRAFT,
            "spec_candidates": [[3, 1, 4]],
        },
    ],
    "max_running_requests": [48, 96],
}
SETTINGS = {
    "mtp-4-1-5": "settings:\n  speculative_algorithm: NEXTN\n  speculative_num_steps: 4\n  speculative_eagle_topk: 1\n"
    "  speculative_num_draft_tokens: 5\n  max_running_requests: 96\n  mem_fraction_static: 0.85\n",
    "mtp-off": "settings:\n  speculative_algorithm: null\n  speculative_num_steps: null\n  speculative_eagle_topk: null\n"
    "  speculative_num_draft_tokens: null\n  max_running_requests: 128\n",
    "ngram-8": "settings:\n  speculative_algorithm: NGRAM\n  speculative_num_draft_tokens: 8\n  max_running_requests: 64\n",
    "dflash-8": "settings:\n  speculative_algorithm: DFLASH\n  speculative_num_draft_tokens: 8\n"
    f"  speculative_draft_model_path: {DRAFT}\n  max_running_requests: 64\n",
    "standalone-3-1-4": "settings:\n  speculative_algorithm: STANDALONE\n  speculative_num_steps: 3\n"
    "  speculative_eagle_topk: 1\n  speculative_num_draft_tokens: 4\n"
    f"  speculative_draft_model_path: {DRAFT}\n  max_running_requests: 48\n",
}
SERVE_VARIANTS = {
    "default (MTP on)": ["--gpus", "0-6"],
    "--tp 2": ["--gpus", "0-5", "--tp", "2"],
    "--no-mtp, memory, cap": [
        "--gpus",
        "0-6",
        "--no-mtp",
        "--mem-fraction",
        "0.85",
        "--max-running-requests",
        "64",
    ],
    "--settings mtp-4-1-5": ["--gpus", "0-6", "--settings", "{mtp-4-1-5}"],
    "--tp 2 --settings mtp-off": ["--gpus", "0-5", "--tp", "2", "--settings", "{mtp-off}"],
    "--settings ngram-8": ["--gpus", "0-6", "--settings", "{ngram-8}"],
    "--settings dflash-8": ["--gpus", "0-6", "--settings", "{dflash-8}"],
    "--tp 2 --settings standalone-3-1-4": ["--gpus", "0-5", "--tp", "2", "--settings", "{standalone-3-1-4}"],
}


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def sglang_problems(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """What SGLang's parser says about ``args``: errors, warnings, deprecated flags (empty when clean)."""
    from sglang.srt.server_args import ServerArgs

    problems = []
    handler = Captured()
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(sys.stdout):
            warnings.simplefilter("always")
            try:
                namespace = parser.parse_args(args)
                ServerArgs.from_cli_args(namespace)
            except (SystemExit, argparse.ArgumentError) as exc:
                problems.append(f"refused: {exc}")
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    problems += [
        f"logged {r.levelname}: {r.getMessage()}" for r in handler.records if r.levelno >= logging.WARNING
    ]
    problems += [f"warned: {w.category.__name__}: {w.message}" for w in caught]
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    for arg in args:
        action = by_flag.get(arg.split("=", 1)[0]) if arg.startswith("--") else None
        if action is not None and "deprecat" in (action.help or "").lower():
            problems.append(f"{arg} is marked deprecated by SGLang: {action.help}")
    return problems


def server_args_of(argv: list[str]) -> list[str]:
    assert argv[1:3] == ["-m", "sglang.launch_server"], argv
    return argv[3:]


def serve_commands(draftgen: str, tmp_path: Path) -> list[tuple[str, list[str]]]:
    files = {}
    for name, text in SETTINGS.items():
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(text)
    out = []
    for label, variant in SERVE_VARIANTS.items():
        variant = [files[a[1:-1]] if a.startswith("{") else a for a in variant]
        command = [draftgen, "serve", "--dry-run", "--model", MODEL, *map(str, variant)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        gpus = 7 if "0-6" in variant else 6
        tp = 2 if "--tp" in variant else 1
        assert len(lines) == gpus // tp, result.stdout
        for line in lines:
            words = shlex.split(line)
            while "=" in words[0] and not words[0].startswith("-"):
                words.pop(0)  # CUDA_VISIBLE_DEVICES=... PYTHONUNBUFFERED=1
            out.append((f"serve {label}", words))
    return out


def tune_commands(draftgen: str, params: Path) -> list[tuple[str, list[str]]]:
    python = str(Path(draftgen).with_name("python"))
    script = Path(__file__).resolve().parent / "support" / "tune_commands.py"
    result = subprocess.run([python, str(script), str(params)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [(c["label"], c["argv"]) for c in json.loads(result.stdout)]


def test_the_parser_catches_what_this_test_relies_on(sglang_parser):
    # The checks can fail: SGLang refuses a made-up flag and reports a flag it retired.
    assert any(
        "refused" in p for p in sglang_problems(sglang_parser, ["--model-path", "m", "--no-such-flag"])
    )
    assert any(
        "deprecated" in p
        for p in sglang_problems(sglang_parser, ["--model-path", "m", "--disable-cuda-graph"])
    )
    assert sglang_problems(sglang_parser, ["--model-path", "m", "--enable-flashinfer-allreduce-fusion"])
    assert sglang_problems(sglang_parser, ["--model-path", "m", "--tp-size", "2"]) == []


def test_every_serve_and_tune_command_for_the_gpu_node_parses_cleanly(sglang_parser, draftgen, tmp_path):
    other = tmp_path / "tune-other-algorithms.yaml"
    other.write_text(yaml.safe_dump(TUNE_OTHER_ALGORITHMS))
    commands = (
        serve_commands(draftgen, tmp_path)
        + tune_commands(draftgen, REPO / "params" / "tune.yaml")
        + tune_commands(draftgen, other)
    )
    labels = {label.split(" group")[0] for label, _ in commands}
    assert len(commands) > 200 and any("tp2" in label for label in labels), labels
    assert any("NGRAM 8 drafts" in label for label in labels) and any(
        "STANDALONE 2/4/8" in label for label in labels
    )
    assert any("DFLASH block 16" in label for label in labels) and any(
        "EAGLE3 3/1/4" in label for label in labels
    )
    assert any("--speculative-draft-model-path" in argv for _, argv in commands)
    failures = {}
    for label, argv in commands:
        problems = sglang_problems(sglang_parser, server_args_of(argv))
        if problems:
            failures.setdefault(" ".join(server_args_of(argv)[6:]), (label, problems))
    assert not failures, "\n".join(
        f"{label}: {args}\n    " + "\n    ".join(p) for args, (label, p) in failures.items()
    )


def _draftgen_python(draftgen: str, code: str) -> str:
    """Run ``code`` with draftgen's interpreter (draftgen is not installed in the SGLang venv)."""
    python = str(Path(draftgen).with_name("python"))
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_adaptive_candidates_are_what_sglang_runs_adaptively(sglang_parser, draftgen):
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.adaptive_spec_params import (
        adaptive_unsupported_reason,
        resolve_candidate_steps_from_config,
    )

    # SGLang resolves NEXTN to EAGLE before it decides on adaptive (arg_groups/speculative_hook.py); that step
    # needs the model's config, so the check below is asked with the alias already applied.
    def resolved(argv: list[str]) -> ServerArgs:
        args = ["EAGLE" if a == "NEXTN" else a for a in server_args_of(argv)]
        return ServerArgs.from_cli_args(sglang_parser.parse_args(args))

    adaptive = [
        (label, argv)
        for label, argv in tune_commands(draftgen, REPO / "params" / "tune.yaml")
        if "--speculative-adaptive" in argv
    ]
    assert adaptive and all("adaptive" in label for label, _ in adaptive), [label for label, _ in adaptive]
    for label, argv in adaptive:
        args = resolved(argv)
        assert args.speculative_adaptive and args.speculative_eagle_topk == 1, label
        assert args.speculative_num_steps in resolve_candidate_steps_from_config(), label
        assert adaptive_unsupported_reason(args) is None, label
    # draftgen's table of candidate steps is SGLang's default one
    ours = json.loads(
        _draftgen_python(
            draftgen,
            "import json; from draftgen.sglang_rules.adaptive import CANDIDATE_STEPS as s; print(json.dumps(s))",
        )
    )
    assert ours == resolve_candidate_steps_from_config()
    # where SGLang switches adaptive off, draftgen refuses the candidate with SGLang's own reason
    argv = [
        *("python", "-m", "sglang.launch_server", "--model-path", MODEL, "--speculative-algorithm", "NEXTN"),
        *(
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "2",
            "--speculative-num-draft-tokens",
            "6",
        ),
        "--speculative-adaptive",
    ]
    reason = adaptive_unsupported_reason(resolved(argv))
    assert reason == "speculative_eagle_topk=2 (only topk=1 is supported)"
    refusal = _draftgen_python(
        draftgen,
        "from draftgen.server_settings import ServerSettings, sglang_problems; "
        "print(sglang_problems(ServerSettings(speculative_num_steps=3, speculative_eagle_topk=2, "
        "speculative_num_draft_tokens=6, speculative_adaptive=True)))",
    )
    assert f"speculative_adaptive disabled: {reason}" in refusal


def test_dflash_refuses_this_cpu_with_the_reason_draftgen_gives(sglang_parser, draftgen):
    """DFLASH cannot run on this tier: SGLang's own check says why, and draftgen refuses it with the same words."""
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash
    from sglang.srt.server_args import ServerArgs

    argv = [
        *("--model-path", MODEL, "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8"),
        *("--speculative-draft-model-path", DRAFT, "--device", "cpu"),
    ]
    args = ServerArgs.from_cli_args(sglang_parser.parse_args(argv))
    with pytest.raises(ValueError) as refused:
        _handle_dflash(args)
    reason = str(refused.value)
    assert "DFLASH speculative decoding is not supported" in reason and "'cpu'" in reason
    ours = _draftgen_python(
        draftgen,
        "from draftgen.server_settings import ServerSettings, sglang_problems; "
        "print(sglang_problems(ServerSettings(speculative_algorithm='DFLASH', speculative_num_draft_tokens=8, "
        f"speculative_draft_model_path='{DRAFT}'), device='cpu'))",
    )
    assert reason in ours, (reason, ours)
