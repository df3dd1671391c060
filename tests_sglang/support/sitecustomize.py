"""Keep SGLang's ``intel_amx`` attention backend on a CPU without AMX, for the launcher process only.

Why: SGLang resolves ``--attention-backend intel_amx`` to ``torch_native`` when the platform reports no AMX
(``get_platform().has_amx``, checked in ``sglang.srt.arg_groups.overrides``), and ``torch_native`` crashes in the
speculative verify step (``extend_prefix_lens`` is None). ``intel_amx`` itself only needs the two attention ops
that our ``sgl_kernel`` stand-in provides.

Design: the SGLang tier starts its servers the production way, ``draftgen serve --engine sglang --python
tests_sglang/support/sglang-python ... -- --device cpu ...``, so serve's own command line
``PY -m sglang.launch_server ARGS`` runs unchanged; no test-only launcher exists. The ``sglang-python`` wrapper puts
this folder first on ``PYTHONPATH`` and sets ``DRAFTGEN_SGLANG_CPU=1``; Python imports this module at start-up.
Only when both hold, and the interpreter was started as ``-m sglang.launch_server``, does it mark the platform as
having AMX (SGLang's own ``override_platform(has_amx=True)``), before the launcher parses its arguments. Every
other process (serve's import check, SGLang's scheduler and detokenizer children, the tests) is untouched, and
SGLang's layers keep asking ``cpu_has_amx_support()``, which stays False (no ``convert_weight_packed`` op), so they
run their native torch paths.
"""

import itertools
import os
import sys


def _started_as_launcher(argv: list[str]) -> bool:
    return any(a == "-m" and b == "sglang.launch_server" for a, b in itertools.pairwise(argv))


if os.environ.get("DRAFTGEN_SGLANG_CPU") == "1" and _started_as_launcher(getattr(sys, "orig_argv", [])):
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
