"""A tiny model of the target's own kind, built at test time: a ``qwen3_5`` hybrid with its own MTP head.

Qwen3.6-27B's text model (``Qwen3_5ForConditionalGeneration``'s ``text_config``, public ``config.json``) is 64
layers of ``16 x (3 x Gated DeltaNet, 1 x gated full attention)``, hidden 5120, 16 key / 48 value linear-attention
heads of 128, 24 / 4 attention heads of 256 with an output gate, rotary on a quarter of each head
(``partial_rotary_factor`` 0.25, interleaved M-RoPE), Gemma-style RMS norms (``1 + weight``), float32 SSM state,
and one MTP layer (``mtp_num_hidden_layers`` 1) sharing the embedding and LM head. This checkpoint keeps every one of
those structural facts at toy size: one block of the pattern (3 Gated DeltaNet layers, then full attention;
``full_attention_interval`` 4), hidden 64, 2 key / 6 value heads (the real 1:3 ratio) of 16, 4 / 2 attention heads
of 32, the MTP layer, Qwen3's vocabulary (draftgen's ``--vocab qwen3`` tokenizer, 151,936 rows) and a
Qwen3.5/3.6-style chat template (``tests/qwen35_style_template.jinja``, the one validate's trainer masks are tested
with). It is ``Qwen3_5ForCausalLM``, the text-only entry SGLang serves with ``Qwen3_5ForCausalLMMTP`` as NEXTN's draft.

Weights, designed so that both answers are known:

* **the main model** is the dense tier's bigram chain (``tiny_qwen3.designed_chain``: one-hot embeddings, the
  successor's LM-head row, every other token -> ``<|im_end|>``) through the final norm; greedy decoding answers
  ``Designed reasoning, fixed</think>\\n\\nThe answer is forty-two.<|im_end|>``. The MLPs add nothing (zero
  ``down_proj``), but the Gated DeltaNet and attention layers add a small seeded random term (``MIXER_OUT_SCALE``) that
  depends on the whole context through their state and the KV cache: too small to change any greedy choice, large
  enough that each token's log-probability shows whether SGLang (and our CPU ops) computed those layers as
  transformers does.
* **the MTP head** predicts the next chain token from the current token's embedding alone (``fc`` passes the
  embedding half and drops the target's hidden state; its layer adds nothing), except at every
  ``DRAFT_MISS_EVERY``-th chain position, where it proposes ``<|im_end|>``: drafts are accepted often, not always,
  and ``designed_verify_steps`` says exactly how many verify steps an answer takes.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from tiny_qwen3 import DEFAULT_DIM, IM_END, VOCAB, designed_chain

TEMPLATE = Path(__file__).resolve().parents[2] / "tests" / "qwen35_style_template.jinja"
HIDDEN = 64
LINEAR_KEY_HEADS, LINEAR_VALUE_HEADS, LINEAR_HEAD_DIM = 2, 6, 16
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
MROPE_SECTION = [2, 1, 1]  # halves of the 8 rotary dims (head_dim 32 x 0.25), as the real [11, 11, 10] of 64
MIXER_SCALE = 0.15  # the GDN and attention layers' input projections and conv: q, k, v, gates of order 1
MIXER_OUT_SCALE = (
    0.01  # their output projections: each adds a residual term of norm ~0.2 (the embedding's is 1)
)
# GDN decay exp(g), g = -exp(A_log) softplus(a + dt_bias): A in [0.02, 0.2] and dt_bias -2 keep it near 0.99, so
# each layer's state remembers the whole prompt (the real model's initialisation forgets within a few tokens)
A_RANGE, DT_BIAS = (0.02, 0.2), -2.0
DRAFT_MISS_EVERY = 4  # at most 3 drafts in a row accepted: 3/1/4 accepts more than 2/1/3
MIXER_SEED = 2026
SPEC_STEPS = 3  # NEXTN 3/1/4, draftgen serve's default MTP settings


def config_dict(tokenizer) -> dict:
    """The ``config.json`` of the tiny hybrid (Qwen3.6-27B's ``text_config`` keys, toy sizes)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": len(LAYER_TYPES),
        "layer_types": LAYER_TYPES,
        "full_attention_interval": 4,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": LINEAR_KEY_HEADS,
        "linear_num_value_heads": LINEAR_VALUE_HEADS,
        "linear_key_head_dim": LINEAR_HEAD_DIM,
        "linear_value_head_dim": LINEAR_HEAD_DIM,
        "linear_conv_kernel_dim": 4,
        "output_gate_type": "swish",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "max_position_embeddings": 4096,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": MROPE_SECTION,
        },
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    }


def draft_misses(chain: list[int]) -> set[int]:
    """Chain positions whose successor the MTP head gets wrong (it proposes ``<|im_end|>`` there)."""
    return {i for i in range(len(chain) - 1) if i % DRAFT_MISS_EVERY == DRAFT_MISS_EVERY - 1}


@dataclass(frozen=True)
class DesignedRun:
    tokens: int  # completion tokens, the stop token included
    verify_steps: int
    histogram: tuple[int, ...]  # verify steps by drafts accepted (0 .. steps), as sglext counts them

    @property
    def accept_length(self) -> float:
        return self.tokens / self.verify_steps

    @property
    def correct_drafts(self) -> int:
        return sum(accepted * count for accepted, count in enumerate(self.histogram))


