"""A tiny random-weight Qwen3 model folder, built in seconds with nothing downloaded.

The tokenizer is draftgen's own (``build_tiny_tokenizer``: a byte-level BPE trained on the bundled prompts, with
Qwen3's special tokens and our Qwen3-format chat template); the weights are random (seeded), two layers of width
64. Real servers load it like any Hugging Face checkpoint. Its text is noise: it never closes ``</think>`` on its
own and rarely stops before ``max_tokens``. Greedy decoding falls into loops, which is what n-gram speculative
decoding needs to have drafts accepted.

Like Qwen3's own checkpoints, generation_config.json asks for sampling (do_sample, temperature 0.6, top_p 0.95):
``transformers serve`` samples only when the checkpoint says so (a request's temperature alone stays greedy).
It also suppresses ``<|im_end|>``, so sampled noise never ends a turn early (an empty answer would rightly fail
generate's canary, making the tier flaky). Unlike Qwen3's, it sets no top_k: vLLM applies the checkpoint's top_k to every request, and vLLM 0.32.0's CPU
build with n-gram speculative decoding kills its engine on a request with top_k (EngineDeadError).
"""

from __future__ import annotations

from pathlib import Path

from draftgen.training.local_tokenizer import IM_END, build_tiny_tokenizer

SEED = 0
HIDDEN = 64
LAYERS = 2


def build_tiny_qwen3(out: Path) -> Path:
    """Write tokenizer + config + bf16 safetensors of a tiny Qwen3 into ``out`` (a new or empty folder)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    folder = build_tiny_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=HIDDEN,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    # suppress_tokens: noise must not end a turn after a blank line (an empty answer fails the canary, as it
    # should on a real model); transformers serve honours it, vLLM never stops early here anyway.
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        eos_token_id=config.eos_token_id,
        suppress_tokens=[config.eos_token_id],
    )
    model.save_pretrained(folder)
    return folder
