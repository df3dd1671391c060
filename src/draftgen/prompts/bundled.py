"""The synthetic prompt set bundled with draftgen (``prompts: synthetic``): where it is and how it was made.

Its own module so that reading prompt files (``prompts.rows``) needs the file's path without the generator that
wrote it (``prompts.synthetic``, which reads ``prompts.rows`` through ``prompts.long_chat``).
"""

from __future__ import annotations

from pathlib import Path

BUNDLED_PROMPTS = Path(__file__).parent.parent / "data" / "synthetic_prompts.jsonl"
BUNDLED_COUNT = 2000  # synthetic_rows(BUNDLED_COUNT, BUNDLED_SEED) wrote it (tests/test_packaging.py checks)
BUNDLED_SEED = 0
