"""The prompts one run takes: the prompt file, this process's shard, the first ``limit`` valid rows."""

from __future__ import annotations

from collections.abc import Iterator

from draftgen.generate.config import GenerateConfig
from draftgen.prompts.rows import PromptRow, RejectedRow, iter_prompts


def prompt_source(config: GenerateConfig) -> Iterator[PromptRow | RejectedRow]:
    """Stream the run's rows (streamed, never loaded whole): malformed rows come out as RejectedRow.

    ``limit`` counts valid rows of this shard, stored or not, so a resumed run selects the same prompts.
    """
    taken = 0
    for item in iter_prompts(
        config.prompt_path, shard=config.shard_spec, category_field=config.category_field or None
    ):
        if isinstance(item, PromptRow):
            if config.limit and taken >= config.limit:
                return
            taken += 1
        yield item
