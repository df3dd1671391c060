"""SGLang 0.5.23's rules that decide what a server started with given flags runs, written once.

Two users read them: ``draftgen.server_settings`` (what ``serve`` launches and ``tune`` refuses before anything
starts) and the simulator (``draftgen.sim.speculative`` and ``draftgen.sim.adaptive``, what a simulated server
does with the same flags). Each rule names the SGLang file it restates; the facts are SGLang's, the code is ours.

- ``speculation``: the algorithms and what each needs, the batch cap with speculation on, the numbers SGLang
  chooses itself, the top-k 1 chain and the draft tree, DFLASH's overrides.
- ``adaptive``: ``--speculative-adaptive``'s default table, its decision rule, and what switches it off.
- ``hybrid_memory``: how SGLang budgets memory for a hybrid (linear-attention + full-attention) model.
- ``parsers``: which reasoning and tool-call parser a model family's output needs, and the call formats they read.

Plain values and functions only (no pydantic, no I/O), so a simulated server imports them at no cost and a new
rule is one more constant or function in the module of its concern.
"""
