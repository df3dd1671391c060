"""What another Python environment holds, asked of its own interpreter in one short subprocess.

SGLang and draftgen live in two environments: SGLang 0.5.23 pins ``openai==2.8.0`` and draftgen needs ``openai>=3``,
so installing either into the other's breaks one of them. ``draftgen serve`` runs in draftgen's and starts SGLang
with SGLang's interpreter (``--python``, or ``$DRAFTGEN_SGLANG_PYTHON``); before anything starts it asks that
interpreter what it has — package metadata only, nothing imported, well under a second — so a wrong environment is
one line naming the fix, not a server that dies after loading 50 GB of weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from draftgen.defaults import SGLANG_PYTHON_ENV
from draftgen.exit_codes import Refused
from draftgen.paths import project_root

# Run by the other interpreter: the versions of the packages asked for, and the pins SGLang's metadata declares.
_PROBE = r"""
import importlib.metadata as m, importlib.util as u, json, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
try:
    requires = [r for r in m.requires("sglang") or [] if "extra ==" not in r]
except m.PackageNotFoundError:
    requires = []
print(json.dumps({
    "versions": {name: version(name) for name in sys.argv[1:]},
    "importable": {name: u.find_spec(name) is not None for name in sys.argv[1:]},
    "sglang_requires": requires,
}))
"""
PROBE_TIMEOUT_S = 60.0


class EnvironmentRefused(Refused):
    """The interpreter is there but does not run (a broken environment): nothing was started (exit code REFUSED).
    A path with no interpreter at all is a mistake on the command line (ValueError)."""


@dataclass(frozen=True)
class Environment:
    """One interpreter's packages: version by distribution name (None: not installed), what imports, SGLang's
    declared requirements."""

    python: str
    versions: dict[str, str | None]
    importable: dict[str, bool]
    sglang_requires: tuple[str, ...] = ()

    def pinned(self, name: str) -> str | None:
        """The exact version SGLang's metadata pins ``name`` at (``openai==2.8.0`` → "2.8.0"), if it pins one."""
        for requirement in self.sglang_requires:
            spec = requirement.split(";")[0].replace(" ", "")
            package, sep, version = spec.partition("==")
            if sep and package.split("[")[0].lower() == name and "," not in version:
                return version
        return None


def probe(python: str, *names: str) -> Environment:
    """Ask ``python`` which of ``names`` it has (ValueError: no such interpreter; EnvironmentRefused: it does not
    run)."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, *names],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            cwd=project_root(),  # a relative --python is the project root's, as the servers are started
        )
    except FileNotFoundError:
        raise ValueError(f"{described(python)}: no such interpreter") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentRefused(f"{described(python)}: cannot run it ({exc})") from None
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise EnvironmentRefused(f"{described(python)}: cannot run it ({tail[0][:200]})") from None
    return Environment(python, data["versions"], data["importable"], tuple(data["sglang_requires"]))


def described(python: str) -> str:
    """How a message names an interpreter: draftgen's own, the environment variable's, or the one given."""
    if python == sys.executable:
        return f"this Python ({python}, draftgen's environment)"
    if os.environ.get(SGLANG_PYTHON_ENV) == python:
        return f"${SGLANG_PYTHON_ENV} ({python})"
    return f"--python {python}"
