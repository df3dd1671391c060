"""``draftgen run``'s kernel: Unix sockets in a private folder, so ipykernel has no plain-TCP warning to print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from draftgen.paths import ROOT_ENV

PROBE = """import json, os
from ipykernel.connect import get_connection_file
info = json.load(open(get_connection_file()))
print("TRANSPORT", info["transport"], info["ip"], oct(os.stat(os.path.dirname(info["ip"])).st_mode & 0o777))
print("CWD", os.getcwd())
"""


def test_draftgen_run_kernel_uses_private_ipc_sockets_and_prints_no_tcp_warning(tmp_path):
    root = tmp_path / "proj"
    (root / "notebooks").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    nb = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell("label: str = 'x'  # a parameter")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell(PROBE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "notebooks" / "probe.ipynb")
    env = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    command = [sys.executable, "-m", "draftgen", "run", "notebooks/probe.ipynb", "--name", "p", "--no-html"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "without encryption" not in output
    assert "Kernel is running over TCP" not in output
    executed = json.loads((root / "outputs" / "probe" / "p" / "probe.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for o in executed["cells"][-1]["outputs"])
    transport_line = next(line for line in printed.splitlines() if line.startswith("TRANSPORT"))
    _, transport, ip, mode = transport_line.split()
    assert transport == "ipc"
    assert Path(ip).parent.name.startswith("draftgen-kernel-") and mode == "0o700"
    assert not Path(ip).parent.exists(), "the socket folder outlived the run"
    assert f"CWD {root}" in printed  # the kernel starts in the project root
    assert not list(root.glob("kernel-ipc*")), "IPC socket files left in the project root"
