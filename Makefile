# Two entry points for a fresh machine with python3 (3.11) and make:
#   make demo   -- set up and run the demo
#   make test   -- set up and run the tests (under 15 minutes on 2 cores): all but the
#                  exhaustive variants, a representative of each of which runs
#   make test-all -- every test and variant, 2000 property-test programs (about an hour)
#   make test-fast -- the edit loop: the tests not marked slow (under 2 minutes on 2 cores)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all test-fast lint bench-redistribution bench-step-time bench-paper-counts \
	bench-partition-time bench-shard-map-toll bench-autopart bench-context-parallel \
	bench-pipeline bench-plan bench-plan-scale bench-megatron bench-megatron-rankings \
	bench-memory-estimates bench-host-collectives clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,models,plot]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/partir demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not exhaustive" tests

test-all: $(STAMP)
	PARTIR_NIGHTLY=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow and not exhaustive" tests

lint: $(STAMP)
	$(BIN)/ruff check partir_plugin plugins tests benchmarks
	$(BIN)/lint-imports

bench-redistribution: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/redistribution.py

bench-step-time: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/step_time.py

bench-partition-time: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/partition_time.py

bench-shard-map-toll: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/shard_map_toll.py

bench-autopart: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/autopart.py

bench-paper-counts: $(STAMP)
	$(BIN)/python benchmarks/paper_counts.py

bench-context-parallel: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/context_parallel.py

bench-pipeline: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/pipeline.py
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/pipeline.py --recipe

bench-plan: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/plan.py

bench-megatron: $(STAMP)
	$(BIN)/python benchmarks/megatron_sweep.py

bench-megatron-rankings: $(STAMP)
	$(BIN)/python benchmarks/megatron_rankings.py

bench-plan-scale: $(STAMP)
	$(BIN)/python benchmarks/plan_at_scale.py

bench-memory-estimates: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/memory_estimates.py

bench-host-collectives: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python benchmarks/host_collectives.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
