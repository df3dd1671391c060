"""The simulated server's tokenizer: a Hugging Face tokenizer folder, read without transformers.

``tokenizer.json`` is loaded with the light ``tokenizers`` library; ``tokenizer_config.json``'s ``chat_template`` is
rendered with jinja2 the way transformers renders it (a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, loop controls, ``tojson``, ``raise_exception``, ``strftime_now``, the special tokens as
variables), so a prompt's ids are what ``apply_chat_template(..., add_generation_prompt=True)`` gives for the same
folder, and the ids the simulator reports are the ids validate's tokenizer would read.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from draftgen.sim.filler import filler_units, filler_words

THINK_END = "</think>"


class TokenizerFolderError(ValueError):
    """A --tokenizer folder the simulator cannot use; the message names the file and what is wrong."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str) -> None:
    raise TokenizerFolderError(f"the chat template raised: {message}")


_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# SimTokenizer.load: (folder, its files' stamps) -> the tokenizer loaded from them
_LOADED: dict[tuple, SimTokenizer] = {}


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


class SimTokenizer:
    """Encode, decode and render chat prompts with one tokenizer folder; per-token text cached."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        files = [self.folder / "tokenizer.json", self.folder / "tokenizer_config.json"]
        missing = [p.name for p in files if not p.is_file()]
        if missing:
            raise TokenizerFolderError(
                f"{self.folder} lacks {', '.join(missing)}: give --tokenizer a Hugging Face tokenizer folder "
                "(draftgen tokenizer --out DIR makes one)"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(files[0]))
            self.config = json.loads(files[1].read_text(encoding="utf-8"))
        except (OSError, ValueError, Exception) as exc:
            raise TokenizerFolderError(f"cannot read the tokenizer in {self.folder}: {exc}") from exc
        template = self.config.get("chat_template")
        jinja_file = self.folder / "chat_template.jinja"
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if not isinstance(template, str):
            raise TokenizerFolderError(
                f"{files[1]} has no chat_template: the simulator renders chat prompts with it"
            )
        self.specials = {
            name: _token_text(self.config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        eos = self.specials["eos_token"]
        self.eos_id = self.tokenizer.token_to_id(eos) if eos else None
        if self.eos_id is None:
            raise TokenizerFolderError(f"{files[1]}: eos_token {eos!r} is not in the vocabulary")
        think_end = self.tokenizer.token_to_id(THINK_END)
        if think_end is None:
            raise TokenizerFolderError(
                f"{files[0]} has no {THINK_END} token: the simulator speaks Qwen3's format (reasoning, {THINK_END}, "
                "answer) and needs a Qwen3-format tokenizer (draftgen tokenizer --vocab tiny|qwen3)"
            )
        self.think_end_id: int = think_end
        self._template = self._compile(template)
        self._pieces: dict[int, str] = {}
        self._units: dict[str, tuple[int, ...]] = {}

    @classmethod
    def load(cls, folder: str | Path) -> SimTokenizer:
        """The process's one tokenizer for ``folder`` as its files are now: a server checks its folder before it
        listens and then serves with it, and a fleet checks the same folder at every start (50 ms each)."""
        folder = Path(folder)
        key = (str(folder.resolve()), *(_stamp(folder / name) for name in _FILES))
        loaded = _LOADED.get(key)
        if loaded is None:
            loaded = _LOADED[key] = cls(folder)
        return loaded

    @staticmethod
    def _compile(source: str) -> Any:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)

        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(source)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @cached_property
    def added_ids(self) -> frozenset[int]:
        """Ids of added tokens (special or not, e.g. ``<think>``): never split by the non-canonical fault."""
        return frozenset(self.tokenizer.get_added_tokens_decoder())

    def render(
        self, messages: Sequence[dict], enable_thinking: bool, tools: Sequence[dict] | None = None
    ) -> str:
        """The chat template's text for ``messages`` (and the request's ``tools``) with the generation prompt, as
        transformers renders it."""
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
            tools=list(tools) if tools else None,
            documents=None,
            **{k: v for k, v in self.specials.items() if v is not None},
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_unit(self, unit: str) -> tuple[int, ...]:
        """The ids of one filler unit (``filler.filler_units``), cached: the simulator's text comes from a small set."""
        ids = self._units.get(unit)
        if ids is None:
            ids = self._units[unit] = tuple(self.encode(unit))
        return ids

    def encode_units(self, units: Sequence[str]) -> list[int]:
        """The canonical ids of ``"".join(units)``: unit by unit from the cache where this tokenizer never merges
        across a unit's edge (``separable``), else the whole text at once."""
        if not self.separable:
            return self.encode("".join(units))
        return [i for unit in units for i in self.encode_unit(unit)]

    @cached_property
    def separable(self) -> bool:
        """Whether unit-by-unit encoding equals encoding the whole text, on samples of the simulator's filler
        (checked when first needed: 25 ms)."""
        rng = random.Random(0)
        for _ in range(8):
            words = filler_words(rng, 300, "Okay,")
            units = [
                *filler_units(words),
                "\n",
                THINK_END,
                "\n\n",
                *filler_units(filler_words(rng, 50, None)),
            ]
            units = filler_units(units)
            if [i for u in units for i in self.encode(u)] != self.encode("".join(units)):
                return False
        return True

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def piece(self, token_id: int) -> str:
        """One token's text (special tokens: empty), cached: a stream's chunks are cut at token boundaries."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self._pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return text

    def text_of(self, token_id: int) -> str:
        """One token's text as SGLang's logprobs name it: special tokens too (``<|im_end|>``), not cached."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def split(self, token_id: int) -> tuple[int, ...] | None:
        """Smaller vocabulary tokens that decode to the same text as ``token_id`` (a non-canonical spelling), or
        None when it cannot be split (a one-byte or an added token).

        Prefers two halves that are both tokens; else its bytes one by one (byte-level vocabularies hold every
        byte)."""
        if token_id in self.added_ids:
            return None
        name = self.tokenizer.id_to_token(token_id)
        if name is None or len(name) < 2:
            return None
        for cut in range(len(name) // 2, 0, -1):
            for at in {cut, len(name) - cut}:
                left, right = self.tokenizer.token_to_id(name[:at]), self.tokenizer.token_to_id(name[at:])
                if left is not None and right is not None:
                    return left, right
        chars = [self.tokenizer.token_to_id(c) for c in name]
        return tuple(chars) if None not in chars else None  # type: ignore[arg-type]


def default_tokenizer(folder: Path | None = None) -> Path:
    """The tiny Qwen3-format tokenizer (``draftgen tokenizer --vocab tiny``), copied into ``folder`` unless it is
    already there (None: the machine's cached copy, read in place): every simulated server offers token ids."""
    import shutil

    from draftgen.training.local_tokenizer import cached_tiny_tokenizer

    cached = cached_tiny_tokenizer()
    if folder is None:
        return cached
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        shutil.copytree(cached, folder, dirs_exist_ok=True)
    return folder
