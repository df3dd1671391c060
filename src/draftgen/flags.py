"""A config's fields as a command's flags: each flag's type, default and help are its field's own, and the values
given come back as the config, or as every problem at once, each said in the flag's name.

A config declares its parameters once (``draftgen.params``: ``param(default, help)`` and pydantic's checks); a
command lists which fields it takes and how each is written (``Flag``), and ``add_flags`` builds the argparse
options from the fields. ``draftgen serve`` is built this way (``draftgen.serve.config.SERVE_FLAGS``).
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from draftgen.params import Config, Params, Problem, find_problems
from draftgen.paths import resolve_path

EXTRA = "-- EXTRA"  # how the positional arguments after -- are named


@dataclass(frozen=True)
class Flag:
    """How one field of a config is written on a command line."""

    field: str
    flag: str  # "--timeout"; EXTRA: the arguments after --
    group: str  # the help page's section
    metavar: str | None = None
    negates: bool = False  # a bool field this flag turns off (--no-mtp sets mtp to False)
    required: bool = False  # the command needs it given, whatever the field's default
    note: str = ""  # said in the help instead of the field's default (a negating flag's whole help)
    parse: Callable[[str], Any] | None = None  # text → value, where the field's type does not say (a file)


def spelling(flags: Sequence[Flag]) -> dict[str, str]:
    """Field → how the command writes it (``--timeout``)."""
    return {flag.field: flag.flag for flag in flags}


def _unwrapped(annotation: Any) -> Any:
    """``X | None`` and ``Annotated[X, ...]`` → X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        else:
            return annotation


def _default_text(value: Any) -> str:
    if value is None or isinstance(value, bool) or value in ("", []):
        return ""
    return f" (default {value:g})" if isinstance(value, float) else f" (default {value})"


def add_flags(
    groups: Mapping[str, argparse._ActionsContainer], model: type[Params], flags: Sequence[Flag]
) -> None:
    """One argparse option per flag, in its group: dest the field's name, type, choices, default and help from the
    field. Values not given stay the field's default (a required field's: None, reported by ``config_from_flags``)."""
    for flag in flags:
        field = model.model_fields[flag.field]
        kind = _unwrapped(field.annotation)
        default = (
            None if field.is_required() or flag.required else field.get_default(call_default_factory=True)
        )
        note = "required" if flag.required else flag.note
        text = (field.description or "") + (f" ({note})" if note else _default_text(default))
        if flag.negates:
            text = flag.note
        options: dict[str, Any] = {"help": text.replace("%", "%%"), "default": default}
        if typing.get_origin(kind) is Literal:
            options["choices"] = typing.get_args(kind)
        elif kind is bool:
            options["action"] = "store_false" if flag.negates else "store_true"
        elif typing.get_origin(kind) is list:
            options.update(action="append", type=flag.parse or _unwrapped(typing.get_args(kind)[0]))
        else:
            # a path flag means what every relative path does: under the project root (draftgen.paths)
            options["type"] = flag.parse or (
                resolve_path if kind is Path else kind if kind in (int, float) else str
            )
        if flag.metavar and options.get("action") in (None, "append"):
            options["metavar"] = flag.metavar
        container = groups[flag.group]
        if flag.flag == EXTRA:
            container.add_argument(
                flag.field, nargs="*", metavar=EXTRA, help=options["help"], default=default
            )
        else:
            container.add_argument(flag.flag, dest=flag.field, **options)


def given_values(args: argparse.Namespace, flags: Sequence[Flag]) -> dict[str, Any]:
    """The flags' values by field name; a flag left at None (not given, no default) is left out."""
    values = {flag.field: getattr(args, flag.field) for flag in flags}
    return {name: value for name, value in values.items() if value is not None}


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def problem_line(problem: Problem, model: type[Params], written: Mapping[str, str]) -> str:
    """One problem in the command's words: ``--tp 0: Input should be greater than 0``, ``--model is required: ...``;
    a check of several flags together says its own sentence."""
    name = written.get(problem.name.split(".")[0])
    if name is None:
        return problem.detail if problem.name == "(config)" else f"{problem.name}: {problem.detail}"
    if problem.missing:
        return f"{name} is required: {model.model_fields[problem.name].description}"
    if problem.has_value:
        return f"{name} {_shown(problem.given)}: {problem.reason}"
    return problem.reason


def config_from_flags(model: type[Config], values: Mapping[str, Any], flags: Sequence[Flag]) -> Config:
    """The config, or ValueError listing every problem, one line each, in the flags' names."""
    config, problems = find_problems(model, values)
    absent = [
        Problem(flag.field, "", missing=True) for flag in flags if flag.required and flag.field not in values
    ]
    if config is not None and not absent:
        return config
    problems = absent + [p for p in problems if not (p.missing and p.name in {a.name for a in absent})]
    written = spelling(flags)
    lines = [problem_line(problem, model, written) for problem in problems]
    if len(lines) == 1:
        raise ValueError(lines[0])
    raise ValueError(f"{len(lines)} problems:\n" + "\n".join(f"  {line}" for line in lines))
