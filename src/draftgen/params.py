"""Notebook parameters → frozen, validated configs, with every problem reported at once.

A notebook's parameters cell holds typed literals; its next cell calls ``config_from_namespace`` (or
``build_config``) which returns a frozen pydantic model or raises ``ParameterError`` listing each bad parameter
by name before any request is sent.

Each parameter is declared once, in its config class: ``param(default, help)`` carries the default and the help
text, and the class's ``parameters_cell`` (a ``NotebookCell``) the notebook's sections and their order. The
notebook's parameters cell is rendered from these (``python -m draftgen.notebook_params --write``); a test fails
when a committed cell differs from its rendering.
"""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_args

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from draftgen.defaults import CONCURRENCY_PER_SERVER, MODEL, fleet_urls
from draftgen.paths import resolve_parameter
from draftgen.server_settings import SettingsFile
from draftgen.sglang_rules.speculation import SPEC_DEFAULT_MAX_RUNNING
from draftgen.training.trainers import DEFAULT_TRAINER, LEGACY_CONVENTIONS, Trainer

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
# A path parameter of a notebook config: resolved against the project root when the config is built (draftgen.paths).
ProjectPath = Annotated[str, AfterValidator(resolve_parameter)]

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
        "train_max_length",
        "min_turn_budget",
        "trainer",
        "category_field",
        "keep_duplicates",
        "sampling_plan",
        "stream",
    }
)


# What the notebooks show for the fleet's required field: the simulated fleet of params/sim.yaml
# (`draftgen sim` with its defaults), so a notebook opened in JupyterLab runs against it as is. Tune's `model` (the
# path SGLang loads) shows the simulator's model name.
NOTEBOOK_FLEET = fleet_urls()
NOTEBOOK_MODEL = MODEL

_NOT_GIVEN: Any = object()


def param(
    default: Any = ..., help: str = "", *, notebook: Any = _NOT_GIVEN, doc: str = "", **field: Any
) -> Any:
    """One notebook parameter, declared once: its default and its help (the ``# comment`` of the notebook's line).

    ``default`` is ``...`` for a required field, which then names ``notebook``: the literal the notebook's cell
    shows (the simulated fleet's URLs, "synthetic", an interactive out_dir). An optional field whose default is
    None shows the literal that means "not set" under papermill ("", 0, 0.0) without saying so. ``doc`` is the
    longer meaning the reference pages' parameter tables show instead of the help (``draftgen.param_tables``).
    Other keywords are pydantic's ``Field`` constraints (``ge``, ``min_length``, ``default_factory``...).
    """
    if not help:
        raise TypeError("param() needs the parameter's help text")
    if notebook is not _NOT_GIVEN and default is not ...:
        raise TypeError(
            "notebook= is for required fields: an optional field's default is what the notebook shows"
        )
    extra = {
        key: value
        for key, value in (("notebook", notebook), ("doc", doc))
        if value is not _NOT_GIVEN and value != ""
    } or None
    if default is ...:
        return Field(description=help, json_schema_extra=extra, **field)
    return Field(default, description=help, json_schema_extra=extra, **field)


class NotebookCell:
    """A config class's parameters cell: its sections in order, each a ``# title`` line over its fields' lines.

    ``sections`` are ``(title, "name name ...")`` pairs (title "" for no header line), naming every field of the
    class once. ``help`` replaces an inherited field's help in this notebook only (where its meaning differs, say
    request_timeout_s: retried in generate, failed in benchmark); ``doc`` its longer meaning on this notebook's
    reference page (``draftgen.param_tables``).
    """

    def __init__(
        self,
        *sections: tuple[str, str],
        help: Mapping[str, str] | None = None,
        doc: Mapping[str, str] | None = None,
    ):
        self.sections: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
            (title, tuple(names.split())) for title, names in sections
        )
        self.help: Mapping[str, str] = dict(help or {})
        self.doc: Mapping[str, str] = dict(doc or {})

    @property
    def names(self) -> list[str]:
        return [name for _, names in self.sections for name in names]


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
    parameters_cell: ClassVar[NotebookCell | None] = None  # a notebook's config sets it: its cell's layout

    @classmethod
    def parameter_help(cls, name: str) -> str:
        """The help text of parameter ``name`` in this class's notebook."""
        cell = cls.parameters_cell
        if cell is not None and name in cell.help:
            return cell.help[name]
        return cls.model_fields[name].description or ""

    def public_dict(self) -> dict[str, Any]:
        """Parameters safe to write next to results (configs hold env-var names, never secrets)."""
        return self.model_dump(mode="json")

    def _repr_html_(self) -> str:
        """In a notebook and its report: the parameters folded under one line, one per row when opened."""
        import html

        from draftgen.display.table import format_value

        values = self.public_dict()
        rows = "".join(
            f"<tr><td style='text-align:left'><code>{html.escape(name)}</code></td>"
            f"<td style='text-align:left;white-space:normal;overflow-wrap:anywhere'>"
            f"{html.escape(format_value(value, 'text') if not isinstance(value, dict) else str(value))}</td></tr>"
            for name, value in values.items()
        )
        return (
            f"<details class='dg-params'><summary>{html.escape(type(self).__name__)}: {len(values)} parameters, "
            f"checked (click to show)</summary><table>{rows}</table></details>"
        )


