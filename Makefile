# Two commands do all set-up on a fresh machine:
#   make demo   - run the main job on the embedded default
#   make test   - run the whole test suite (what CI runs)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sdcp-ready
SOURCES := pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h csrc/nghttp2/*.cpp csrc/cbor/*.cpp)

.PHONY: demo test check lint typecheck pytest bench vectors clean native fuzz lock test-latest test-under-load

$(STAMP): $(SOURCES) scripts/bootstrap.sh requirements/lock.txt
	scripts/bootstrap.sh dev
	@touch $@

demo: $(STAMP)
	$(BIN)/sdcp-fast demo

# The protocol core must keep >= 95% branch coverage; measured in the same run.
COVERAGE := --cov=sdcp_fast.protocol --cov-branch --cov-fail-under=95 --cov-report=term:skip-covered

test: $(STAMP) check
	scripts/services.sh
	$(BIN)/python -m pytest $(COVERAGE) $(PYTEST_ARGS)

check: lint typecheck

# Refresh requirements/lock.txt from pyproject.toml's ranges (tests/test_lock.py checks they agree).
lock:
	scripts/lock.sh

# The same suite on the newest versions pyproject.toml's ranges allow, in a venv of its own, so that
# a release that breaks us shows up here first and not on a user's machine.
LATEST := .venv-latest
test-latest:
	VENV=$(LATEST) SDCP_LOCK=latest scripts/bootstrap.sh dev
	scripts/services.sh
	$(LATEST)/bin/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check sdcp_fast tests bench triton_kernels

# The packages held to mypy --strict.
STRICT := sdcp_fast/protocol sdcp_fast/transport sdcp_fast/cache sdcp_fast/commitlog sdcp_fast/store sdcp_fast/mlc_server sdcp_fast/roles sdcp_fast/cluster

typecheck: $(STAMP)
	$(BIN)/mypy --strict $(STRICT)

# Hostile input at depth: CI gives every endpoint 10^4 inputs (tests/fuzz), this 2 * 10^5
# in process and 2 * 10^4 over HTTP/2 + mTLS (docs/security.md, "Hostile input").
FUZZ_INPUTS ?= 200000
FUZZ_H2 ?= 20000
fuzz: $(STAMP)
	SDCP_FUZZ_INPUTS=$(FUZZ_INPUTS) SDCP_FUZZ_H2=$(FUZZ_H2) $(BIN)/python -m pytest -q -p no:cacheprovider tests/fuzz

vectors: $(STAMP)
	$(BIN)/python scripts/make_vectors.py

bench: $(STAMP)
	$(BIN)/python bench/verify_kernels.py
	$(BIN)/python bench/mlc.py
	$(BIN)/sdcp-fast bench --embedded --out bench/results/latest

clean:
	rm -rf build *.egg-info sdcp_fast/_C*.so sdcp_fast/protocol/_cbor_native*.so .pytest_cache .mypy_cache .ruff_cache

# Rebuild only the C++ extension in place (serialised: several builders may share a tree).
native: $(STAMP)
	flock /tmp/sdcp-build.lock $(BIN)/python setup.py -q build_ext --inplace

# tests/faults with a busy loop on every core (a loaded CI machine): the fault tests wait on
# the events they need, never on multiples of a timeout. The loops end with the run, also on ^C.
test-under-load: $(STAMP)
	@pids=""; for i in $$(seq $$(nproc)); do sh -c 'while :; do :; done' & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	$(BIN)/python -m pytest -q tests/faults $(PYTEST_ARGS)
