"""draftgen tune: find the SGLang settings with the most output tokens per second per GPU (docs/tune.md)."""
