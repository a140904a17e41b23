# postroom's everyday commands. `make` alone lists them.
# The local stack (Kafka, PostgreSQL, a Schema Registry) comes from scripts/services.sh; its state
# lives in .dev (POSTROOM_DEV_DIR overrides it), the venv in .venv (scripts/bootstrap.sh).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON := .venv/bin/python
DEV_DIR := $(or $(POSTROOM_DEV_DIR),.dev)
ENV_FILE := $(DEV_DIR)/env
# Extra pytest arguments, e.g. make test PYTEST_ARGS='-k relay -x'
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`: most of a test's time is waiting on Kafka, PostgreSQL or a
# subprocess, so more workers than cores. Tests marked xdist_group share one worker (loadgroup).
TEST_WORKERS ?= 4
UNIT_WORKERS ?= 2
# make test-unit's cap on each property test's examples (make test runs their full counts)
UNIT_EXAMPLES ?= 30
# The suite sets what it needs: a POSTROOM_* variable left in the shell (README's by-hand steps
# export POSTROOM_SMTP_PORT, say) is unset first; the stack's own (POSTROOM_DEV_*) stay.
UNSET_USER_SETTINGS := unset $$(compgen -e | grep '^POSTROOM_' | grep -v '^POSTROOM_DEV_') ;

.PHONY: help venv services services-down services-status services-clean test test-unit test-stack test-under-load chaos chaos-short fuzz demo lint bench \
	check-alerts compose-test \
	services-cluster services-cluster-down chaos-cluster cluster-test

# The descriptions in one column, as wide as the longest target's name.
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) \
		| awk -F':.*## ' '{ name[NR] = $$1; what[NR] = $$2; if (length($$1) > w) w = length($$1) } \
			END { for (i = 1; i <= NR; i++) printf "  make %-" w "s  %s\n", name[i], what[i] }'

venv: ## create .venv and install postroom with its roles, test, lint and demo extras
	@scripts/bootstrap.sh

services: venv ## start the local Kafka, PostgreSQL and Schema Registry (idempotent); writes .dev/env
	@scripts/services.sh up

services-down: ## stop the local stack (data is kept)
	@scripts/services.sh down

services-status: ## show what of the local stack runs
	@scripts/services.sh status

services-clean: ## stop the local stack and delete its data
	@scripts/services.sh clean

# The console's tests (tests/integration/web) drive Debian's chromium through chromium-driver.
.PHONY: browser
browser: ## install chromium and chromium-driver with apt-get when missing (the console's browser tests)
	@scripts/browser.sh

# The project's bytecode, written once: the suite starts `postroom` hundreds of times, and with
# PYTHONDONTWRITEBYTECODE set (as this machine's image sets it) each start compiled every module.
COMPILE := $(PYTHON) -m compileall -q -j 0 postroom relay sender bounces schemas bench tests > /dev/null
# pytest keeps the test modules it rewrote for their asserts (about 10 CPU-s per worker) only
# where bytecode may be written: with PYTHONDONTWRITEBYTECODE set, every worker rewrote every
# module on every run.
KEEP_BYTECODE := unset PYTHONDONTWRITEBYTECODE ;

test: services browser ## the whole suite against the local stack, TEST_WORKERS in parallel (PYTEST_ARGS=...)
	$(COMPILE)
	$(UNSET_USER_SETTINGS) $(KEEP_BYTECODE) . $(ENV_FILE) && $(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# No stack, and no stack settings: tests/unit needs no service (one that reaches for one fails).
test-unit: venv ## the unit tests only, no services, property tests at UNIT_EXAMPLES examples, in about 45 s (PYTEST_ARGS=...)
	$(COMPILE)
	$(UNSET_USER_SETTINGS) $(KEEP_BYTECODE) unset POSTROOM_DEV_REGISTRY_URL ; \
		POSTROOM_QUICK_EXAMPLES=$(UNIT_EXAMPLES) $(PYTHON) -m pytest tests/unit -n $(UNIT_WORKERS) -q \
		$(PYTEST_ARGS)

# LOAD_RUNS=n runs (3); stress-ng is installed with apt-get when missing and stopped at the end.
test-under-load: services ## the suite LOAD_RUNS times while stress-ng --cpu 1 keeps one core busy
	@scripts/test-under-load.sh $(MAKE) --no-print-directory test

chaos: services ## the full fault-injection suite (~15 min; CHAOS_SEED=n replays a random mix)
	. $(ENV_FILE) && $(PYTHON) -m pytest tests/chaos -m 'chaos and not failover' -k 'not short' -s \
		$(PYTEST_ARGS)

# A second stack of its own (state dir and ports) started and stopped twice: the local stack's
# own lifecycle, left out of make test for its cost (three JVMs' worth of services, twice).
test-stack: services ## the local stack's lifecycle on a throwaway stack: up, down leaves no process, up again (~1 min)
	$(UNSET_USER_SETTINGS) . $(ENV_FILE) && $(PYTHON) -m pytest tests/integration/test_services.py -m lifecycle $(PYTEST_ARGS)

chaos-short: services ## the two short fault-injection runs (~2 min): a quick check before make chaos
	. $(ENV_FILE) && $(PYTHON) -m pytest tests/chaos -m chaos -k short -s $(PYTEST_ARGS)

# The three-node cluster of the failover suite: a stack of its own (state dir and ports), so its
# faults never touch the default stack's single broker. Its ports are its own variables, not
# POSTROOM_DEV_*, which move the single stack (and would put both on the same ports): move them
# with `make services-cluster CLUSTER_KAFKA_PORT=39192 ...` or the same in the environment.
CLUSTER_DEV_DIR ?= .dev-cluster
# Apart from docker-compose.yml's default host ports (25432, 29092, 28081) and below 32768, Linux's
# ephemeral ports (tests/unit/test_stack_ports.py).
CLUSTER_KAFKA_PORT ?= 29192
CLUSTER_KAFKA_CONTROLLER_PORT ?= 29193
CLUSTER_KAFKA_SECURE_PORT ?= 29194
CLUSTER_PG_PORT ?= 25532
CLUSTER_REGISTRY_PORT ?= 28181
# The cluster's JVMs compile as in production (C1 and C2): the failover pauses in
# docs/reliability.md were measured so.
CLUSTER_ENV := POSTROOM_DEV_DIR=$(CLUSTER_DEV_DIR) POSTROOM_DEV_BROKERS=3 POSTROOM_DEV_KAFKA_JIT=full \
	POSTROOM_DEV_KAFKA_PORT=$(CLUSTER_KAFKA_PORT) \
	POSTROOM_DEV_KAFKA_CONTROLLER_PORT=$(CLUSTER_KAFKA_CONTROLLER_PORT) \
	POSTROOM_DEV_KAFKA_SECURE_PORT=$(CLUSTER_KAFKA_SECURE_PORT) \
	POSTROOM_DEV_PG_PORT=$(CLUSTER_PG_PORT) POSTROOM_DEV_REGISTRY_PORT=$(CLUSTER_REGISTRY_PORT)

services-cluster: venv ## start the three-node Kafka cluster stack (.dev-cluster, ports 29192...)
	@$(CLUSTER_ENV) scripts/services.sh up

services-cluster-down: ## stop the three-node cluster stack (data is kept)
	@$(CLUSTER_ENV) scripts/services.sh down

# FAILOVER_PROTOCOLS=classic,classic-30s,kip848 and FAILOVER_REPEAT=n: the pause measurements.
chaos-cluster: services-cluster ## the failover scenarios on the three-broker cluster (~20 min)
	. $(CLUSTER_DEV_DIR)/env && $(PYTHON) -m pytest tests/chaos -m failover -s $(PYTEST_ARGS)

# The cluster tests stop and start the cluster's brokers: not while a failover run uses it.
cluster-test: services-cluster ## check, lag, topics create and ACLs on the three-broker cluster, brokers stopped
	. $(CLUSTER_DEV_DIR)/env && $(PYTHON) -m pytest tests/integration/cluster -m cluster $(PYTEST_ARGS)

# Examples per property for make fuzz (the normal run's counts are each test file's own).
FUZZ_EXAMPLES ?= 2000
PROPERTY_TESTS = $(shell grep -rlE --include='*.py' '^(from|import) hypothesis' tests/unit)

fuzz: venv ## the property tests (hypothesis) at length: FUZZ_EXAMPLES=n examples each (2000)
	POSTROOM_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTHON) -m pytest $(PROPERTY_TESTS) -q \
		-p no:cacheprovider --timeout=3600 $(PYTEST_ARGS)

demo: services ## run the demo against the local stack
	. $(ENV_FILE) && $(PYTHON) -m postroom.demo

lint: venv ## ruff, mypy strict, the import layers (import-linter) and dead code (vulture)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy
	.venv/bin/lint-imports
	$(PYTHON) -m vulture

# The broker with C2 too, as in production (the stack's default is C1 only: less CPU for the
# suite); a broker already running with C1 stays so, and services says so.
bench: export POSTROOM_DEV_KAFKA_JIT = full
bench: services ## run the benchmarks against the local stack
	. $(ENV_FILE) && $(PYTHON) -m bench

compose-test: venv ## build the image, run docker-compose.yml with podman (stand-in images), send the report, tear down
	@scripts/compose-test.sh

check-alerts: ## promtool check and test of deploy/prometheus (fetches promtool from Debian once)
	@scripts/check-alerts.sh
