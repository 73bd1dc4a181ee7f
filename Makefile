# mldebug developer entry points. `make demo` and `make test` work on a fresh machine:
# each creates .venv when missing and installs torch (CPU build pinned) plus mldebug[all,dev].

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv demo test lint unit bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python recipes/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check mldebug tests recipes benchmarks bin
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/python -m pytest -ra $(PYTEST_ARGS)

unit: $(STAMP)
	$(VENV)/bin/python -m pytest -ra -m "not cluster" $(PYTEST_ARGS)

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
