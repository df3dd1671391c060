"""What SGLang 0.5.23 itself resolves from serve's commands for the seven-GPU hybrid target, with its own config.

The model folder holds Qwen3.6-27B's public ``config.json`` (``QWEN3_6_27B``: architecture, text and vision
config; no weights, which resolution does not read). ``draftgen serve --dry-run --gpus 0-6`` writes the seven
commands the GPU node runs; each is parsed by SGLang's ``ServerArgs`` and resolved by its own pipeline
(``resolve_once``), on this CPU told the GPU node's facts (``override_platform``: CUDA, SM100 as a B200; ``--device
cuda``, which the node detects itself). Then the same command resolved for this CPU shows what differs here.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from test_server_args import _draftgen_python

TEXT_CONFIG = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "bos_token_id": 248044,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 17408,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 24,
    "num_hidden_layers": 64,
    "num_key_value_heads": 4,
    "output_gate_type": "swish",
    "pad_token_id": None,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_type": "default",
    },
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 248320,
}
QWEN3_6_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "language_model_only": False,
    "tie_word_embeddings": False,
    "text_config": TEXT_CONFIG,
    "vision_config": {
        "deepstack_visual_indexes": [],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "model_type": "qwen3_5",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 5120,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
GPU_NODE = {"is_cuda": True, "is_sm100": True, "is_blackwell": True}  # a B200
RESOLVED = (
    "device",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "mamba_radix_cache_strategy",
    "disable_overlap_schedule",
    "max_running_requests",
    "reasoning_parser",
)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("Qwen3.6-27B")
    (folder / "config.json").write_text(json.dumps(QWEN3_6_27B, indent=2))
    return folder


@pytest.fixture(scope="module")
def node_commands(draftgen, target) -> list[list[str]]:
    done = subprocess.run(
        [draftgen, "serve", "--dry-run", "--model", str(target), "--gpus", "0-6"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    commands = []
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # CUDA_VISIBLE_DEVICES=... PYTHONUNBUFFERED=1
        if words[1:3] == ["-m", "sglang.launch_server"]:
            commands.append(words[3:])
    return commands


def resolve(args: list[str], **platform) -> dict:
    """SGLang's own resolution of ``args``: its parser, then ``ServerArgs.resolve_once`` on the given platform."""
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(args))
    with override_platform(**platform):
        server_args.resolve_once()
        view = resolved_view(server_args)
        return {name: getattr(view, name) for name in RESOLVED}


def draftgens_defaults(draftgen: str) -> dict:
    """serve's default MTP settings as draftgen states them, the batch cap draftgen expects SGLang to set by itself
    with them (``sglang_cap``), and the requests generate keeps in flight per server (``in_flight``), which serve
    passes as the cap with MTP on (issue 46: SGLang's own would queue the rest)."""
    code = (
        "import json; from draftgen.server_settings import ServerSettings, batch_cap; "
        "from draftgen.defaults import CONCURRENCY_PER_SERVER; s = ServerSettings(); "
        "print(json.dumps({**s.model_dump(mode='json'), 'sglang_cap': batch_cap(s), "
        "'in_flight': CONCURRENCY_PER_SERVER}))"
    )
    return json.loads(_draftgen_python(draftgen, code))


def without(args: list[str], flag: str) -> list[str]:
    """``args`` without ``flag`` and its value."""
    at = args.index(flag)
    return [*args[:at], *args[at + 2 :]]


def test_the_gpu_node_resolves_serves_commands_as_draftgen_says(node_commands, draftgen):
    ours = draftgens_defaults(draftgen)
    assert len(node_commands) == 7

    # the seven differ in their port only (and CUDA_VISIBLE_DEVICES, set before the command): resolve each kind once
    distinct = {tuple(without(args, "--port")): args for args in node_commands}
    assert len(distinct) == 1, distinct
    for args in distinct.values():
        resolved = resolve([*args, "--device", "cuda"], **GPU_NODE)
        assert resolved == {
            "device": "cuda",
            "speculative_algorithm": "EAGLE",  # NEXTN is EAGLE with the model's own MTP head
            "speculative_num_steps": ours["speculative_num_steps"],
            "speculative_eagle_topk": ours["speculative_eagle_topk"],
            "speculative_num_draft_tokens": ours["speculative_num_draft_tokens"],
            "mamba_radix_cache_strategy": "extra_buffer",  # auto, with the overlap schedule on
            "disable_overlap_schedule": False,
            "max_running_requests": ours["in_flight"],  # serve's cap, kept as given
            "reasoning_parser": "qwen3",
        }, args
        # without serve's cap SGLang sets its own, which draftgen's rules state: too few for what generate sends
        own = resolve([*without(args, "--max-running-requests"), "--device", "cuda"], **GPU_NODE)
        assert own["max_running_requests"] == ours["sglang_cap"]
    assert ours["speculative_algorithm"] == "NEXTN" and ours["sglang_cap"] == 48 and ours["in_flight"] == 64


def test_on_this_cpu_sglang_refuses_its_own_default_and_resolves_no_buffer_without_overlap(node_commands):
    """SGLang 0.5.23 on a CPU: ``auto`` still picks extra_buffer (the overlap schedule is on), then refuses it
    (no state snapshots off GPUs); with the overlap schedule off it resolves no_buffer, which the tier runs."""
    command = [*node_commands[0], "--device", "cpu"]
    with pytest.raises(AssertionError, match="extra_buffer requires platform support for Mamba cache state"):
        resolve(command)
    with pytest.raises(AssertionError, match="extra_buffer requires platform support"):
        resolve([*command, "--mamba-radix-cache-strategy", "extra_buffer"])
    resolved = resolve([*command, "--disable-overlap-schedule"])
    assert (
        resolved["mamba_radix_cache_strategy"] == "no_buffer" and resolved["disable_overlap_schedule"] is True
    )
    assert (
        resolved["speculative_algorithm"] == "EAGLE" and resolved["max_running_requests"] == 64
    )  # serve's cap
