# The two commands of the README: `make demo` (the main job) and `make test` (the CPU suite).
# Each installs what it needs: a venv, the pinned CPU torch (requirements-cpu.txt; use
# REQS=requirements-cuda.txt on a GPU machine), then builds vllm._C in place.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
REQS ?= requirements-cpu.txt
PYTEST_ARGS ?=

.PHONY: demo test build bench-kernels clean

$(VENV)/.installed: $(REQS) requirements-common.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r $(REQS) -r requirements-test.txt
	touch $@

build: $(VENV)/.installed
	$(PY) -m pip install -q --no-build-isolation -e .

test: build
	$(PY) -m pytest tests -q $(PYTEST_ARGS)

demo: build
	$(PY) examples/cpu_draft_spec_decode.py

bench-kernels: build
	$(PY) benchmarks/benchmark_kernels.py --device cpu

clean:
	rm -rf build vllm/_C*.so *.egg-info
