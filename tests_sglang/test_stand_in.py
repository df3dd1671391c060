"""The stand-in's edges and the tier's launcher pieces, without a server.

* a name the stand-in lacks fails loudly, by name (so a new SGLang release shows what it reaches);
* ``convert_weight_packed`` is absent, so SGLang itself concludes there are no AMX kernels (native layers);
* ``sitecustomize.py`` marks AMX, and forks SGLang's children when asked, only in a process started as
  ``-m sglang.launch_server``;
* the servers' ports are free, below the kernel's ephemeral range, never handed out twice;
* the torchvision fix is idempotent and refuses a file it does not recognise.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
import sgl_kernel
import sitecustomize
import torch
from fix_torchvision import MARKER, patch
from serve_runs import SGLANG_OWN_PORTS_BELOW, SGLANG_PYTHON, _can_listen, _ephemeral_low, free_ports
from sgl_kernel._missing import MissingKernelError


def test_a_missing_op_raises_not_implemented_naming_itself():
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.rotate_input_ids_cpu is not provided"):
        sgl_kernel.rotate_input_ids_cpu  # noqa: B018  (multi-layer EAGLE's op: not reached by this tier)
    with pytest.raises(MissingKernelError, match=r"sgl_kernel\.speculative\.segment_packbits"):
        from sgl_kernel.speculative import segment_packbits  # noqa: F401
    with pytest.raises(AttributeError):
        sgl_kernel.__wrapped__  # noqa: B018  (dunders stay ordinary: inspect and pickle probe them)


def test_everything_provided_is_callable_and_the_torch_ops_are_registered():
    for name in sgl_kernel.PROVIDED:
        assert callable(getattr(sgl_kernel, name)), name
    for name in sgl_kernel.TORCH_OPS:
        assert hasattr(torch.ops.sgl_kernel, name), name


def test_without_convert_weight_packed_sglang_sees_no_amx_kernels():
    from sglang.srt.utils.common import _is_intel_amx_backend_available

    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    assert "convert_weight_packed" not in dir(sgl_kernel)
    assert _is_intel_amx_backend_available() is False  # so every layer takes its forward_native path


def test_sitecustomize_only_marks_the_launcher():
    assert sitecustomize._started_as_launcher(
        ["/venv/bin/python", "-m", "sglang.launch_server", "--port", "1"]
    )
    assert not sitecustomize._started_as_launcher(["/venv/bin/python", "-c", "import sglang.launch_server"])
    assert not sitecustomize._started_as_launcher(
        ["/venv/bin/python", "-m", "pytest", "sglang.launch_server"]
    )
    # Through the wrapper, any other interpreter (serve's import check, SGLang's children) is left alone.
    code = "from sglang.srt.runtime_context import get_platform; print(get_platform().has_amx)"
    result = subprocess.run([str(SGLANG_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


ASK_SPAWN = (
    "import multiprocessing as mp; mp.set_start_method('spawn', force=True); print(mp.get_start_method())"
)


def _wrapper_python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SGLANG_PYTHON), *args, *(("-c", code) if code else ())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_sitecustomize_forks_sglangs_children_only_in_the_launcher_and_only_when_asked():
    # any interpreter but the launcher keeps spawn, the wrapper's fork default notwithstanding
    kept = _wrapper_python(ASK_SPAWN)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == "spawn" and sitecustomize.FORKED_NOTE not in kept.stderr
    # the launcher's mapping itself, applied in a plain interpreter of the wrapper
    forked = _wrapper_python("import sitecustomize; sitecustomize._fork_instead_of_spawn(); " + ASK_SPAWN)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.strip() == "fork" and sitecustomize.FORKED_NOTE in forked.stderr
    # a value that is neither stops the launcher before SGLang parses anything, naming the variable
    wrong = _wrapper_python("", "-m", "sglang.launch_server", "--help", DRAFTGEN_SGLANG_CHILDREN="forkserver")
    assert wrong.returncode == 1, wrong.stderr
    assert "DRAFTGEN_SGLANG_CHILDREN must be fork or spawn, not 'forkserver'" in wrong.stderr


SLOWED_IMPORT = """
import os, sys, threading, time
sys.path.insert(0, {folder!r})
import sitecustomize
sitecustomize._slow_on_demand({flags!r}, "7001", "fake_runner")
import fake_runner  # imported after the patch was asked for, as SGLang's model runner is
runner = fake_runner.ModelRunner()
timings = []
for _ in range(2):
    started = time.perf_counter()
    runner.forward(0.05)
    timings.append(time.perf_counter() - started)
    open({flag!r}, "w").write("9")
open({flag!r}, "w").write("100000")  # held still until the flag goes
threading.Timer(0.3, os.remove, [{flag!r}]).start()
started = time.perf_counter()
runner.forward(0.05)
timings.append(time.perf_counter() - started)
print(" ".join(f"{{t:.3f}}" for t in timings))
"""


def test_a_slowed_server_runs_its_factor_plus_one_times_slower_while_the_flag_exists(tmp_path):
    """ServeRun.slowed's mechanism: the model runner's forward, patched when its module is first imported, is
    followed by a pause of N times its own duration while the port's flag file holds N; none without the file. The
    flag is re-read during the pause: a huge N holds the forward until the file is removed, then it returns."""
    module = tmp_path / "modules"
    (module / "fake_runner").mkdir(parents=True)
    (module / "fake_runner" / "__init__.py").write_text(
        "import time\n\nclass ModelRunner:\n    def forward(self, seconds):\n        time.sleep(seconds)\n"
    )
    flags = tmp_path / "slow"
    flags.mkdir()
    done = _wrapper_python(
        SLOWED_IMPORT.format(folder=str(module), flags=str(flags), flag=str(flags / "7001"))
    )
    assert done.returncode == 0, done.stderr
    assert sitecustomize.SLOW_NOTE in done.stderr
    plain, slowed, held = (float(t) for t in done.stdout.split())
    # no flag file yet: the forward's own time, far below a slowed one (wide margin: CI's 2 cores are busy)
    assert 0.05 <= plain < 0.25
    assert slowed >= 10 * 0.05  # 9 x its own duration more
    assert 0.3 <= held < 60  # 100000 x 0.05 s would be 83 min: it ended when the flag was removed
    assert sitecustomize.slow_factor(str(flags / "absent")) == 0.0
    (flags / "junk").write_text("fast please")
    assert sitecustomize.slow_factor(str(flags / "junk")) == 0.0


def test_server_ports_are_free_below_the_ephemeral_range_and_never_handed_out_twice():
    firsts = [free_ports(2) for _ in range(50)]
    ports = [p + i for p in firsts for i in range(2)]
    assert len(set(ports)) == len(ports)  # consecutive pairs, no port twice
    assert all(SGLANG_OWN_PORTS_BELOW <= p < _ephemeral_low() for p in ports)
    with socket.socket() as listener:  # a port something listens on does not count as free
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        assert not _can_listen(taken)
    assert _can_listen(taken)


SAMPLE = """import torch
import torchvision.extension  # noqa: F401


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    pass
"""


def test_torchvision_fix_is_idempotent_and_refuses_an_unknown_layout():
    fixed = patch(SAMPLE)
    assert MARKER in fixed and "@torch.library.register_fake(" not in fixed
    assert patch(fixed) == fixed
    with pytest.raises(ValueError, match="unexpected"):
        patch("import torch\n")
    import torchvision  # the installed copy was fixed by `make`: it imports

    assert torchvision.__version__.startswith("0.28.0")
