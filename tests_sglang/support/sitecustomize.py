"""Four adjustments for SGLang on a CPU without AMX, active only under ``support/sglang-python``.

Design: the SGLang tier starts its servers the production way, ``draftgen serve --engine sglang --python
tests_sglang/support/sglang-python ... -- --device cpu ...``, so serve's own command line ``PY -m
sglang.launch_server ARGS`` runs unchanged; no test-only launcher exists. The ``sglang-python`` wrapper puts this
folder first on ``PYTHONPATH`` and sets ``DRAFTGEN_SGLANG_CPU=1``; Python imports this module at start-up. Only
when both hold, and the interpreter was started as ``-m sglang.launch_server``, does it act, before the launcher
parses its arguments (the third also in the launcher's spawned children, which the launcher marks with
``DRAFTGEN_SGLANG_LAUNCHED=1`` in their environment). Every other interpreter (serve's import check, the tests) is
untouched.

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
3. **CPU paths for SGLang's GPU-only kernels on the hybrid MTP path** (``support/sglang_cpu_paths.py``): the
   mamba state commit after each speculative verify and the Gated DeltaNet output norm have only Triton/CUDA
   paths in SGLang 0.5.23. As each of those modules is imported (``REPLACEMENTS``, a meta-path hook), its kernel
   wrappers are replaced by plain-torch ones, or its flag set to take the CPU op our stand-in provides. This one
   acts in the launcher's spawned children too (forked ones inherit it).
4. **A slow server on demand** (``DRAFTGEN_SGLANG_SLOW_DIR``): while that folder holds a file named after the
   server's ``--port``, each forward pass of SGLang's model runner is followed by a pause of N times its own
   duration (N: the file's content), so the server runs N + 1 times slower than it would, whatever the machine's
   speed or load. The hedging and kill tests make their slow server slow so, by construction, instead of hoping
   one server is slower than another on the day. The file is read at every pass and during each pause: removing
   it restores full speed at once, and a huge N holds the server still until it is removed. Installed in the
   launcher (forked children inherit it); spawned children are untouched.
"""

import importlib.abc
import itertools
import multiprocessing
import os
import sys
import time

CHILDREN = os.environ.get("DRAFTGEN_SGLANG_CHILDREN", "spawn")
FORKED_NOTE = "draftgen sglang-python: SGLang's scheduler and detokenizer are forked, not spawned"
LAUNCHED = "DRAFTGEN_SGLANG_LAUNCHED"


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


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callbacks[name](module)`` once a module named there has executed (the other finders find it)."""

    def __init__(self, callbacks: dict) -> None:
        self.callbacks = callbacks

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                original, callback = spec.loader.exec_module, self.callbacks[fullname]

                def exec_module(module, original=original, callback=callback):
                    original(module)
                    callback(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def _when_imported(callbacks: dict) -> None:
    """``callbacks[name](module)`` now for a module already imported, else as soon as it is."""
    pending = {}
    for name, callback in callbacks.items():
        if name in sys.modules:
            callback(sys.modules[name])
        else:
            pending[name] = callback
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


def _cpu_paths_for_gpu_only_kernels() -> None:
    from sglang_cpu_paths import REPLACEMENTS

    _when_imported(dict(REPLACEMENTS))


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


# A pause re-reads the flag this often: removing it (or lowering it) ends a long pause at once.
PAUSE_SLICE_S = 0.05


def slowed(forward, flag_path: str):  # type: ignore[no-untyped-def]
    """``forward`` followed by a pause of ``slow_factor(flag_path)`` times its own duration, the factor re-read
    during the pause: a huge factor holds the server still until the flag is removed."""

    def forward_then_pause(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        out = forward(*args, **kwargs)
        took = time.perf_counter() - started
        paused_from = time.perf_counter()
        while (left := slow_factor(flag_path) * took - (time.perf_counter() - paused_from)) > 0:
            time.sleep(min(left, PAUSE_SLICE_S))
        return out

    return forward_then_pause


def _slow_on_demand(folder: str, port: str, runner_module: str = MODEL_RUNNER) -> None:
    flag = os.path.join(folder, port)

    def patch(module) -> None:  # type: ignore[no-untyped-def]
        module.ModelRunner.forward = slowed(module.ModelRunner.forward, flag)

    print(f"{SLOW_NOTE} (while {flag} exists)", file=sys.stderr, flush=True)
    _when_imported({runner_module: patch})


_CPU = os.environ.get("DRAFTGEN_SGLANG_CPU") == "1"
if _CPU and os.environ.get(LAUNCHED) == "1" and not _started_as_launcher(getattr(sys, "orig_argv", [])):
    _cpu_paths_for_gpu_only_kernels()  # a child the launcher spawned

if _CPU and _started_as_launcher(getattr(sys, "orig_argv", [])):
    if CHILDREN not in ("fork", "spawn"):
        raise SystemExit(f"sglang-python: DRAFTGEN_SGLANG_CHILDREN must be fork or spawn, not {CHILDREN!r}")
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
    os.environ[LAUNCHED] = "1"
    _cpu_paths_for_gpu_only_kernels()
    if CHILDREN == "fork":
        _fork_instead_of_spawn()
    slow_dir = os.environ.get("DRAFTGEN_SGLANG_SLOW_DIR")
    port = _option(getattr(sys, "orig_argv", []), "--port")
    if slow_dir and port:
        _slow_on_demand(slow_dir, port)
