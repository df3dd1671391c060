"""The closed loop: does the export train a drafter that predicts the target better than the data you had before?

``draftgen loop`` (docs/loop.md) hands SpecForge 0.2.0's own trainer (``specforge train``, DFlash, offline features)
three sets of rows from one generate → validate run: (a) the export's rows, (b) the same prompts with the answers
the prompt file brought (the source's assistant turns), and (c) the held-out split of the target's own answers
(``export/holdout/eval.jsonl``), which neither arm trains on. Each arm is trained per seed and evaluated on (c):
accuracy per draft position and the simulated acceptance length, beside a most-frequent-token baseline.

Modules: ``config`` (``LoopConfig``), ``arms`` (the three row sets), ``features`` (the target's hidden states as
SpecForge's offline feature files), ``specforge_run`` (a run config and ``specforge train``), ``evaluate`` (per
position, from a checkpoint), ``report`` (the table and the headline), ``step`` (``run(config)``: the whole step).
torch, transformers and SpecForge are imported only where they run.
"""
