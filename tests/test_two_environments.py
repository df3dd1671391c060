"""SGLang and draftgen in two environments: serve asks SGLang's interpreter what it has before anything starts.

SGLang 0.5.23 pins ``openai==2.8.0`` and draftgen needs ``openai>=3``, so each lives in its own environment
(README, "On the GPU node"). A wrong ``--python`` (or ``$DRAFTGEN_SGLANG_PYTHON``) is one line naming the
environment and the fix, exit code 3 (refused), in seconds and before a server starts. The environments here are real venvs;
the ones "with SGLang" hold SGLang's package metadata (its name, version and pins) and an importable ``sglang``
package, which is all the check reads (the SGLang tier checks the real one: tests_sglang/test_environments.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from draftgen.cli import main
from draftgen.defaults import SGLANG_PYTHON_ENV
from draftgen.exit_codes import ExitCode
from draftgen.serve.config import ServeConfig
from draftgen.serve.preflight import check_engine, check_router


def venv(root: Path, packages: dict[str, tuple[str, list[str]]] | None = None) -> str:
    """A real venv (no pip, seconds); ``packages``: name → (version, Requires-Dist lines) as installed metadata,
    with an importable (empty) package of that name."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for name, (version, requires) in (packages or {}).items():
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    return str(python)


SGLANG = ("0.5.23", ["openai==2.8.0", "openai-harmony==0.0.4", 'pytest; extra == "test"'])


def _serve(tmp_path: Path, *extra: str) -> tuple[int, float]:
    started = time.perf_counter()
    code = main(["serve", "--model", str(tmp_path), "--gpus", "0", "--out", str(tmp_path / "o"), *extra])
    return code, time.perf_counter() - started


def test_an_environment_without_sglang_is_named_with_the_fix(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(SGLANG_PYTHON_ENV, raising=False)
    plain = venv(tmp_path / "plain")
    code, took = _serve(tmp_path, "--python", plain)
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED and took < 30
    assert f"--python {plain} has no sglang" in err
    assert "pass --python /path/to/sglang-env/bin/python" in err and f"export {SGLANG_PYTHON_ENV}=" in err
    assert not (tmp_path / "o").exists()  # nothing started, nothing written

    monkeypatch.setenv(SGLANG_PYTHON_ENV, plain)  # the documented default, when --python is not given
    assert _serve(tmp_path)[0] == ExitCode.REFUSED
    assert f"${SGLANG_PYTHON_ENV} ({plain}) has no sglang" in capsys.readouterr().err

    monkeypatch.delenv(SGLANG_PYTHON_ENV)  # neither: draftgen's own interpreter, which has no SGLang
    assert _serve(tmp_path)[0] == ExitCode.REFUSED
    assert f"this Python ({sys.executable}, draftgen's environment) has no sglang" in capsys.readouterr().err


def test_sglangs_environment_with_draftgens_openai_is_refused_naming_the_pin(tmp_path, capsys) -> None:
    """draftgen installed into SGLang's environment brings openai>=3, which SGLang's pin forbids."""
    merged = venv(tmp_path / "merged", {"sglang": SGLANG, "openai": ("3.2.0", [])})
    code, took = _serve(tmp_path, "--python", merged)
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED and took < 30
    assert f"--python {merged} has sglang 0.5.23 with openai 3.2.0, but sglang pins openai==2.8.0" in err
    assert f"`{merged} -m pip install 'openai==2.8.0'`" in err


def test_sglangs_own_environment_passes_and_smg_runs_in_draftgens(tmp_path) -> None:
    sglang_env = venv(tmp_path / "sglang", {"sglang": SGLANG, "openai": ("2.8.0", [])})
    config = ServeConfig(model=str(tmp_path), gpus="0", python=sglang_env, router=True, run_name="r")
    check_engine(config)  # no exception: SGLang and its pins
    check_router(config)  # SMG from draftgen's own environment (the router extra), not SGLang's


def test_the_router_line_runs_draftgens_interpreter_whatever_python_says(capsys) -> None:
    main(
        [
            "serve",
            "--model",
            "m",
            "--gpus",
            "0",
            "--python",
            "/opt/sglang/bin/python",
            "--router",
            "--dry-run",
        ]
    )
    *servers, router = capsys.readouterr().out.strip().splitlines()
    assert all("/opt/sglang/bin/python -m sglang.launch_server" in line for line in servers)
    assert f"{sys.executable} -m smg launch" in router


def test_a_missing_interpreter_is_one_line(tmp_path, capsys) -> None:
    assert _serve(tmp_path, "--python", str(tmp_path / "nope" / "python"))[0] == 2
    assert f"--python {tmp_path / 'nope' / 'python'}: no such interpreter" in capsys.readouterr().err


def test_the_simulator_runs_in_draftgens_environment_whatever_the_variable_says(monkeypatch) -> None:
    monkeypatch.setenv(SGLANG_PYTHON_ENV, "/opt/sglang/bin/python")
    assert ServeConfig(engine="sim", gpus="0", run_name="r").python == sys.executable
    assert ServeConfig(model="m", gpus="0", run_name="r").python == "/opt/sglang/bin/python"
