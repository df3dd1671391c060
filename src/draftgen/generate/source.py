"""The prompts one run takes: the prompt file, this process's shard, the first ``limit`` valid rows, and with a
sampling plan each prompt's planned samples (one row each, under its sample id)."""

from __future__ import annotations

from collections.abc import Iterator

from draftgen.generate.config import GenerateConfig
from draftgen.prompts.rows import PromptRow, RejectedRow, iter_prompts
from draftgen.sampling_plan import sample_rows


def prompt_source(config: GenerateConfig) -> Iterator[PromptRow | RejectedRow]:
    """Stream the run's rows (streamed, never loaded whole): malformed rows come out as RejectedRow.

    ``limit`` counts valid rows of this shard, stored or not, so a resumed run selects the same prompts. A
    conversation the file held earlier under another id comes out as rejected ("duplicate of ID") unless
    ``keep_duplicates``, decided before samples are made: a duplicate's samples are never sent. With a
    ``sampling_plan`` every prompt comes out once per planned sample (``draftgen.sampling_plan``).
    """
    taken = 0
    arms = config.sampling_plan
    for item in iter_prompts(
        config.prompt_path,
        shard=config.shard_spec,
        category_field=config.category_field or None,
        keep_duplicates=config.keep_duplicates,
    ):
        if isinstance(item, PromptRow):
            if config.limit and taken >= config.limit:
                return
            taken += 1
            yield from sample_rows(item, arms)
            continue
        yield item
