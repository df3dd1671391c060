"""Notebook parameters → frozen, validated configs, with every problem reported at once.

A notebook's parameters cell holds typed literals; its next cell calls ``config_from_namespace`` (or
``build_config``) which returns a frozen pydantic model or raises ``ParameterError`` listing each bad parameter
by name before any request is sent.
"""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]

Config = TypeVar("Config", bound="Params")

# Names shared across notebooks (docs/design.md#rules-of-the-road-for-notebooks): one YAML file
# (params/b200x7.yaml) may set them for the whole pipeline, and a notebook that does not use one simply
# ignores it. Any other undeclared name is an error.
SHARED_PARAMETERS = frozenset(
    {
        "servers",
        "model",
        "api_key_env",
        "prompts",
        "out_dir",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "enable_thinking",
        "concurrency_per_server",
        "batch_save_size",
        "limit",
        "request_timeout_s",
        "turns",
    }
)


class ParameterError(ValueError):
    """Bad parameters: ``problems`` holds (parameter, what is wrong) pairs, all of them."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        width = max((len(name) for name, _ in problems), default=0)
        lines = [f"  {name.ljust(width)}  {problem}" for name, problem in problems]
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{len(problems)} parameter {noun}:\n" + "\n".join(lines))


class Params(BaseModel):
    """Base of every notebook config: frozen, no unknown fields, no silent type coercion."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def public_dict(self) -> dict[str, Any]:
        """Parameters safe to write next to results (configs hold env-var names, never secrets)."""
        return self.model_dump(mode="json")


def _unset_if_empty(value: Any) -> Any:
    """Notebook literals cannot be ``None`` under papermill: "" and 0 mean "not set" for optional parameters."""
    return None if value == "" or (type(value) in (int, float) and value == 0) else value


class FleetParams(Params):
    servers: list[str] = Field(min_length=1)  # base URLs, one per SGLang server (or one router URL)
    model: str = Field(min_length=1)  # served model name; also the model checked on each server
    api_key_env: str | None = None  # name of the environment variable holding the API key, never the key
    request_timeout_s: PositiveFloat = 1800.0

    @field_validator("servers")
    @classmethod
    def _urls(cls, servers: list[str]) -> list[str]:
        cleaned = []
        for url in servers:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
            url = url.rstrip("/")
            url = url.removesuffix("/v1")
            cleaned.append(url)
        duplicates = sorted({u for u in cleaned if cleaned.count(u) > 1})
        if duplicates:
            raise ValueError(f"listed more than once: {', '.join(duplicates)}")
        return cleaned

    _api_key_env_unset = field_validator("api_key_env", mode="before")(_unset_if_empty)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and (not name or not name.replace("_", "").isalnum() or name[0].isdigit()):
            raise ValueError(
                f"{name!r} is not an environment variable name (give the variable's NAME, not the key)"
            )
        return name

    def api_key(self) -> str:
        """The key from the named environment variable; SGLang without --api-key accepts any value."""
        if self.api_key_env is None:
            return "EMPTY"
        value = os.environ.get(self.api_key_env)
        if value is None:
            raise ParameterError([("api_key_env", f"environment variable {self.api_key_env} is not set")])
        return value


class SamplingParams(Params):
    max_tokens: PositiveInt = 4096
    temperature: NonNegativeFloat = 0.6
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    top_k: PositiveInt | None = None  # sent only to engines that accept non-OpenAI fields
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    enable_thinking: bool = True

    _extras_unset = field_validator("top_k", "min_p", mode="before")(_unset_if_empty)

    @property
    def sampling(self) -> SamplingParams:
        """Only the sampling fields, as a plain SamplingParams (a config extending this class passes it on)."""
        return SamplingParams(**{name: getattr(self, name) for name in SamplingParams.model_fields})


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def build_config(model: type[Config], values: Mapping[str, Any]) -> Config:
    """Validate ``values`` into ``model``; raise ParameterError naming every unknown or ill-typed parameter."""
    known = set(model.model_fields)
    problems: list[tuple[str, str]] = []
    for name in values:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            problems.append((name, "unknown parameter" + (f"; did you mean {close[0]!r}?" if close else "")))
    try:
        config = model.model_validate({k: v for k, v in values.items() if k in known})
    except ValidationError as exc:
        for error in exc.errors():
            location = ".".join(str(part) for part in error["loc"]) or "(config)"
            given = error.get("input")
            detail = error["msg"].removeprefix("Value error, ")
            if error["type"] != "missing":
                detail += f" (got {_describe(given)})"
            problems.append((location, detail))
        config = None
    if problems:
        raise ParameterError(problems)
    assert config is not None
    return config


def injected_parameter_names() -> set[str] | None:
    """Names papermill injected into this kernel ("# Parameters" cell), or None outside papermill/IPython.

    Papermill injects every -p/-f value as an assignment, even names the notebook does not declare; reading
    them back lets the config cell reject a typo like ``maxtokens`` instead of silently ignoring it.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    names: set[str] = set()
    found = False
    for source in shell.user_ns.get("In", []):
        if isinstance(source, str) and source.lstrip().startswith("# Parameters"):
            found = True
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names if found else None


def config_from_namespace(model: type[Config], namespace: Mapping[str, Any]) -> Config:
    """Build a config from a notebook's globals: declared parameters plus anything papermill injected."""
    values = {name: namespace[name] for name in model.model_fields if name in namespace}
    for name in injected_parameter_names() or ():
        if name not in values and name in namespace and name not in SHARED_PARAMETERS:
            values[name] = namespace[name]
    return build_config(model, values)


def load_params_files(paths: Iterable[str | Path]) -> dict[str, Any]:
    """Merge YAML parameter files left to right (like papermill's repeated -f)."""
    merged: dict[str, Any] = {}
    for path in paths:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise FileNotFoundError(f"parameter file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ParameterError([(str(path), f"not valid YAML: {exc}")]) from None
        if not isinstance(data, dict):
            raise ParameterError([(str(path), "must be a mapping of parameter names to values")])
        merged.update(data)
    return merged