def declared(annotated: Any) -> tuple[Any, str]:
    """(default, help) of a parameter declared below (``MaxTokens``...): for a command line that takes it too."""
    info = FieldInfo.merge_field_infos(*(a for a in get_args(annotated)[1:] if isinstance(a, FieldInfo)))
    return info.get_default(call_default_factory=True), info.description or ""


def _unset_if_empty(value: Any) -> Any:
    """Notebook literals cannot be ``None`` under papermill: "" and 0 mean "not set" for optional parameters."""
    return None if value == "" or (type(value) in (int, float) and value == 0) else value


def _check_urls(servers: list[str]) -> list[str]:
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


def _check_env_name(name: str | None) -> str | None:
    if name is not None and (not name or not name.replace("_", "").isalnum() or name[0].isdigit()):
        raise ValueError(
            f"{name!r} is not an environment variable name (give the variable's NAME, not the key)"
        )
    return name


# ----- parameters several notebooks take: each declared once, here -------------------------------------------
# A declaration is a type carrying the parameter's default, help and checks; a config takes the parameter by
# giving a field that type (``max_tokens: MaxTokens``), and a notebook whose use of it needs other words says so in
# its ``NotebookCell(help=...)``. tests/test_shared_defaults.py fails when a name is declared twice.
Servers = Annotated[
    list[str],
    AfterValidator(_check_urls),
    param(..., "base URLs: one per SGLang server, or one router URL", notebook=NOTEBOOK_FLEET, min_length=1),
]
# "" (None) is resolved before anything is sent: the one model every server lists in GET /v1/models, so the name the
# servers serve and the name the notebooks ask for cannot disagree, whoever launched the servers
# (draftgen.client.served).
ServedModel = Annotated[
    str | None,
    BeforeValidator(_unset_if_empty),
    param(
        None,
        'served model name, as the servers\' /v1/models report it ("": the one model every server lists)',
    ),
]
ApiKeyEnv = Annotated[
    str | None,
    BeforeValidator(_unset_if_empty),
    AfterValidator(_check_env_name),
    param(None, 'NAME of the environment variable holding the API key, never the key ("": none)'),
]
RequestTimeout = Annotated[PositiveFloat, param(1800.0, "one request's time limit (s)")]
MaxTokens = Annotated[PositiveInt, param(4096, "longest completion, tokens")]
Temperature = Annotated[NonNegativeFloat, param(0.6, "sampling temperature")]
TopP = Annotated[float, param(0.95, "nucleus sampling", gt=0, le=1)]
TopK = Annotated[
    PositiveInt | None,
    BeforeValidator(_unset_if_empty),
    param(None, "top-k sampling (0: not sent); sent only to engines that accept it (SGLang does)"),
]
MinP = Annotated[
    Annotated[float, Field(ge=0, le=1)] | None,
    BeforeValidator(_unset_if_empty),
    param(None, "min-p sampling (0: not sent); like top_k, sent only to engines that accept it"),
]
EnableThinking = Annotated[bool, param(True, "Qwen3 thinking (reasoning_content + answer)")]
# The production run: what generate runs, and what the estimate prices.
ConcurrencyPerServer = Annotated[
    PositiveInt,
    param(
        CONCURRENCY_PER_SERVER,
        "requests kept in flight per server",
        doc=f"requests in flight per server; no server may run fewer at once (SGLang runs {SPEC_DEFAULT_MAX_RUNNING} "
        f"with MTP unless --max-running-requests says otherwise; draftgen serve starts it with "
        f"{CONCURRENCY_PER_SERVER})",
    ),
]
Limit = Annotated[int, param(0, "take the first N valid prompts (0: all)", ge=0)]
CategoryField = Annotated[
    str,
    param(
        "",
        "the prompt rows' field that names their category, for acceptance by category "
        '("": the first of category, task_category, source, task, domain, subset)',
        max_length=100,
    ),
]
# Exact duplicate conversations (the same turns under another id) are skipped by the prompt reader: each is a prompt
# paid for again (draftgen.prompts.rows.iter_prompts). The run that sends them, the estimate that prices them and
# validate's coverage must agree on this, so it is declared once.
KeepDuplicates = Annotated[
    bool,
    param(
        False,
        'send a conversation the prompt file already held under another id (false: set aside as "duplicate of ID")',
    ),
]
Turns = Annotated[
    Literal["all", "last"],
    param(
        "all",
        '"all": regenerate every assistant turn in order, each request carrying the model\'s own earlier answers; '
        '"last": only the final turn',
    ),
]
TrainMaxLength = Annotated[
    int,
    param(4096, "the trainer's max_length: what is generated past it cannot train (0: not checked)", ge=0),
]
# The floor under a turn's budget (draftgen.generate.length_cap): 512 because a turn with less room costs far more
# than it gives — its whole prompt (≥ 3,584 tokens at max_length 4096) is prefilled, and the trainer reads the whole
# max_length row, to supervise at most 1/8 of it; on a long multi-turn set nearly every such turn ends at its limit
# (docs/figures.md, figure 31).
MinTurnBudget = Annotated[
    int,
    param(
        512,
        "a turn the trainer's max_length leaves fewer tokens of room than this is set aside, not sent (0: send all)",
        ge=0,
    ),
]


