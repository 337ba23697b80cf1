# s3lanes developer targets. Everything runs from a project virtualenv in .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The client's torch extra and the server's s3torch extra (AWS's s3torchconnector against the gateway) are for
# the tests and the type check only: setup and run stay without them.
TORCH_STAMP := $(VENV)/.installed-torch
# `make run` needs the gateway and its embedded store alone (no test, dev or bench extra, no client); a venv
# set up by `make setup` has them too.
RUN_STAMP := $(VENV)/.installed-run
# The PyTorch build the tests and the type check use (the client's torch extra allows any recent one).
TORCH_PIN := torch==2.13.0

.PHONY: help setup run test test-fast coverage check lint spelling typecheck contracts bench clean

## This list of targets.
help:
	@awk '/^\.PHONY/ {next} /^## / {if (!doc) doc = substr($$0, 4); next} \
		/^[a-z][a-z-]*:/ {if (doc) {split($$0, t, ":"); printf "  make %-18s %s\n", t[1], doc}} {doc = ""}' \
		$(firstword $(MAKEFILE_LIST))

# Two distributions, both installed editable: the server (pyproject.toml, package gateway/s3lanes) and the
# client (clients/pyproject.toml, package clients/s3lanes_client).
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install -q -e '.[embedded]'
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml clients/pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install -q -e '.[embedded,test,dev,bench]' -e './clients[async]'
	touch $(RUN_STAMP) $(STAMP)

$(TORCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[s3torch]' -e './clients[async,torch]' '$(TORCH_PIN)'
	touch $(TORCH_STAMP)

## Create .venv/ with the gateway and its test, dev and bench tools.
setup: $(STAMP)

## Quick start 1: run the gateway with an embedded SeaweedFS backend (installs the server and its store only).
run: $(RUN_STAMP)
	$(BIN)/s3lanes serve

## Quick start 2: the whole test suite (starts its own SeaweedFS): the pure layers first, then the rest.
test: $(TORCH_STAMP)
	scripts/system-deps
	$(BIN)/pytest -n $(FAST_WORKERS) $(PURE_TESTS) $(CORE_COVERAGE) $(PYTEST_ARGS)
	$(BIN)/pytest $(addprefix --ignore=,$(PURE_TESTS)) $(PYTEST_ARGS)

PURE_TESTS := tests/core tests/sim
CORE_COVERAGE_FLOOR := 100
# Branch coverage of gateway/s3lanes/core by the pure tests alone, held to the floor (pytest-cov).
CORE_COVERAGE := --cov=gateway/s3lanes/core --cov-branch --cov-report=term-missing:skip-covered \
	--cov-fail-under=$(CORE_COVERAGE_FLOOR)
# make test-fast runs on every core (pytest-xdist); FAST_WORKERS=0 runs in one process.
FAST_WORKERS ?= auto

## The pure layers alone (no store, no gateway; property tests with a tenth of their examples) and the gateway/s3lanes/core coverage floor.
test-fast: $(STAMP)
	S3LANES_TEST_FAST=1 $(BIN)/pytest -q -p no:cacheprovider -n $(FAST_WORKERS) $(PURE_TESTS) $(PYTEST_ARGS)

## The same, under coverage: the floor of gateway/s3lanes/core (make test holds the full pure pass to it too).
coverage: $(STAMP)
	S3LANES_TEST_FAST=1 $(BIN)/pytest -q -p no:cacheprovider -n $(FAST_WORKERS) $(CORE_COVERAGE) \
		$(PURE_TESTS) $(PYTEST_ARGS)

## Lint, spelling, type check and import contracts (what CI runs besides the tests).
check: lint spelling typecheck contracts

## codespell over the repository.
spelling: $(STAMP)
	$(BIN)/codespell

## ruff check and ruff format --check.
lint: $(STAMP)
	$(BIN)/ruff check gateway clients tests loadtests
	$(BIN)/ruff format --check gateway clients tests loadtests

## mypy --strict over gateway/ and clients/, and over tests/ and loadtests/ with annotations optional.
typecheck: $(TORCH_STAMP)
	$(BIN)/mypy

## The import layering (lint-imports).
contracts: $(STAMP)
	$(BIN)/lint-imports

## The proxy benchmark (BENCH_ARGS to pass options).
bench: $(STAMP)
	$(BIN)/python -m loadtests.bench_proxy $(BENCH_ARGS)

## The write spool's benchmark (docs/benchmarks.md, "Write spool"); BENCH_ARGS=--quick for a short run.
.PHONY: bench-spool
bench-spool: $(STAMP)
	$(BIN)/python -m loadtests.bench_spool $(BENCH_ARGS)

## Checkpoint save and restore through the spool, two gateways differing in one setting, interleaved:
## [spool] direct_io on/off, or BENCH_ARGS="--compare zero-copy" (docs/benchmarks.md).
.PHONY: bench-save
bench-save: $(STAMP)
	$(BIN)/python -m loadtests.bench_save $(BENCH_ARGS)

## Remove .venv/ and build and tool caches (not .s3lanes/, the gateway's state).
clean:
	rm -rf $(VENV) build dist clients/build */*.egg-info .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*

## The contention benchmark (docs/benchmarks.md, "Contention benchmark"): about 10 minutes, needs
## root for its netns testbed; BENCH_ARGS="--quick --testbed model" for a one-minute run without root.
.PHONY: bench-contention
bench-contention: $(STAMP)
	$(BIN)/python -m loadtests.contention $(BENCH_ARGS)

## The soak test (docs/reliability.md, "Long runs"): 30 minutes of the Locust training mix against a spooling
## gateway, leak and durability checks; SOAK_ARGS=--quick for a ~2-minute run. Shared machine: prefix nice -n 19.
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python -m loadtests.soak $(SOAK_ARGS)

## The differential S3 conformance run (docs/compatibility.md): the whole corpus against SeaweedFS directly
## and the gateway (spool off, spool held, draining, flushed); writes conformance-report.md. The normal test
## suite runs a fast subset of the same corpus.
.PHONY: conformance
conformance: $(STAMP)
	S3LANES_CONFORMANCE=full S3LANES_CONFORMANCE_REPORT=$(or $(CONFORMANCE_REPORT),conformance-report.md) \
		$(BIN)/pytest tests/conformance $(PYTEST_ARGS)
