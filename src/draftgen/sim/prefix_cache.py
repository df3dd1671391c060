"""SGLang's prefix (radix) cache, as the simulated hybrid target uses it: which part of a prompt needs no prefill.

The simulated target is Qwen3.6-27B, a hybrid whose linear-attention layers carry a recurrent state, so a cached
prefix is usable only where the radix tree also holds that state (SGLang 0.5.23, ``mem_cache/unified_cache/
components/mamba.py``: a node matches only with a state). With the ``extra_buffer`` strategy SGLang resolves on a
GPU, a prefill keeps the state at its last multiple of the mamba cache chunk (``ScheduleBatch``'s mamba track
entry: ``prefix_len + extend_len // chunk * chunk``; the chunk is ``max(FLA chunk 64, page size)``) and inserts it
into the tree once the prefill step is done (``checkpoint_kv_cache`` after the prefill result, or on release for a
request that finished there). A later request matches at most ``len(prompt) - 1`` tokens
(``Req._compute_max_prefix_len``) and takes the longest stored state inside them.

So here: after a prefill step each prompt leaves one checkpoint, at its length rounded down to ``CHUNK``; a
prompt admitted later reuses the longest checkpoint that is a prefix of its first ``len - 1`` tokens. Two
identical prompts prefilled in the same step both pay in full (SGLang's default ``fcfs`` policy runs no in-batch
prefix check). Checkpoints are evicted least recently used past ``capacity``. Not modelled: states saved during
decode (every ``mamba_track_interval`` tokens), branching states, KV memory held by the cache.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK = 64  # SGLang's mamba cache chunk for this model: max(FLA's chunk, 64, and the page size)
# States the cache keeps beside the running requests' own: SGLang sizes the hybrid's state pool at 3 + 2
# (extra_buffer's ping-pong) slots per running request and a running request holds 3 of them.
CACHED_STATES_PER_RUNNING_REQUEST = 2


@dataclass(frozen=True)
class CacheSettings:
    """SGLang's flags for the cache: ``--disable-radix-cache`` (on by default) and ``--enable-cache-report``
    (``usage.prompt_tokens_details.cached_tokens`` in OpenAI answers; off by default)."""

    disable_radix_cache: bool = False
    enable_cache_report: bool = False

    def argv(self) -> list[str]:
        """The flags back as command-line words (for a fleet starting server processes)."""
        return ["--disable-radix-cache"] * self.disable_radix_cache + [
            "--enable-cache-report"
        ] * self.enable_cache_report


def add_cache_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--disable-radix-cache",
        action="store_true",
        help="no prefix cache: every prompt is prefilled in full (SGLang's flag)",
    )
    parser.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="report cached prompt tokens in OpenAI usage.prompt_tokens_details (SGLang's flag)",
    )


def cache_settings(args: argparse.Namespace) -> CacheSettings:
    return CacheSettings(
        disable_radix_cache=bool(args.disable_radix_cache), enable_cache_report=bool(args.enable_cache_report)
    )


def _chain(ids: Sequence[int], chunks: int) -> list[int]:
    """Hash of each whole-chunk prefix of ``ids`` (the k-th covers ``ids[:k * CHUNK]``), each from the last."""
    hashes, h = [], 0
    for k in range(chunks):
        h = hash((h, tuple(ids[k * CHUNK : (k + 1) * CHUNK])))
        hashes.append(h)
    return hashes


class PrefixCache:
    """Checkpoints of prefilled prompts, keyed by the hash of the prefix they end, least recently used first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._states: OrderedDict[int, int] = OrderedDict()  # prefix hash -> its length in tokens

    def __len__(self) -> int:
        return len(self._states)

    def match(self, ids: Sequence[int]) -> int:
        """Tokens of ``ids`` a prefill can skip: the longest checkpoint within its first ``len - 1`` tokens."""
        best = None
        for h in _chain(ids, max(0, len(ids) - 1) // CHUNK):
            if h in self._states:
                best = h
        if best is None:
            return 0
        self._states.move_to_end(best)
        return self._states[best]

    def insert(self, ids: Sequence[int]) -> None:
        """The checkpoint a prefill of ``ids`` leaves (none for a prompt shorter than a chunk)."""
        chunks = len(ids) // CHUNK
        if chunks == 0 or self.capacity <= 0:
            return
        h = _chain(ids, chunks)[-1]
        self._states[h] = chunks * CHUNK
        self._states.move_to_end(h)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)
