"""validate.ipynb's logic: are the generated samples fit to train a drafter on? (loss masks, flags, export).

Modules: ``config`` (parameters, flags), ``reader`` (generate's shards), ``checks`` (per-sample flags),
``export`` (training JSONL / token parquet), ``pipeline`` (one run and the gate), ``report`` (tables, plots).
Loss masks themselves live in ``draftgen.training.masks``.
"""
