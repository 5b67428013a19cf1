# Two entry points, both self-contained on a fresh clone: `make demo` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# benchmarks/sweep.py's peers (the `bench` extra: nnsight and TransformerLens) get a venv of their own:
# nnsight's dependencies are not pinned in constraints.txt and the tests never use them.
BENCH_VENV ?= /tmp/hooked-bench/venv

.PHONY: demo test bench bench-sweep install

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m hooked.demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/forward.py
	$(PY) benchmarks/hook_overhead.py
	$(PY) benchmarks/cache_memory.py
	$(PY) benchmarks/loading.py
	$(PY) benchmarks/distributed.py
	$(PY) benchmarks/circuits.py

$(BENCH_VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,bench]'
	touch $@

bench-sweep: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/sweep.py
