"""support/sitecustomize.py's CPU paths for SGLang's GPU-only kernels: installed in SGLang's server processes only.

In an interpreter marked as the launcher's child (``DRAFTGEN_SGLANG_LAUNCHED=1``, what the launcher sets for the
processes it spawns) the GDN output norm takes its CPU op and the mamba state commit our torch scatter, also where
another SGLang module imported the name; elsewhere SGLang is left as it ships (the wrapper's other interpreters
run sitecustomize.py's unmarked branch, which test_stand_in.py's probes cover).
"""

from __future__ import annotations

import json
import os
import subprocess

from serve_runs import SGLANG_PYTHON

PROBE = """
import json
import sglang.kernels.ops.attention.fla.layernorm_gated as norm
import sglang.kernels.ops.mamba.mamba_state_scatter_triton as scatter
from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_mamba_state_scatter_with_mask as imported
print(json.dumps({
    "norm_cpu_op": norm._use_cpu,
    "scatter": scatter.fused_mamba_state_scatter_with_mask.__module__,
    "windows": scatter.fused_conv_window_scatter_multi.__module__,
    "imported_scatter": imported.__module__,
}))
"""


def probe(**env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "DRAFTGEN_SGLANG_LAUNCHED"}
    done = subprocess.run(
        [str(SGLANG_PYTHON), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_launchers_children_get_the_cpu_paths():
    seen = probe(DRAFTGEN_SGLANG_LAUNCHED="1")
    assert seen == {
        "norm_cpu_op": True,
        "scatter": "sglang_cpu_paths",
        "windows": "sglang_cpu_paths",
        "imported_scatter": "sglang_cpu_paths",  # as SGLang's backend binds it: `from ... import`
    }


def test_importing_the_replacements_changes_nothing_by_itself():
    """This interpreter (pytest's, not marked): the replacements module is imported (the op tests use it), and
    SGLang's modules are as they ship."""
    import sglang.kernels.ops.attention.fla.layernorm_gated as norm
    import sglang.kernels.ops.mamba.mamba_state_scatter_triton as scatter
    import sglang_cpu_paths

    assert sglang_cpu_paths.REPLACEMENTS and norm._use_cpu is False  # no AMX here: SGLang's own choice
    assert scatter.fused_mamba_state_scatter_with_mask.__module__ == scatter.__name__
    assert scatter.fused_conv_window_scatter_multi.__module__ == scatter.__name__