# Whose loss mask the data is for: validate reproduces it, and generate checks before sending anything that the
# tokenizer's chat template renders what that trainer expects (draftgen.training.template_fit).
def _known_trainer(name: object) -> object:
    if isinstance(name, str) and name not in {t.value for t in Trainer}:
        known = ", ".join(t.value for t in Trainer)
        legacy = LEGACY_CONVENTIONS.get(name)
        hint = f" ({name} is a mask_convention value: trainer {legacy.value})" if legacy else ""
        raise ValueError(f"unknown trainer {name!r}: choose one of {known}{hint}")
    return Trainer(name) if isinstance(name, str) else name


TrainerName = Annotated[
    Trainer,
    BeforeValidator(_known_trainer),
    param(
        DEFAULT_TRAINER,
        f"whose loss mask to reproduce, token for token: {', '.join(t.value for t in Trainer)} (docs/validate.md)",
    ),
]
# Measurements: warm-up before them, intervals around them, and the price of what they measured.
WarmupRequests = Annotated[int, param(4, "short requests per server before measuring (not measured)", ge=0)]
Interval = Annotated[float, param(0.9, "coverage of the bootstrap intervals", gt=0, lt=1)]
Bootstrap = Annotated[int, param(300, "bootstrap resamples behind each interval", ge=10)]
GpuHourUsd = Annotated[NonNegativeFloat, param(6.0, "price of one GPU-hour in dollars (yours)")]
TunedSettings = Annotated[
    SettingsFile, param("", 'settings file from draftgen tune the servers run with (recorded; "": none)')
]


class FleetParams(Params):
    """The servers a notebook talks to, and how."""

    servers: Servers
    model: ServedModel
    api_key_env: ApiKeyEnv
    request_timeout_s: RequestTimeout

    def api_key(self) -> str:
        """The key from the named environment variable; SGLang without --api-key accepts any value."""
        if self.api_key_env is None:
            return "EMPTY"
        value = os.environ.get(self.api_key_env)
        if value is None:
            raise ParameterError([("api_key_env", f"environment variable {self.api_key_env} is not set")])
        return value


class SamplingParams(Params):
    """What every request is sampled with: the production settings by default."""

    max_tokens: MaxTokens
    temperature: Temperature
    top_p: TopP
    top_k: TopK
    min_p: MinP
    enable_thinking: EnableThinking

    @property
    def sampling(self) -> SamplingParams:
        """Only the sampling fields, as a plain SamplingParams (a config extending this class passes it on)."""
        return SamplingParams(**{name: getattr(self, name) for name in SamplingParams.model_fields})


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config's values: the parameter, why, and the value given when one was (a check of
    the whole config gives its reason as a sentence that names the parameters itself)."""

    name: str
    reason: str
    given: Any = _NOT_GIVEN
    missing: bool = False

    @property
    def has_value(self) -> bool:
        """Whether a value was given (a missing parameter, or a check of the whole config, has none)."""
        return self.given is not _NOT_GIVEN

    @property
    def detail(self) -> str:
        """The reason, with the value given."""
        return f"{self.reason} (got {_describe(self.given)})" if self.has_value else self.reason


class Problems(ValueError):
    """Raised by a config's check of several parameters together: every problem it found, each reported under
    its own parameter (``find_problems``), all at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(problem.reason for problem in problems))


def find_problems(model: type[Config], values: Mapping[str, Any]) -> tuple[Config | None, list[Problem]]:
    """Validate ``values`` into ``model``: (the config, []) or (None, every unknown, missing or bad parameter)."""
    known = set(model.model_fields)
    problems: list[Problem] = []
    for name in values:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            problems.append(
                Problem(name, "unknown parameter" + (f"; did you mean {close[0]!r}?" if close else ""))
            )
    try:
        config = model.model_validate({k: v for k, v in values.items() if k in known})
    except ValidationError as exc:
        for error in exc.errors():
            raised = (error.get("ctx") or {}).get("error")
            if isinstance(raised, Problems):
                problems += raised.problems
                continue
            location = ".".join(str(part) for part in error["loc"]) or "(config)"
            reason = error["msg"].removeprefix("Value error, ")
            missing = error["type"] == "missing"
            problems.append(Problem(location, reason, _NOT_GIVEN if missing else error.get("input"), missing))
        config = None
    return (None, problems) if problems else (config, [])


def build_config(model: type[Config], values: Mapping[str, Any]) -> Config:
    """Validate ``values`` into ``model``; raise ParameterError naming every unknown or ill-typed parameter."""
    config, problems = find_problems(model, values)
    if problems:
        raise ParameterError([(problem.name, problem.detail) for problem in problems])
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
