"""The steps draftgen runs as notebooks, and what generic code needs to know about each (docs/design.md#the-steps).

``draftgen run``, ``draftgen tune``, the demo and the parameters-cell tools read this table instead of branching on
a notebook's name: which config class holds a step's parameters, the one function that runs the whole step
(``run(config) -> result``: the notebook calls it, then only shows the result), which parameter receives the run
folder, how ``--resume`` continues an unfinished run, what the step writes (declared in ``draftgen.rundir.layout``),
and what a full disk must leave recorded. A notebook names its step in its metadata
(``"draftgen": {"step": "generate"}``). A new step is a row here, its files a tuple of the layout; a new parameter
of one is a field of its config class, which the notebook's cell, the checks and the docs' tables all read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.rundir import layout
from draftgen.rundir.layout import Entry

if TYPE_CHECKING:
    from draftgen.params import Params


def _load(spec: str) -> Any:
    """``"package.module:name"`` → the object (imported when first asked: ``draftgen run --help`` stays quick)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Step:
    """One notebook step: ``notebooks/<name>.ipynb``, run into ``outputs/<name>/<run>/``."""

    name: str
    config: str  # "module:Class": the parameters it takes
    # "module:function": run(config) -> result, the whole step (a coroutine function for an async step)
    run: str
    files: tuple[
        Entry, ...
    ]  # what its folder holds beside layout.RUN_FILES (a notebook's run: NOTEBOOK_FILES)
    output_parameter: str | None = "out_dir"  # the parameter draftgen run sets to the run folder (None: none)
    resume: str = ""  # what --resume does with an unfinished run folder ("": it starts the step over there)
    resume_parameter: str | None = None  # the parameter --resume sets to True
    on_disk_full: str | None = (
        None  # "module:function(folder, executed, detail)": record a full disk it missed
    )
    kept_on_disk_full: str = "finished work is kept"

    def config_class(self) -> type[Params]:
        return _load(self.config)

    def run_function(self) -> Callable[..., Any]:
        """The step's ``run(config)``."""
        return _load(self.run)

    @property
    def writes(self) -> str:
        """Its files in a phrase (``draftgen run --help``), each conditional one with its condition."""
        names = [f"{e.path} ({e.when})" if e.when else e.path for e in self.files]
        return ", ".join(names) or "nothing of its own"

    def run_parameters(self, run_dir: Path, *, resume: bool) -> dict[str, Any]:
        """The parameters ``draftgen run`` sets for a run in ``run_dir`` (given values take precedence)."""
        values: dict[str, Any] = {}
        if self.output_parameter is not None:
            values[self.output_parameter] = str(run_dir)
        if resume and self.resume_parameter is not None:
            values[self.resume_parameter] = True
        return values

    def output_folder(self, parameters: dict[str, Any], run_dir: Path) -> Path:
        """Where the step wrote its results: its output parameter's value, else the run folder."""
        value = parameters.get(self.output_parameter) if self.output_parameter else None
        return Path(value) if value else run_dir

    def disk_full_recorder(self) -> Callable[[Path, Path, str], None] | None:
        """What records a full disk the step could not record itself (None: nothing to record)."""
        return _load(self.on_disk_full) if self.on_disk_full else None


STEPS = (
    Step(
        "generate",
        "draftgen.generate.config:GenerateConfig",
        "draftgen.generate.step:run",
        layout.GENERATE_FILES,
        resume="skips the prompts already stored",
        on_disk_full="draftgen.generate.disk_full:record_after_kernel",
        kept_on_disk_full="finished work is kept (whole shards, manifest.json 'disk full')",
    ),
    Step(
        "benchmark",
        "draftgen.bench.config:BenchmarkConfig",
        "draftgen.bench.step:run",
        layout.BENCHMARK_FILES,
        resume="reuses the levels already measured",
        resume_parameter="resume",
    ),
    Step(
        "estimate",
        "draftgen.estimate.config:EstimateConfig",
        "draftgen.estimate.step:run",
        layout.ESTIMATE_FILES,
    ),
    Step(
        "validate",
        "draftgen.validate.config:ValidateConfig",
        "draftgen.validate.step:run",
        layout.VALIDATE_FILES,
    ),
    Step("tune", "draftgen.tune.config:TuneConfig", "draftgen.tune.step:run", layout.TUNE_FILES),
    Step(
        "monitor",
        "draftgen.watch.monitor:MonitorConfig",
        "draftgen.watch.step:run",
        layout.MONITOR_FILES,  # read-only: it reads a generate run folder (run_dir) and writes nothing
        output_parameter=None,
    ),
)


def get_step(name: str) -> Step:
    """The step called ``name``; a clear error naming the steps otherwise."""
    for step in STEPS:
        if step.name == name:
            return step
    raise KeyError(f"no step named {name!r}; the steps are {', '.join(s.name for s in STEPS)}")