def designed_verify_steps(
    chain: list[int], start: int, max_tokens: int, steps: int = SPEC_STEPS
) -> DesignedRun:
    """What NEXTN with ``steps`` draft steps (topk 1) does with the designed model after a prompt ending at chain
    position ``start``: prefill answers chain[start + 1]; then each verify step accepts the drafts up to the first
    miss, plus the target's own next token, until ``<|im_end|>`` or ``max_tokens``. Past ``<|im_end|>`` both the
    head and the target continue with ``<|im_end|>``, so SGLang counts those drafts accepted (the answer ends at
    the first)."""
    misses = draft_misses(chain)
    last = len(chain) - 1  # <|im_end|>
    position, produced, histogram = start + 1, 1, [0] * (steps + 1)
    while position < last and produced < max_tokens:
        accepted, at = 0, position
        while accepted < steps and (at >= last or at not in misses):
            accepted, at = accepted + 1, at + 1
        gained = min(accepted + 1, last - position, max_tokens - produced)
        position, produced = position + gained, produced + gained
        histogram[accepted] += 1
    return DesignedRun(produced, sum(histogram), tuple(histogram))


def chain_start(chain: list[int], tokenizer, thinking: bool) -> int:
    """Where the generation prompt leaves the chain: its "\\n" after ``<think>`` (thinking on), else the
    "\\n\\n" after the empty think block."""
    token = tokenizer.encode("\n" if thinking else "\n\n", add_special_tokens=False)[0]
    return chain.index(token)


def _designed_main(model, chain: list[int]) -> None:
    import torch

    generator = torch.Generator().manual_seed(MIXER_SEED)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.zero_()
            layer.input_layernorm.weight.zero_()  # Gemma norms: (1 + 0) = unit scale
            layer.post_attention_layernorm.weight.zero_()
            mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
            for name, param in mixer.named_parameters():
                if name.endswith(("out_proj.weight", "o_proj.weight")):
                    param.copy_(torch.randn(param.shape, generator=generator) * MIXER_OUT_SCALE)
                elif name.endswith(("proj.weight", "conv1d.weight")):
                    param.copy_(torch.randn(param.shape, generator=generator) * MIXER_SCALE)
                elif name == "A_log":
                    low, high = A_RANGE
                    param.copy_(torch.log(low + (high - low) * torch.rand(param.shape, generator=generator)))
                elif name == "dt_bias":
                    param.fill_(DT_BIAS)
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.zero_()
        embed[:, DEFAULT_DIM] = 1.0
        head.zero_()
        model.model.norm.weight.zero_()
        for i, (token, successor) in enumerate(itertools.pairwise(chain)):
            embed[token] = 0.0
            embed[token, i] = 1.0
            head[successor, i] = 1.0
        head[chain[-1], DEFAULT_DIM] = 1.0


def _designed_mtp(chain: list[int]) -> dict:
    """``mtp.*`` tensors: ``fc`` maps the normalised embedding e_i to e_i (to e_63, whose row is ``<|im_end|>``, at
    a miss) and ignores the target's hidden state; the one MTP layer's residual writers are zero."""
    import torch

    generator = torch.Generator().manual_seed(MIXER_SEED + 1)

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.1

    misses = draft_misses(chain)
    fc = torch.zeros(HIDDEN, 2 * HIDDEN)
    for i in range(HIDDEN):
        fc[DEFAULT_DIM if i in misses else i, i] = 1.0
    layer = "mtp.layers.0."
    tensors = {
        "mtp.fc.weight": fc,
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(HIDDEN),
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(HIDDEN),
        "mtp.norm.weight": torch.zeros(HIDDEN),
        layer + "input_layernorm.weight": torch.zeros(HIDDEN),
        layer + "post_attention_layernorm.weight": torch.zeros(HIDDEN),
        layer + "self_attn.q_proj.weight": noise(2 * HEADS * HEAD_DIM, HIDDEN),  # query and gate per head
        layer + "self_attn.k_proj.weight": noise(KV_HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.v_proj.weight": noise(KV_HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.o_proj.weight": torch.zeros(HIDDEN, HEADS * HEAD_DIM),
        layer + "self_attn.q_norm.weight": torch.zeros(HEAD_DIM),
        layer + "self_attn.k_norm.weight": torch.zeros(HEAD_DIM),
        layer + "mlp.gate_proj.weight": noise(2 * HIDDEN, HIDDEN),
        layer + "mlp.up_proj.weight": noise(2 * HIDDEN, HIDDEN),
        layer + "mlp.down_proj.weight": torch.zeros(HIDDEN, 2 * HIDDEN),
    }
    return {name: value.to(torch.bfloat16).contiguous() for name, value in tensors.items()}


def build_hybrid(tokenizer_dir: Path, out: Path) -> Path:
    """Write the designed hybrid to ``out``: config, bf16 safetensors (main model and ``mtp.*``) with their index,
    the tokenizer files with the Qwen3.5/3.6-style chat template."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    chain = designed_chain(tokenizer)
    settings = config_dict(tokenizer)
    config = Qwen3_5TextConfig(
        **{k: v for k, v in settings.items() if k not in ("architectures", "model_type")}
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config)
    _designed_main(model, chain)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=settings["eos_token_id"], do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    mtp = _designed_mtp(chain)
    save_file(mtp, out / "model-mtp.safetensors", metadata={"format": "pt"})
    main = load_file(out / "model.safetensors")
    weight_map = {**dict.fromkeys(main, "model.safetensors"), **dict.fromkeys(mtp, "model-mtp.safetensors")}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(settings, indent=2) + "\n")
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, out / item.name)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = TEMPLATE.read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out / "draftgen-tiny.json").write_text(json.dumps({"kind": "hybrid-mtp"}) + "\n")
    return out
