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
3. **A slow server on demand** (``DRAFTGEN_SGLANG_SLOW_DIR``): while that folder holds a file named after the
   server's ``--port``, each forward pass of SGLang's model runner is followed by a pause of N times its own
   duration (N: the file's content), so the server runs N + 1 times slower than it would, whatever the machine's
   speed or load. The hedging test makes its slow server slow so, by construction, instead of hoping one
   speculative algorithm is slower than another on the day. The file is read at every pass: removing it
   restores full speed at the next step. The patch is applied when the model runner's module is imported (in
   the launcher, so forked children inherit it, or in a child after the fork); spawned children are untouched.
"""

import importlib.abc
import importlib.util
import itertools
import multiprocessing
import os
import sys
import time

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


MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
SLOW_NOTE = "draftgen sglang-python: this server slows down on demand"


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` on a command line."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def slow_factor(path: str) -> float:
    """The pause per forward pass, as a multiple of its duration: the flag file's number, 0 without the file."""
    try:
        with open(path) as flag:
            return max(0.0, float(flag.read().strip() or 0))
    except (FileNotFoundError, ValueError):
        return 0.0


def slowed(forward, flag_path: str):  # type: ignore[no-untyped-def]
    """``forward`` followed by a pause of ``slow_factor(flag_path)`` times its own duration."""

    def forward_then_pause(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        out = forward(*args, **kwargs)
        factor = slow_factor(flag_path)
        if factor > 0:
            time.sleep(factor * (time.perf_counter() - started))
        return out

    return forward_then_pause


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after ``name`` is first imported (the module is SGLang's, imported late)."""

    def __init__(self, name: str, then) -> None:  # type: ignore[no-untyped-def]
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders find it; this one acts once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:  # type: ignore[no-untyped-def]
            execute(module)
            self.then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _slow_on_demand(folder: str, port: str, runner_module: str = MODEL_RUNNER) -> None:
    flag = os.path.join(folder, port)

    def patch(module) -> None:  # type: ignore[no-untyped-def]
        module.ModelRunner.forward = slowed(module.ModelRunner.forward, flag)

    print(f"{SLOW_NOTE} (while {flag} exists)", file=sys.stderr, flush=True)
    if runner_module in sys.modules:
        patch(sys.modules[runner_module])
    else:
        sys.meta_path.insert(0, _PatchAfterImport(runner_module, patch))


if os.environ.get("DRAFTGEN_SGLANG_CPU") == "1" and _started_as_launcher(getattr(sys, "orig_argv", [])):
    if CHILDREN not in ("fork", "spawn"):
        raise SystemExit(f"sglang-python: DRAFTGEN_SGLANG_CHILDREN must be fork or spawn, not {CHILDREN!r}")
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
    if CHILDREN == "fork":
        _fork_instead_of_spawn()
    slow_dir = os.environ.get("DRAFTGEN_SGLANG_SLOW_DIR")
    port = _option(getattr(sys, "orig_argv", []), "--port")
    if slow_dir and port:
        _slow_on_demand(slow_dir, port)
