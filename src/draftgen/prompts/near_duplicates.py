"""Near-duplicate conversations, found as curation pipelines find them: MinHash signatures of word shingles in a
locality-sensitive hash index (datasketch's ``MinHash`` and ``MinHashLSH``), one conversation at a time, in order.

A conversation's text is every message's content, case folded and whitespace collapsed (``rows.folded``); its
shingles are the word 3-grams of that text (a text of three words or fewer is one shingle). The index proposes the
earlier conversations that share a band with a new one: with 64 permutations in 5 bands of 11, a pair whose
shingle sets have Jaccard similarity 0.95 is proposed with probability 0.985, 0.9 with 0.85, 0.8 with 0.36 (the band
scheme's S-curve, 1 − (1 − s¹¹)⁵, turns near 0.86). A proposal is a near-duplicate when the two signatures agree on
at least ``SIMILARITY`` of their 64 values (MinHash's estimate of the Jaccard similarity), which keeps out the
pairs that share a band by chance among many (on templated text, a few per thousand conversations at 0.3).
Exact copies are the reader's to find (``rows.iter_prompts``); this index sees the conversations it is given.

Memory: about 2 KB per conversation indexed (the index's 5 band keys and their buckets, and the 256-byte
signature), so the caller bounds how many it takes from a large file. datasketch and its scipy are imported when the first index is
built, never by the reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

NUM_PERM = 64
BANDS = (5, 11)  # (bands, rows per band): 55 of the 64 permutations, datasketch's choice for threshold 0.8
SIMILARITY = 0.8  # the least estimated Jaccard similarity of a near-duplicate
SHINGLE_WORDS = 3


def shingles(text: str) -> set[bytes]:
    """Word 3-grams of folded text (the text itself when it has fewer words), as bytes for the hash."""
    words = text.split()
    if len(words) <= SHINGLE_WORDS:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + SHINGLE_WORDS]).encode() for i in range(len(words) - SHINGLE_WORDS + 1)}


class NearDuplicateIndex:
    """Conversations added one by one; ``add`` answers with the earlier one it nearly duplicates, if any."""

    def __init__(self) -> None:
        from datasketch import MinHash, MinHashLSH

        # datasketch's own shingle hash (sha1, stable across processes); 32-bit values halve the signatures. Each
        # signature starts as a copy of this empty one, which shares its permutations (drawn once, not per row).
        self._empty = MinHash(num_perm=NUM_PERM, scheme="affine32")
        self._index: Any = MinHashLSH(num_perm=NUM_PERM, params=BANDS)
        self._signatures = np.empty((1024, NUM_PERM), dtype=np.uint32)
        self.size = 0

    def _signature(self, text: str) -> Any:
        signature = self._empty.copy()
        signature.update_batch(shingles(text))
        return signature

    def add(self, texts: Iterable[str]) -> tuple[int, float] | None:
        """One conversation (``texts``: its folded messages): the earlier indexed one it nearly duplicates and
        their estimated similarity (the most similar, the earliest of equals), or None, and then it is indexed
        as number ``size``. A near-duplicate is not indexed: its group is represented by its first member, so a
        bucket grows with the distinct conversations, not with the copies of one (a copy of a copy is found
        through the first, when it is near that one too)."""
        signature = self._signature(" ".join(texts))
        values = signature.hashvalues.astype(np.uint32)
        candidates = np.fromiter(self._index.query(signature), dtype=np.int64)
        if candidates.size:
            candidates.sort()
            similarity = (self._signatures[candidates] == values).mean(axis=1)
            top = int(similarity.argmax())  # the first of the most similar: the earliest of equals
            if similarity[top] >= SIMILARITY:
                return int(candidates[top]), float(similarity[top])
        if self.size == len(self._signatures):
            self._signatures = np.concatenate([self._signatures, np.empty_like(self._signatures)])
        self._signatures[self.size] = values
        self._index.insert(self.size, signature, check_duplication=False)
        self.size += 1
        return None
