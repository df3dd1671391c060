"""Two launcher-only adjustments for SGLang on a CPU without AMX, active only under ``support/sglang-python``.

Design: the SGLang tier starts its servers the production way, ``draftgen serve --engine sglang --python
tests_sglang/support/sglang-python ... -- --device cpu ...``, so serve's own command line ``PY -m
sglang.launch_server ARGS`` runs unchanged; no test-only launcher exists. The ``sglang-python`` wrapper puts this
folder first on ``PYTHONPATH`` and sets ``DRAFTGEN_SGLANG_CPU=1``; Python imports this module at start-up. Only
when both hold, and the interpreter was started as ``-m sglang.launch_server``, does it act, before the launcher
parses its arguments. Every other interpreter (serve's import check, the tests, spawned children) is untouched.

1. **Keep the ``intel_amx`` attention backend.** SGLang resolves ``--attention-backend intel_amx`` to
   ``torch_native`` when the platform reports no AMX (``get_platform().has_amx``, checked in
   ``sglang.srt.arg_groups.overrides``), and ``torch_native`` crashes in the speculative verify step
   (``extend_prefix_lens`` is None). ``intel_amx`` itself only needs the two attention ops that our
   ``sgl_kernel`` stand-in provides. So the platform is marked as having AMX (SGLang's own
   ``override_platform(has_amx=True)``). SGLang's layers keep asking ``cpu_has_amx_support()``, which stays False
   (no ``convert_weight_packed`` op), so they run their native torch paths; ``has_amx`` itself is read only
   where arguments are resolved (and by gpt-oss overrides), so forked children inheriting it change nothing.
2. **Fork SGLang's children instead of spawning them** when ``DRAFTGEN_SGLANG_CHILDREN=fork`` (the wrapper's
   default). SGLang forces the ``spawn`` start method (CUDA cannot be forked), so each scheduler and detokenizer
   imports torch and SGLang afresh: about 14 core-seconds each, twice per server start, which made up a third of
   the tier's CPU time. On the CPU, with one OpenMP thread (the wrapper's default), forking the launcher is
   safe, and the children then run the same SGLang code from the launcher's imports. ``spawn`` keeps SGLang's
   own way; the tier starts one server so (its relaunched tune winner), so both paths stay proven. The launcher
   says which it did on stderr (the server's log).
"""

import itertools
import multiprocessing
import os
import sys

CHILDREN = os.environ.get("DRAFTGEN_SGLANG_CHILDREN", "spawn")
FORKED_NOTE = "draftgen sglang-python: SGLang's scheduler and detokenizer are forked, not spawned"


def _started_as_launcher(argv: list[str]) -> bool:
    return any(a == "-m" and b == "sglang.launch_server" for a, b in itertools.pairwise(argv))


def _fork_instead_of_spawn() -> None:
    chosen = multiprocessing.set_start_method

    def set_start_method(method: str | None, force: bool = False) -> None:
        if method == "spawn":
            print(f"{FORKED_NOTE} (DRAFTGEN_SGLANG_CHILDREN=fork)", file=sys.stderr, flush=True)
            method = "fork"
        chosen(method, force=force)

    multiprocessing.set_start_method = set_start_method


if os.environ.get("DRAFTGEN_SGLANG_CPU") == "1" and _started_as_launcher(getattr(sys, "orig_argv", [])):
    if CHILDREN not in ("fork", "spawn"):
        raise SystemExit(f"sglang-python: DRAFTGEN_SGLANG_CHILDREN must be fork or spawn, not {CHILDREN!r}")
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
    if CHILDREN == "fork":
        _fork_instead_of_spawn()
