"""A JupyterLab server from this venv and a notebook tab in headless Chromium, driven like a person would.

The server runs on 127.0.0.1 on a free port with a fixed random token; its runtime, config, settings and
workspace folders live in a temporary directory, so nothing from ``~/.jupyter`` or an earlier run leaks in.
Chromium is Debian's (``/usr/bin/chromium``), started by Playwright with ``executable_path``: no browser is
downloaded.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# JupyterLab user settings for a test browser: no news/update toasts over the notebook, and every cell kept in
# the page (the default windowing mode leaves cells scrolled out of view out of the DOM).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LabServer:
    root: Path  # the folder Lab shows (the project root)
    state: Path  # runtime/config/settings/workspaces of this server only
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> LabServer:
        settings = self.state / "settings"
        for name, values in LAB_SETTINGS.items():
            path = settings / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(self.state / "runtime"),
            "JUPYTER_CONFIG_DIR": str(self.state / "config"),
            "IPYTHONDIR": str(self.state / "ipython"),
        }
        env.pop("DRAFTGEN_ROOT", None)  # the kernel must find the project root by itself
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            "--allow-root",  # CI runs as root
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={self.state / 'workspaces'}",
        ]
        with open(self.state / "lab.log", "wb") as log:  # the server keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                command, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited:\n{self.log_tail()}")
            try:
                self.api("status")
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"jupyter lab not up after {timeout} s:\n{self.log_tail()}")

    def api(self, path: str) -> Any:
        request = urllib.request.Request(
            f"{self.url}/api/{path}", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def notebook_url(self, relative: str) -> str:
        return f"{self.url}/lab/tree/{relative}?token={self.token}&reset"

    def kernel_states(self) -> dict[str, str]:
        """Notebook path → its kernel's execution state, from the server's sessions."""
        return {s["path"]: s["kernel"]["execution_state"] for s in self.api("sessions")}

    def log_tail(self, lines: int = 40) -> str:
        path = self.state / "lab.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # jupyter shuts its kernels down on SIGTERM
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=10)


# ----- one notebook tab ---------------------------------------------------------------------------------------
PROMPT_RUNNING = "[*]"


@dataclass
class NotebookTab:
    """A notebook open in Lab. ``page`` is a Playwright page; every action goes through Lab's own UI."""

    page: Any
    server: LabServer
    path: str  # relative to the server's root, e.g. notebooks/generate.ipynb

    def open(self) -> NotebookTab:
        self.page.goto(self.server.notebook_url(self.path))
        self.page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
        self.wait_kernel_idle(timeout=60)
        return self

    # -- actions, the way a person does them
    def run_all(self) -> None:
        """Run → Run All Cells, from the menu bar."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    def interrupt(self) -> None:
        """The notebook toolbar's ■ (Interrupt the kernel) button."""
        self.page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:interrupt-kernel']").click()

    def save(self) -> dict:
        """Ctrl+S, then the saved notebook as the server has it on disk."""
        self.page.locator(".jp-NotebookPanel .jp-Notebook").click(position={"x": 5, "y": 5})
        before = self.saved_mtime()
        self.page.keyboard.press("Control+s")
        deadline = time.monotonic() + 30
        while self.saved_mtime() == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.saved_mtime() != before, "the notebook was not saved"
        while True:  # the server may still be writing the file it just touched: read it once it is whole
            try:
                return json.loads((self.server.root / self.path).read_text())
            except json.JSONDecodeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def saved_mtime(self) -> float:
        return (self.server.root / self.path).stat().st_mtime

    # -- what the page shows
    def prompts(self) -> list[str]:
        """Each code cell's execution prompt as shown: "[3]:", "[*]:", "[ ]:"."""
        return self.page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt").all_inner_texts()

    def error_texts(self) -> list[str]:
        """Error outputs shown in the page (a traceback's text)."""
        return self.page.locator(
            ".jp-NotebookPanel .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts()

    def show_cell_output(self, source_fragment: str) -> bool:
        """Scroll the cell whose source holds ``source_fragment`` into view; is its output on screen?"""
        output = self.page.locator(".jp-NotebookPanel .jp-CodeCell", has_text=source_fragment).locator(
            ".jp-OutputArea"
        )
        output.scroll_into_view_if_needed()
        return output.is_visible()

    def cell_output_text(self, source_fragment: str) -> str:
        cell = self.page.locator(".jp-NotebookPanel .jp-CodeCell", has_text=source_fragment)
        return "\n".join(cell.locator(".jp-OutputArea").all_inner_texts())

    def images(self) -> list[dict]:
        """Every image in an output area: its decoded size (0 when the browser could not render it)."""
        return self.page.locator(".jp-NotebookPanel .jp-OutputArea-output img").evaluate_all(
            "imgs => imgs.map(i => ({w: i.naturalWidth, h: i.naturalHeight, complete: i.complete}))"
        )

    def execution_indicator(self) -> str | None:
        return self.page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator").get_attribute(
            "data-status"
        )

    # -- waiting
    def wait_kernel_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.kernel_states().get(self.path) == "idle":
                return
            time.sleep(0.3)
        raise AssertionError(
            f"kernel of {self.path} not idle after {timeout} s: {self.server.kernel_states()}"
        )

    def wait_started(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while PROMPT_RUNNING not in "".join(self.prompts()):
            assert time.monotonic() < deadline, "Run All did not start any cell"
            time.sleep(0.1)

    def wait_finished(self, timeout: float) -> list[str]:
        """Until no cell is running or queued; returns the prompts. Fails early on an error output."""
        deadline = time.monotonic() + timeout
        while True:
            prompts = self.prompts()
            if not any(PROMPT_RUNNING in p for p in prompts):
                return prompts
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.path} still running after {timeout} s: {prompts}")
            time.sleep(0.25)

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))

    def screenshot_images(self, folder: Path, stem: str) -> list[Path]:
        """One PNG per rendered figure (each scrolled into view first), for a person to look at."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        images = self.page.locator(".jp-NotebookPanel .jp-OutputArea-output img")
        for index in range(images.count()):
            path = folder / f"{stem}-figure-{index + 1}.png"
            images.nth(index).screenshot(path=str(path))
            written.append(path)
        return written


def saved_outputs(nb: dict) -> list[dict]:
    return [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]


def saved_errors(nb: dict) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for o in saved_outputs(nb) if o.get("output_type") == "error"]


def saved_image_count(nb: dict) -> int:
    return sum(1 for o in saved_outputs(nb) if "image/png" in o.get("data", {}))
