"""Run a draftgen notebook headless the way a user does (``draftgen run NB --name RUN -p KEY VALUE ...``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RUN_TIMEOUT_S = 900


class NotebookRunFailed(AssertionError):
    pass


def notebook_text(executed: Path) -> str:
    """Everything the executed notebook printed, displayed or raised."""
    nb = json.loads(executed.read_text())
    parts = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", "")))
            if output.get("ename"):
                parts.append(f"{output['ename']}: {output.get('evalue', '')}")
            for value in output.get("data", {}).values():
                parts.append("".join(value) if isinstance(value, list) else str(value))
    return "\n".join(parts)


def draftgen_run(notebook: str, out_root: Path, name: str, params: dict) -> Path:
    """Execute ``notebook`` into ``out_root/<notebook>/<name>/``; the run folder, or NotebookRunFailed with why."""
    command = [sys.executable, "-m", "draftgen", "run", notebook, "--name", name, "--out-root", str(out_root)]
    command.append("--no-html")
    for key, value in params.items():
        command += ["-p", key, value if isinstance(value, str) else json.dumps(value)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=os.environ.copy()
    )
    run_dir = out_root / notebook / name
    if done.returncode != 0:
        executed = run_dir / f"{notebook}.ipynb"
        text = notebook_text(executed)[-6000:] if executed.exists() else "(no executed notebook)"
        raise NotebookRunFailed(
            f"draftgen run {notebook} exited {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
            f"stderr:\n{done.stderr[-3000:]}\nnotebook output:\n{text}"
        )
    return run_dir
