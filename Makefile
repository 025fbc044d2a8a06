# Two commands do everything on a fresh machine:
#   make quickstart   -> a small federated BO run with a plot and a summary
#   make test         -> the test suite (what CI runs)
# Both create/reuse .venv and install the package with the pinned CPU stack.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.fbo-installed
OUT ?= runs/quickstart

.PHONY: install quickstart test test-upstream lint typecheck format bench clean flower-demo docs

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned, so no other requirement can pick a CUDA build
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev,vision,flower,ax,docs]'
	@if $(PIP) list 2>/dev/null | grep -qi '^nvidia-'; then \
		echo "error: nvidia-* wheels were installed; check constraints.txt" >&2; exit 1; fi
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/fbo-torch quickstart --out $(OUT) --overwrite

# The suite, then the numerically sensitive tests again with torch's portable CPU
# kernels (no AVX2/AVX-512): a tolerance tuned to one CPU's float rounding fails here.
NUMERIC_TESTS := tests/objectives/test_vision.py tests/models/test_batched_gp.py tests/optim/test_quasi_newton.py \
	tests/models/test_rff_blr.py tests/optim/test_optim.py tests/test_features.py tests/utils/test_batch_invariant.py
test: $(STAMP)
	$(PY) -m pytest -q -n 2
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -n 2 $(NUMERIC_TESTS)

# The suite against the newest BoTorch, GPyTorch and linear_operator the package index offers, in a
# venv of its own (UPSTREAM_VENV), upgraded on every call; torch stays pinned (constraints.txt's line
# for torch only, so no CUDA build is pulled). The extras that pin BoTorch themselves (ax) or torch
# (vision) are left out: their tests are skipped. Not part of CI: it tells whether the next releases
# break us before a user finds out.
UPSTREAM_VENV ?= .venv-upstream
UPSTREAM_PY := $(UPSTREAM_VENV)/bin/python
test-upstream:
	test -x $(UPSTREAM_PY) || $(PYTHON) -m venv $(UPSTREAM_VENV)
	grep -E '^torch==' constraints.txt > $(UPSTREAM_VENV)/torch-constraint.txt
	$(UPSTREAM_PY) -m pip install -q -c $(UPSTREAM_VENV)/torch-constraint.txt torch
	$(UPSTREAM_PY) -m pip install -q -c $(UPSTREAM_VENV)/torch-constraint.txt --upgrade --upgrade-strategy eager \
		-e '.[dev,flower]' botorch gpytorch linear_operator
	@if $(UPSTREAM_PY) -m pip list 2>/dev/null | grep -qi '^nvidia-'; then \
		echo "error: nvidia-* wheels were installed; check constraints.txt" >&2; exit 1; fi
	$(UPSTREAM_PY) -m pip list 2>/dev/null | grep -iE '^(torch|botorch|gpytorch|linear.operator) '
	$(UPSTREAM_PY) -m pytest -q -n 2

# ruff (configured in pyproject.toml): lint rules and the formatter's check, over the whole repository
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy (configured in pyproject.toml: strict, with the third-party packages that lack types named)
typecheck: $(STAMP)
	$(PY) -m mypy

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# The API reference (from the docstrings) and docs/*.md as one site in docs/_build/html; every
# warning is an error and every cross-reference must resolve (-n); then no link may leave the site
# (the repository files the guides link to are copied into it: docs/_ext/repo_pages.py)
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -n -b html docs docs/_build/html
	$(PY) docs/check_links.py docs/_build/html

# DP-FTS-DE on Flower's deployment engine: a SuperLink and 4 SuperNodes on 127.0.0.1 with
# TLS and SuperNode authentication (credentials generated in a temporary folder), 3 rounds on
# the synthetic objective; every process is stopped at the end. ROGUE=1 adds a node with an
# unregistered key (refused); SECAGG=1 aggregates by SecAgg+ with distributed noise (the server
# never sees an agent's omega); INSECURE=1 runs without TLS and authentication.
flower-demo: $(STAMP)
	VENV=$(abspath $(VENV)) examples/flower_app/run_demo.sh

clean:
	rm -rf $(VENV) $(UPSTREAM_VENV) runs .pytest_cache docs/_build docs/_autosummary docs/_repo
