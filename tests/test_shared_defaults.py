"""draftgen's shared defaults, each defined once: the fleet, the model, SGLang's MTP numbers, and every notebook
parameter several steps take (docs/design.md, "Shared parameter names").

A parameter declared in two step configs must be the one declaration of ``draftgen.params`` (same type, default,
help and checks), unless it is listed below with why each step means something of its own by it. The params
files and the commands' flags must restate the same values.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.fields import FieldInfo

from draftgen import defaults
from draftgen.commands import demo, serve, sim
from draftgen.generate.config import GenerateConfig
from draftgen.params import NOTEBOOK_FLEET, NOTEBOOK_MODEL, SHARED_PARAMETERS, Params
from draftgen.serve.config import ServeConfig
from draftgen.server_settings import MTP_DEFAULT
from draftgen.sglang_rules.speculation import AUTO_NUMBERS
from draftgen.sim.fleet import SimFleet
from draftgen.sim.server import parse_args as sim_server_args
from draftgen.steps import STEPS
from draftgen.tune.config import TuneConfig
from draftgen.validate.config import ValidateConfig

PARAMS = Path(__file__).resolve().parents[1] / "params"

# Names more than one step declares, each step with a meaning (or a default that follows from it) of its own.
PER_STEP = {
    "out_dir": "each step's own run folder",
    "seed": "each step seeds its own random draws",
    "prompts": "generate needs the set to generate named; benchmark, estimate and tune measure or count a sample "
    "and default to the bundled one",
    "model": "tune's is the --model-path it launches the candidates with (also their served name)",
    "gpus": "tune's are GPU indices to launch on (as serve's --gpus), estimate's a count of GPUs to price",
    "dataset_size": "estimate counts its prompt file when 0; tune's prompts are a held-out sample, nothing to count",
    "tokenizer": "the same folder, the target model's: validate cannot build its rows without it; generate only counts "
    "prompts with it to cap max_tokens at the trainer's max_length, and runs uncapped without one",
}


def _declaration(field: FieldInfo) -> tuple[Any, ...]:
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    return (
        repr(field.annotation),
        field.is_required(),
        repr(default),
        field.description,
        repr(field.metadata),
        repr(field.json_schema_extra),
    )


def _declared_by() -> dict[str, dict[str, FieldInfo]]:
    by_name: dict[str, dict[str, FieldInfo]] = {}
    for step in STEPS:
        for name, field in step.config_class().model_fields.items():
            by_name.setdefault(name, {})[step.name] = field
    return by_name


def test_a_parameter_several_steps_take_is_declared_once():
    shared = {name: steps for name, steps in _declared_by().items() if len(steps) > 1}
    assert {"max_tokens", "concurrency_per_server", "bootstrap", "warmup_requests"} <= set(shared)
    drifted = {
        name: sorted(steps)
        for name, steps in shared.items()
        if name not in PER_STEP and len({_declaration(f) for f in steps.values()}) > 1
    }
    assert drifted == {}, (
        f"declared more than once, differently: {drifted} (declare them once in draftgen.params)"
    )
    assert set(PER_STEP) <= set(shared), "a PER_STEP name no longer taken by two steps: drop it from the list"


def test_every_shared_name_is_a_parameter_a_step_takes():
    """A params file may set a shared name for the whole pipeline; each is a parameter of some step."""
    declared = _declared_by()
    assert sorted(name for name in SHARED_PARAMETERS if name not in declared) == []


def test_the_folded_defaults_are_the_ones_argued_for():
    fields = _declared_by()
    # bootstrap: 300 resamples (the estimate had 200): 15 draws beyond each end of a 90% interval instead of 10,
    # which tune's tie between candidates rests on, for ~2 s more of an estimate's bootstrap on seven servers.
    assert {f.default for f in fields["bootstrap"].values()} == {300}
    # warm-up: 4 requests at once (tune had 2): the same wall time as 2, the benchmark's and params/tune.yaml's.
    assert {f.default for f in fields["warmup_requests"].values()} == {4}
    # concurrency_per_server: generate's and the estimate's production concurrency, one meaning; tune's verdict
    # level is a name of its own
    assert set(fields["concurrency_per_server"]) == {"generate", "estimate"}
    assert "verdict_concurrency" in TuneConfig.model_fields


def _default(parser: argparse.ArgumentParser, dest: str) -> Any:
    return next(action.default for action in parser._actions if action.dest == dest)


def _command(module: Any) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    module.add_command(parser.add_subparsers())
    return next(iter(parser._subparsers._group_actions[0].choices.values()))  # type: ignore[union-attr]


def test_fleet_port_and_model_are_one_value_everywhere():
    assert NOTEBOOK_FLEET == defaults.fleet_urls() and len(NOTEBOOK_FLEET) == defaults.FLEET_SIZE
    assert NOTEBOOK_FLEET[0] == f"http://{defaults.HOST}:{defaults.BASE_PORT}"
    assert NOTEBOOK_MODEL == defaults.MODEL
    assert ServeConfig(model="m", gpus="0", run_name="r").base_port == defaults.BASE_PORT
    assert TuneConfig.model_fields["base_port"].default == defaults.BASE_PORT
    sim_parser, serve_parser, demo_parser = _command(sim), _command(serve), _command(demo)
    assert _default(sim_parser, "base_port") == _default(serve_parser, "base_port") == defaults.BASE_PORT
    assert _default(sim_parser, "servers") == _default(demo_parser, "servers") == defaults.FLEET_SIZE
    assert _default(sim_parser, "model") == sim_server_args(["--port", "1"]).model == defaults.MODEL
    assert SimFleet.__dataclass_fields__["model"].default == defaults.MODEL  # type: ignore[attr-defined]
    assert "(default 30000)" in sim_parser.format_help().replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize(("name", "model"), [("b200x7", ""), ("sim", defaults.MODEL)])
def test_the_pipeline_params_files_name_the_one_fleet_and_model(name, model):
    """The production file leaves the model to the servers ("": the one they all list); the simulated fleet's
    file names the simulator's. Both keep the production concurrency, which serve's batch cap matches."""
    values = yaml.safe_load((PARAMS / f"{name}.yaml").read_text())
    assert values["servers"] == defaults.fleet_urls()
    assert values["model"] == model
    assert values["concurrency_per_server"] == defaults.CONCURRENCY_PER_SERVER
    assert ServeConfig(model="m", gpus="0", run_name="r").batch_cap == defaults.CONCURRENCY_PER_SERVER
    assert ServeConfig(model="m", gpus="0", run_name="r", mtp=False).batch_cap is None  # SGLang's own


def test_the_production_file_names_the_trainer_and_its_max_length_as_every_step_declares_them():
    """train_max_length and trainer: one name each, read by generate (the cap) and validate (the masks, the cut)
    alike, at the values they declare."""
    values = yaml.safe_load((PARAMS / "b200x7.yaml").read_text())
    for name in ("train_max_length", "trainer"):
        assert name in SHARED_PARAMETERS
        for config in (GenerateConfig, ValidateConfig):
            assert config.model_fields[name].default == values[name], (config.__name__, name)
    assert "max_length" not in ValidateConfig.model_fields  # no second name for the same number


def _definition_default(name: str) -> Any:
    for step in STEPS:
        field = step.config_class().model_fields.get(name)
        if field is not None and not field.is_required():
            return field.get_default(call_default_factory=True)
    raise KeyError(name)


@pytest.mark.parametrize(("name", "differs"), [("b200x7", {}), ("sim", {"request_timeout_s": 600.0})])
def test_the_production_params_files_restate_the_definitions_defaults(name, differs):
    """b200x7.yaml is the production settings spelled out for editing, sim.yaml the same on the simulated fleet
    (a shorter request time limit: a simulated request never takes half an hour)."""
    values = yaml.safe_load((PARAMS / f"{name}.yaml").read_text())
    restated = {k: v for k, v in values.items() if k not in ("servers", "model", "prompts")}
    assert restated == {k: differs.get(k, _definition_default(k)) for k in restated}


def test_tune_params_file_measures_at_the_production_sampling_and_the_shared_mtp():
    values = yaml.safe_load((PARAMS / "tune.yaml").read_text())
    for name in (
        "max_tokens",
        "temperature",
        "top_p",
        "enable_thinking",
        "warmup_requests",
        "request_timeout_s",
    ):
        assert values[name] == _definition_default(name), name
    assert values["base_port"] == defaults.BASE_PORT
    assert values["verdict_baseline"] == AUTO_NUMBERS.as_list() in values["spec_candidates"]
    assert MTP_DEFAULT.speculative_algorithm == values["speculative_algorithm"]


def test_every_step_config_is_a_params_model():
    assert all(issubclass(step.config_class(), Params) for step in STEPS)
