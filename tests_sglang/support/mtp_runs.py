"""The notebook runs on the hybrid MTP server (``tiny_qwen3_5``, served by ``draftgen serve`` with NEXTN 3/1/4).

One server, ``mtp``, started the production way (serve's default MTP flags, ``--reasoning-parser qwen3``) with what
the CPU needs after ``--``: ``CPU_ARGS`` plus ``HYBRID_ARGS``. The runs: the benchmark alone on it, then a
streamed ``turns: all`` generate with SGLang's token ids, validate on that folder, the estimate on the benchmark's
folder, and tune's race over two MTP settings on candidates of its own. Each function's docstring says why its
parameters differ from production, where they do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from notebook_runs import draftgen_run
from prompt_files import single_turn, three_turns, write_rows
from recording_proxy import RecordingProxy
from serve_runs import CPU_ARGS, SGLANG_PYTHON, ServeRun, free_ports

MTP_SERVED_MODEL = "tiny-qwen3.5-mtp"
# On the CPU SGLang 0.5.23 cannot take its own default for the hybrid: with the overlap schedule on, `auto`
# resolves the mamba radix cache to extra_buffer, whose state snapshots it supports on GPUs only ("extra_buffer
# requires platform support for Mamba cache state snapshots"). With the overlap schedule off, `auto` resolves to
# no_buffer. A small mamba state pool keeps each server's memory small, and makes it the batch cap (SGLang logs
# "max_running_requests is capped to 21 by the mamba state cache (max_mamba_cache_size=64, 3 state slots per
# request)"): the cap draftgen must read from the server.
HYBRID_ARGS = ("--disable-overlap-schedule", "--max-mamba-cache-size", "64")
MAMBA_CAPPED_RUNNING = 21  # 64 slots // 3 per request, what SGLang resolves from HYBRID_ARGS
# The shared server computes in float32 with float32 conv states (SGLang's default conv state is bf16,
# SGLANG_MAMBA_CONV_DTYPE), so its log-probabilities can be compared with transformers' to the last digits.
EXACT_HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
MTP_GREEDY = {"model": MTP_SERVED_MODEL, "temperature": 0.0, "top_p": 1.0, "request_timeout_s": 300.0}
MTP_BENCH_LEVELS = [1, 2]
MTP_BENCH_PER_LEVEL = 2
MTP_ANSWER_TOKENS = 13  # the designed answer after the thinking-on prompt, <|im_end|> included


@dataclass(frozen=True)
class MtpBenchmark:
    run_dir: Path
    proxy: RecordingProxy  # what the notebook sent and got, /metrics and /server_info included


def mtp_benchmark(draftgen: str, mtp: ServeRun, root: Path) -> MtpBenchmark:
    """benchmark.ipynb on the hybrid server through a recording proxy: thinking on, greedy, the designed answer
    (13 tokens in 4 verify steps). The caller stops the proxy."""
    proxy = RecordingProxy(mtp.url)
    proxy.start()
    prompts = write_rows(
        root / "prompts" / "mtp-bench.jsonl",
        single_turn("mtp-bench", 2 * len(MTP_BENCH_LEVELS) * MTP_BENCH_PER_LEVEL),
    )
    params = {
        **MTP_GREEDY,
        "servers": [proxy.url],
        "prompts": str(prompts),
        "max_tokens": 32,
        "enable_thinking": True,
        "concurrencies": MTP_BENCH_LEVELS,
        "num_prompts": MTP_BENCH_PER_LEVEL,
        "warmup_requests": 1,
    }
    return MtpBenchmark(draftgen_run(draftgen, "benchmark", root, "mtp", params), proxy)


@dataclass(frozen=True)
class MtpGenerate:
    run_dir: Path
    prompts: Path


def mtp_generate(draftgen: str, mtp: ServeRun, root: Path) -> MtpGenerate:
    """generate.ipynb on the hybrid server: streamed, ``turns: all`` over multi-turn rows beside single-turn ones,
    thinking on, SGLang's token ids for every turn; production guard thresholds (the designed answer stops)."""
    prompts = write_rows(
        root / "prompts" / "mtp-generate.jsonl", single_turn("mtp-single", 4) + three_turns("mtp-multi", 2)
    )
    params = {
        **MTP_GREEDY,
        "servers": [mtp.url],
        "prompts": str(prompts),
        "stream": True,
        "turns": "all",
        "enable_thinking": True,
        "max_tokens": 64,
        "concurrency_per_server": 3,
        "batch_save_size": 4,
    }
    return MtpGenerate(draftgen_run(draftgen, "generate", root, "mtp", params), prompts)


def mtp_validate(draftgen: str, run: MtpGenerate, tokenizer_dir: Path, root: Path) -> Path:
    """validate.ipynb on that folder with the hybrid's tokenizer (the Qwen3.5/3.6-style template) and the default
    trainer (SpecForge's qwen3.5 mask). ``min_assistant_tokens`` 4: the designed answer is 13 tokens."""
    params = {
        "generation_dir": str(run.run_dir),
        "tokenizer": str(tokenizer_dir),
        "enable_thinking": True,
        "export_tokens": True,
        "min_assistant_tokens": 4,
    }
    return draftgen_run(draftgen, "validate", root, "mtp", params)


def mtp_estimate(draftgen: str, bench: MtpBenchmark, prompts: Path, root: Path) -> Path:
    """estimate.ipynb on the hybrid benchmark's folder: seven servers (the GPU node's), a prompt file of the tier,
    few bootstrap resamples (the estimate's floor), no other fleets to compare."""
    params = {
        "benchmark_dir": str(bench.run_dir),
        "prompts": str(prompts),
        "gpus": 7,
        "concurrency_per_server": 2,
        "max_tokens": 64,
        "scenarios": [],
        "bootstrap": 10,
    }
    return draftgen_run(draftgen, "estimate", root, "mtp", params)


MTP_RACE = [[3, 1, 4], [2, 1, 3]]


def mtp_tune_params(hybrid: Path, start_timeout_s: float) -> dict:
    """tune.ipynb's race on the hybrid: NEXTN 3/1/4 against 2/1/3 (its MTP head, no draft model), started by
    tune's launcher one at a time (one GPU group: memory) with the CPU and hybrid arguments as ``extra_args``.
    One round of 8 requests a job (tune's floor), thinking on (the designed answer), no speculation-off candidate
    and no seeds' baseline (3/1/4 races itself). The mamba strategy is not raced: on the CPU SGLang allows
    no_buffer only."""
    return {
        "engine": "sglang",
        "model": str(hybrid),
        "gpus": "0-0",  # one group ("0" would reach tune as the number 0)
        "base_port": free_ports(1),
        "python": str(SGLANG_PYTHON),
        "extra_args": [*CPU_ARGS, *HYBRID_ARGS, "--dtype", "bfloat16"],
        "startup_timeout_s": start_timeout_s,
        "mtp_off": False,
        "speculative_algorithm": "NEXTN",
        "spec_candidates": MTP_RACE,
        "max_running_requests": [4],
        "concurrency": 2,
        "sample_size": 8,
        "max_tokens": 32,
        "temperature": 0.0,
        "top_p": 1.0,
        "enable_thinking": True,
        "rounds_per_job": 1.0,
        "max_rounds": 1,
        "warmup_requests": 1,
        "baseline": False,
        "bootstrap": 50,
        "request_timeout_s": 300.0,
    }


def mtp_tune(draftgen: str, hybrid: Path, root: Path, start_timeout_s: float) -> Path:
    return draftgen_run(draftgen, "tune", root, "mtp", mtp_tune_params(hybrid, start_timeout_s))
