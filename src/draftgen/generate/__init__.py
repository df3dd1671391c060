"""generate.ipynb's package: every prompt exactly once across N servers, resumable, with a garbage guard.

Modules, one job each: ``config`` (parameters), ``preflight`` (checks before long work), ``source`` (the prompts
a run takes), ``dispatch`` (pull-based requests, retries, server health), ``retry`` (backoff policy), ``store``
(atomic shards, manifest, resume), ``guard`` (garbage guard), ``progress`` (tqdm), ``run`` (one session),
``report`` (summary, plots, planned vs actual), ``disk`` (room for the output before a run starts).
"""

from draftgen.generate.config import GenerateConfig
from draftgen.generate.guard import GuardTripped
from draftgen.generate.preflight import Plan, PreflightError, preflight
from draftgen.generate.run import DiskFullStop, RunInterrupted, RunResult, generate

__all__ = [
    "DiskFullStop",
    "GenerateConfig",
    "GuardTripped",
    "Plan",
    "PreflightError",
    "RunInterrupted",
    "RunResult",
    "generate",
    "preflight",
]
