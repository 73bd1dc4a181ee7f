# mldebug developer entry points. `make demo` and `make test` work on a fresh machine:
# each creates .venv when missing and installs torch (pinned; the CPU build when its index is
# reachable, see TORCH_CPU_INDEX) plus mldebug[all,dev] (editable).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Parallel workers for the second, one-at-a-time part too (pytest-xdist): e.g.
# `make test XDIST="-n 2 --dist loadgroup"`; cluster tests share one worker (tests/conftest.py).
# Not the default: those tests start CPU-bound torchrun jobs or read every process.
XDIST ?=

.PHONY: venv demo test lint unit bench faults clean

TORCH_VERSION ?= 2.13.0
# The CPU-only torch build (~200 MB) instead of PyPI's default CUDA build (several GB).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ -n "$(TORCH_CPU_INDEX)" ] && $(PY) -c "import urllib.request; urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" 2>/dev/null; then \
		echo "torch $(TORCH_VERSION): CPU build from $(TORCH_CPU_INDEX)"; \
		$(PY) -m pip install -q --index-url $(TORCH_CPU_INDEX) torch==$(TORCH_VERSION); \
	else \
		echo "torch $(TORCH_VERSION): CPU index not set or not reachable; plain 'pip install torch==$(TORCH_VERSION)' (your pip index / find-links decide the build; PyPI's is the CUDA one)"; \
		$(PY) -m pip install -q torch==$(TORCH_VERSION); \
	fi
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python recipes/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check mldebug tests recipes benchmarks bin scripts
	$(VENV)/bin/mypy

# The independent tests (tests/conftest.py PARALLEL_SAFE) on both cores with pytest-xdist, a
# module per worker at a time, then the rest one at a time: the sshd cluster, a second user,
# scans of the node's whole process table.
# Exit code 5 (nothing selected, e.g. a PYTEST_ARGS path with none of one kind) is no failure.
test: lint
	$(VENV)/bin/python -m pytest -ra -n 2 --dist loadfile -m parallel $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] || [ $$rc -eq 0 ] || exit $$rc
	$(VENV)/bin/python -m pytest -ra --durations=30 -m "not parallel" $(XDIST) $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] || exit $$rc

unit: $(STAMP)
	$(VENV)/bin/python -m pytest -ra -m "not cluster" $(XDIST) $(PYTEST_ARGS)

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

# The fault matrix's scoreboard (docs/faults.md): every class at 2, 4 and 8 ranks, every
# route beside its peer. FAULTS_ARGS=--quick for one case per class at 4 ranks.
FAULTS_ARGS ?=
faults: $(STAMP)
	$(VENV)/bin/python benchmarks/faults/run.py $(FAULTS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
