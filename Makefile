# Two commands from a fresh clone; each says what it does, and a second run redoes nothing done.
#
#   make demo   a virtual environment (.venv), torch (the CPU build where there is no GPU),
#               gpudiag, then `gpudiag demo`
#   make test   what CI runs (.ci/run): a virtual environment (.venv-ci) with torch==2.13.0 and
#               gpudiag in strict editable mode, then ruff, ruff format --check, mypy, pytest
#
# Needs only Python 3.10+ and make. Variables: PYTHON (python3), PYTEST_ARGS (-m 'not slow'),
# TORCH_CPU_INDEX (PyTorch's CPU wheels; empty, or where it cannot be reached: pip's own index).

PYTHON ?= python3
PYTEST_ARGS ?= -m 'not slow'
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_TEST_VERSION := 2.13.0

DEMO_VENV := .venv
TEST_VENV := .venv-ci

.PHONY: demo test test-setup lint clean help
.DEFAULT_GOAL := help

help:
	@echo "make demo   set up .venv (torch, gpudiag) and run gpudiag demo"
	@echo "make test   set up .venv-ci as CI does and run lint, types and tests"
	@echo "            (PYTEST_ARGS='tests/docs -q' runs a selection)"

# --- the demo -----------------------------------------------------------------------------

demo: $(DEMO_VENV)/.gpudiag-demo
	@echo "==> $(DEMO_VENV) is set up (torch, gpudiag from this checkout)"
	@echo "==> gpudiag demo (a small training job with a planted input-pipeline bottleneck)"
	$(DEMO_VENV)/bin/gpudiag demo

$(DEMO_VENV)/.gpudiag-demo: pyproject.toml
	@$(MAKE) --no-print-directory venv VENV=$(DEMO_VENV)
	@$(MAKE) --no-print-directory torch VENV=$(DEMO_VENV) TORCH_SPEC=torch
	@echo "==> installing gpudiag from this checkout into $(DEMO_VENV)"
	$(DEMO_VENV)/bin/python -m pip install -q -e '.[demo]'
	@touch $@

# --- the tests, as CI runs them -------------------------------------------------------------

test: test-setup lint
	@echo "==> pytest $(PYTEST_ARGS)"
	. $(TEST_VENV)/bin/activate && python -m pytest $(PYTEST_ARGS)

lint: test-setup
	@echo "==> ruff check, ruff format --check, mypy"
	. $(TEST_VENV)/bin/activate && ruff check . && ruff format --check . && mypy

test-setup: $(TEST_VENV)/.gpudiag-test
	@echo "==> $(TEST_VENV) is set up (torch==$(TORCH_TEST_VERSION), gpudiag editable, strict)"

$(TEST_VENV)/.gpudiag-test: pyproject.toml
	@$(MAKE) --no-print-directory venv VENV=$(TEST_VENV)
	@$(MAKE) --no-print-directory torch VENV=$(TEST_VENV) TORCH_SPEC=torch==$(TORCH_TEST_VERSION)
	@echo "==> installing gpudiag in strict editable mode with its test extra into $(TEST_VENV)"
	$(TEST_VENV)/bin/python -m pip install -q --config-settings editable_mode=strict -e '.[test]'
	@touch $@

# --- shared steps (called with VENV=...) ----------------------------------------------------

venv:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
	  { echo "gpudiag needs Python 3.10 or later: $(PYTHON) is $$($(PYTHON) -V 2>&1)" >&2; exit 2; }
	@if [ -x $(VENV)/bin/python ]; then echo "==> $(VENV) exists"; else \
	  echo "==> creating the virtual environment $(VENV)"; \
	  $(PYTHON) -m venv $(VENV) || exit 2; fi

# torch as TORCH_SPEC asks, once: the CPU build where no NVIDIA GPU is seen (PyPI's Linux torch
# is the multi-GB CUDA build), PyPI's where one is or where the CPU index cannot be reached.
torch:
	@if $(VENV)/bin/python -c 'import sys; from importlib.metadata import version as v; \
	  want = "$(TORCH_SPEC)".partition("==")[2]; have = v("torch").split("+")[0]; \
	  sys.exit(bool(want) and have != want)' \
	  2>/dev/null; then echo "==> $(TORCH_SPEC) is installed in $(VENV)"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "==> installing $(TORCH_SPEC) (a GPU is present: the CUDA build) into $(VENV)"; \
	  $(VENV)/bin/python -m pip install -q '$(TORCH_SPEC)'; \
	elif [ -n "$(TORCH_CPU_INDEX)" ] && \
	  $(VENV)/bin/python -c 'import urllib.request as u; u.urlopen("$(TORCH_CPU_INDEX)/", timeout=10)' \
	  >/dev/null 2>&1; then \
	  echo "==> installing $(TORCH_SPEC), the CPU build (no GPU seen), into $(VENV)"; \
	  $(VENV)/bin/python -m pip install -q --index-url $(TORCH_CPU_INDEX) '$(TORCH_SPEC)'; \
	else \
	  echo "==> no GPU seen, no CPU index reachable ($(TORCH_CPU_INDEX)): $(TORCH_SPEC) from pip's own index"; \
	  $(VENV)/bin/python -m pip install -q '$(TORCH_SPEC)'; fi

clean:
	@echo "==> removing $(DEMO_VENV) and $(TEST_VENV)"
	rm -rf $(DEMO_VENV) $(TEST_VENV)
