"""Run a step into its own run folder, ``outputs/<step>/<run>/``: its notebook under papermill (``draftgen run``, the
demo), or its ``run(config)`` in this process (``draftgen tune``). One runner, so the folder's name, its
``parameters.yaml``, its ``.complete`` marker and the never-overwrite rule are the same whichever face runs it.

Parameters are checked against the notebook's declared parameters and its config class before a kernel starts,
so a typo or a wrong type costs a second, not a GPU-hour. A finished run is never overwritten. A new run that a check
before any work refused (``exit_codes.Refused``: the servers, the inputs) leaves its folder marked ``.refused``: the
name stays free, and the next run of that name starts over there. The step's
``run(config)`` opens its folder and marks it finished itself (``draftgen.rundir.run_folder``), in the kernel as
in JupyterLab; the runner does so only for a run folder the step does not write (monitor's, or one whose
``out_dir`` points elsewhere), and adds the executed notebook and report.html.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import difflib
import inspect
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from draftgen.exit_codes import Refused, refusal_names
from draftgen.params import SHARED_PARAMETERS, ParameterError, Params, build_config, load_params_files
from draftgen.paths import project_root, resolve_path
from draftgen.rundir import RunFolderLease, finish_run, is_disk_full
from draftgen.rundir.layout import LOCK, REPORT_HTML
from draftgen.rundir.run_folder import is_finished, record_parameters, record_refusal, was_refused
from draftgen.steps import Step, get_step

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunPlan:
    notebook: Path | None  # None: the step's run(config) in this process (a command), no kernel
    run_dir: Path
    parameters: dict[str, Any]
    name: str
    step: Step | None = None  # what draftgen.steps knows of it (None: a notebook of no step)

    @property
    def executed_path(self) -> Path:
        assert self.notebook is not None, "a command's run has no notebook"
        return self.run_dir / self.notebook.name

    @property
    def step_owns_folder(self) -> bool:
        """Whether the step's ``run(config)`` opens and finishes the run folder itself: its output parameter is the
        run folder. Otherwise (monitor, an ``out_dir`` elsewhere, a notebook of no step) the runner does."""
        if self.step is None or self.step.output_parameter is None:
            return False
        output = resolve_path(self.step.output_folder(self.parameters, self.run_dir))
        return output.resolve() == resolve_path(self.run_dir).resolve()

    @property
    def html_path(self) -> Path:
        return self.run_dir / REPORT_HTML


def resolve_notebook(name_or_path: str) -> Path:
    """``generate`` → notebooks/generate.ipynb (from the project root, else the source checkout)."""
    candidate = resolve_path(name_or_path)
    if candidate.suffix == ".ipynb":
        if candidate.exists():
            return candidate
        raise FileNotFoundError(f"notebook {candidate} does not exist")
    for root in (project_root(), REPO_ROOT):
        path = root / "notebooks" / f"{name_or_path}.ipynb"
        if path.exists():
            return path
    available = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    raise FileNotFoundError(
        f"no notebook named {name_or_path!r}; available: {', '.join(available) or 'none'}"
    )


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The parameters cell's names and literal default values."""
    nb = json.loads(notebook.read_text())
    for cell in nb.get("cells", []):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell.get("source", ""))
            values: dict[str, Any] = {}
            for node in ast.parse(source).body:
                target = None
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    target, value = node.target.id, node.value
                elif (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    target, value = node.targets[0].id, node.value
                if target is not None and value is not None:
                    try:
                        values[target] = ast.literal_eval(value)
                    except ValueError:
                        values[target] = None
            return values
    raise ValueError(f"{notebook} has no cell tagged 'parameters'")


def step_of(notebook: Path) -> Step | None:
    """The step the notebook's metadata names (``"draftgen": {"step": NAME}``; None: a notebook of no step)."""
    nb = json.loads(notebook.read_text())
    name = nb.get("metadata", {}).get("draftgen", {}).get("step")
    if not name:
        return None
    try:
        return get_step(name)
    except KeyError as exc:
        raise ValueError(f"{notebook}: metadata draftgen.step: {exc.args[0]}") from None


def config_class(notebook: Path) -> type[Params] | None:
    """The config model of the notebook's step (None: a notebook of no step)."""
    step = step_of(notebook)
    return step.config_class() if step is not None else None


def applicable_parameters(
    declared: Collection[str], given: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """(the given parameters a step takes, the shared names it ignores), for a step that ``declared`` these names
    (its notebook's parameters cell, or its config's fields). Unknown non-shared names stay in, to be rejected."""
    kept = {k: v for k, v in given.items() if k in declared or k not in SHARED_PARAMETERS}
    return kept, sorted(k for k in given if k not in kept)


def taken_parameters(
    declared: Collection[str], given: Mapping[str, Any], *, command: str, step: str
) -> dict[str, Any]:
    """``applicable_parameters``, saying which shared names ``step`` ignores (``draftgen COMMAND: ...``)."""
    kept, ignored = applicable_parameters(declared, given)
    if ignored:
        print(f"draftgen {command}: {step} does not use shared parameter(s) {', '.join(ignored)}: ignored")
    return kept


def check_parameters(notebook: Path, given: Mapping[str, Any]) -> None:
    """Every problem at once: unknown names, then the config's own validation of defaults + given values."""
    declared = declared_parameters(notebook)
    model = config_class(notebook)
    merged = {**declared, **given}
    if model is not None:
        build_config(model, merged)
        return
    unknown = []
    for name in given:
        if name not in declared:
            close = difflib.get_close_matches(name, sorted(declared), n=1)
            unknown.append((name, "unknown parameter" + (f"; did you mean {close[0]!r}?" if close else "")))
    if unknown:
        raise ParameterError(unknown)


def parse_cli_value(text: str) -> Any:
    """``-p KEY VALUE`` values are YAML scalars/lists: 64 → int, true → bool, [a, b] → list."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def add_parameter_options(parser: argparse.ArgumentParser) -> None:
    """``-f YAML`` (repeatable) and ``-p KEY VALUE``: how ``draftgen run`` and ``draftgen tune`` take parameters."""
    parser.add_argument(
        "-f",
        "--parameters-file",
        action="append",
        default=[],
        type=resolve_path,
        metavar="YAML",
        help="parameter file; repeat to merge left to right (relative: under the project root)",
    )
    parser.add_argument(
        "-p",
        "--parameter",
        action="append",
        nargs=2,
        default=[],
        metavar=("KEY", "VALUE"),
        help="one parameter (VALUE parsed as YAML: 64, true, [a, b])",
    )


def add_run_folder_options(parser: argparse.ArgumentParser, resume_help: str) -> None:
    """``--name``, ``--out-root`` and ``--resume``: where ``draftgen run`` and ``draftgen tune`` put a run folder."""
    parser.add_argument("--name", help="run folder name (default: <params-file>-<timestamp>)")
    parser.add_argument(
        "--out-root",
        type=resolve_path,
        default="outputs",
        help="root of run folders (default outputs; relative: under the project root, docs/design.md#paths)",
    )
    parser.add_argument("--resume", action="store_true", help=resume_help)


def run_label(args: argparse.Namespace) -> str:
    """A run folder's default name before its timestamp: the ``-f`` files' stems (``run`` without any)."""
    return "-".join(p.stem for p in args.parameters_file) or "run"


def cli_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The ``-f`` files merged left to right, then each ``-p KEY VALUE`` over them."""
    values = load_params_files(args.parameters_file)
    for key, value in args.parameter:
        values[key] = parse_cli_value(value)
    return values


def plan_run(
    notebook: Path | None,
    parameters: Mapping[str, Any],
    *,
    name: str | None,
    out_root: Path,
    resume: bool = False,
    label: str = "run",
    step: Step | None = None,
) -> RunPlan:
    """The run folder ``out_root/<step>/<name>`` (default name ``<label>-<timestamp>``) and the parameters the run
    gets: a finished folder is refused, an unfinished one without ``resume`` too. ``notebook`` None: a command's run
    of ``step``, no kernel."""
    if notebook is not None:
        step = step_of(notebook)
    assert notebook is not None or step is not None, "a run is of a notebook or of a step"
    run_name = name or f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = out_root / (notebook.stem if notebook is not None else step.name) / run_name  # type: ignore[union-attr]
    if is_finished(run_dir):
        raise ValueError(
            f"run {run_dir} already finished; pick another --name (finished runs are never overwritten)"
        )
    if run_dir.exists() and any(run_dir.iterdir()) and not resume and not was_refused(run_dir):
        raise ValueError(
            f"run {run_dir} exists but did not finish; pass --resume to continue it, or another --name"
        )
    run_parameters = step.run_parameters(run_dir, resume=resume) if step is not None else {}
    params = {**run_parameters, **parameters}
    return RunPlan(notebook=notebook, run_dir=run_dir, parameters=params, name=run_name, step=step)


def write_html(executed: Path, html_path: Path) -> None:
    """report.html: the headline first, code hidden, progress streams reduced to their final line
    (``draftgen.display.report_html``)."""
    from draftgen.display.report_html import write_report

    write_report(executed, html_path)


def headline(plan: RunPlan) -> str | None:
    """The executed notebook's headline block as text (None: its headline cell did not run)."""
    from draftgen.display.report_html import headline_text

    if not plan.executed_path.exists():
        return None
    return headline_text(json.loads(plan.executed_path.read_text()))


def local_kernel_config(socket_dir: Path) -> Any:
    """Kernel manager settings: talk to the kernel over Unix sockets in ``socket_dir``, not TCP on localhost.

    ipykernel warns "Kernel is running over TCP without encryption" for every TCP kernel (anyone on the host
    could connect to its localhost ports). IPC sockets live in a private temporary folder (mode 0700), so there
    is nothing to encrypt and nothing to warn about; the folder also keeps two runs' sockets apart (the default
    IPC name, ``kernel-ipc-N`` in the kernel's working directory, would collide between runs in one root).
    """
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "ip": str(socket_dir / "kernel")}})


def plan_folders(plan: RunPlan) -> list[Path]:
    """The run folder, and the step's output folder when a parameter puts it elsewhere."""
    folders = {resolve_path(plan.run_dir)}
    if plan.step is not None:
        folders.add(resolve_path(plan.step.output_folder(plan.parameters, plan.run_dir)))
    return sorted(folders)


def new_folders(plan: RunPlan) -> list[Path]:
    """The plan's folders that hold no run yet: missing, empty, or left by a refused run. A refusal gives these
    back (``mark_refused``); a folder with work in it stays the run's, for ``--resume``."""
    return [f for f in plan_folders(plan) if not f.exists() or not any(f.iterdir()) or was_refused(f)]


def is_refusal(plan: RunPlan, exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal (``exit_codes.Refused``), raised here or in the notebook's kernel: papermill's
    error names the kernel's exception class only, so the step's modules (which define the refusals it raises) are
    imported to know the names."""
    if isinstance(exc, Refused):
        return True
    name = getattr(exc, "ename", None)
    if not name:
        return False
    if plan.step is not None:
        plan.step.run_function()
    return name in refusal_names()


def mark_refused(folders: list[Path], exc: BaseException) -> None:
    """Mark each of ``folders`` (new before the run) as left by a refused run: its name stays free."""
    said = getattr(exc, "evalue", None) or str(exc)
    for folder in folders:
        record_refusal(folder, said)


def open_run_folder(plan: RunPlan) -> None:
    """Create the run folder (and the step's output folder, when a parameter puts it elsewhere) and clear what
    interrupted writes left there, under the folder's lease for that moment (``rundir.lease``): every step's
    folder is opened the same way. Another process writing there is refused (``RunFolderBusy``). A folder a
    refused run left is emptied first: the run starts over there."""
    for folder in plan_folders(plan):
        with RunFolderLease.acquire(folder, advice="pick another --name"):
            if not was_refused(folder):
                continue
            for item in folder.iterdir():
                if item.is_dir():
                    shutil.rmtree(item)
                elif item.name != LOCK:
                    item.unlink()


def execute(plan: RunPlan, *, kernel: str = "python3", html: bool = True, log_output: bool = True) -> RunPlan:
    """Execute the notebook with papermill; the executed notebook and HTML are written even when it fails.

    The kernel starts in the project root, so it resolves relative path parameters as this process did. Papermill
    saves the executed notebook through ``replace_file`` (``rundir.notebook_io``), so it is always whole. The
    step's ``run(config)`` in the kernel records the parameters and marks the folder finished; for a folder the
    step does not write, this does.
    """
    import papermill

    from draftgen.rundir import notebook_io

    assert plan.notebook is not None, "a command's run goes through run_here"
    fresh = new_folders(plan)
    open_run_folder(plan)
    notebook_io.register()
    if not plan.step_owns_folder:
        record_parameters(plan.run_dir, plan.parameters)
    try:
        with tempfile.TemporaryDirectory(prefix="draftgen-kernel-") as sockets:
            papermill.execute_notebook(
                str(plan.notebook),
                str(plan.executed_path.absolute()),
                parameters=plan.parameters,
                kernel_name=kernel,
                log_output=log_output,
                progress_bar=False,
                cwd=str(project_root()),
                config=local_kernel_config(Path(sockets)),
            )
    except BaseException as exc:
        if is_refusal(plan, exc):
            mark_refused(fresh, exc)
        if html and plan.executed_path.exists() and not is_disk_full(exc):
            try:  # the report of a failed run is a courtesy: it never hides the notebook's own error
                write_html(plan.executed_path, plan.html_path)
            except Exception as exc:
                print(
                    f"draftgen run: report.html not written ({type(exc).__name__}: {exc})"[:300],
                    file=sys.stderr,
                )
        raise
    if html and plan.executed_path.exists():
        write_html(plan.executed_path, plan.html_path)
    if not plan.step_owns_folder:
        finish_run(plan.run_dir)
    return plan


def run_here(plan: RunPlan) -> Any:
    """The step's ``run(config)`` in this process, into the plan's run folder: a command's face of the runner
    (``draftgen tune``), the same folder a notebook's run leaves but for the executed notebook and its report.
    A command-line entry point: an async step is run with ``asyncio.run``."""
    assert plan.step is not None and plan.notebook is None, "run_here runs a step, not a notebook"
    config = build_config(plan.step.config_class(), plan.parameters)
    fresh = new_folders(plan)
    open_run_folder(plan)
    if not plan.step_owns_folder:
        record_parameters(plan.run_dir, plan.parameters)
    try:
        result = plan.step.run_function()(config)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
    except Refused as exc:
        mark_refused(fresh, exc)
        raise
    if not plan.step_owns_folder:
        finish_run(plan.run_dir)
    return result
