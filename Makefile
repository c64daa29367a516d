# dflash-tasks: set-up, demo, tests and checks. `make` alone lists the targets.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Written after a successful install; pip runs again only when pyproject.toml changes.
STAMP := $(VENV)/.installed
# 1 = make sure Debian's chromium is installed: the Flower test drives it (headless, through
# Playwright's Python package; never `playwright install`). 0 = skip it (those tests then skip).
BROWSER_TESTS ?= 1
# Extra arguments: make test PYTEST_ARGS='-k leases -x' PYTEST_WORKERS=1, make demo DEMO_ARGS='--prompts 500',
# make chaos CHAOS_ARGS='--minutes 3 --seed 1'.
PYTEST_ARGS ?=
# make test runs pytest in this many processes (pytest-xdist; 1 = one process, no xdist): most
# tests wait on real processes, so two share two cores well. Groups that must not overlap
# (tests/conftest.py) stay in one process each.
PYTEST_WORKERS ?= 2
DEMO_ARGS ?=
CHAOS_ARGS ?=
BENCH_ARGS ?=
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.DEFAULT_GOAL := help
.PHONY: help venv redis prometheus browser sglang-wheel sglang-env demo test lint format bench reliability mutate chaos clean distclean

help:
	@echo "make venv         create $(VENV) (with $(PYTHON)) and install the package with its dev extras"
	@echo "make redis        install redis-server if missing; start a local Redis at DFLASH_BROKER_URL if none answers"
	@echo "make demo         4 simulated GPUs + workers + Flower, one 3,000-prompt job, verify (DEMO_ARGS='--help')"
	@echo "make prometheus   install Debian's prometheus (prometheus + promtool, for the dashboard tests) if missing"
	@echo "make test         venv + redis + prometheus + chromium (BROWSER_TESTS=0: without) + the SGLang wheel and env, then pytest"
	@echo "make sglang-wheel download the pinned SGLang wheel (no deps) the flag check reads, once"
	@echo "make sglang-env   build the pinned SGLang's CPU environment the real-server tests run, and SpecForge beside it, once (cached in ~/.cache)"
	@echo "make lint         ruff check, ruff format --check, mypy --strict"
	@echo "make format       sort imports and format with ruff"
	@echo "make bench        run the benchmarks (python -m benchmarks), if there are any"
	@echo "make reliability  run the tests marked 'reliability'"
	@echo "make mutate       mutation testing (mutmut) of the core modules against their fast tests (docs/testing.md)"
	@echo "make chaos        10 min of overlapping faults on a multi-node job, checked (root; CHAOS_ARGS='--help')"
	@echo "make clean        remove caches, build metadata and demo-output/ (distclean: also $(VENV), .cache/)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing dflash-tasks and its dev tools into $(VENV) ..."
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[dev]'
	@touch $@

redis:
	@bash scripts/ensure_redis.sh

prometheus:
	@bash scripts/ensure_prometheus.sh

browser:
	@if [ "$(BROWSER_TESTS)" = 1 ] && ! command -v chromium >/dev/null 2>&1; then \
		echo "installing Debian's chromium ..."; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	fi

# The pinned SGLang release's wheel (39 MB, no dependencies) into .cache/sglang/, once: the
# flag check (tests/deploy/test_sglang_release.py) reads SGLang's own CLI from it.
sglang-wheel: venv
	@$(BIN)/python -m tests.sglang_wheel

# The pinned release's CPU environment for the real-server tests (tests/real_sglang/env.py): built
# once (~7 GB) into ${XDG_CACHE_HOME:-~/.cache}/dflash-tasks/, outside the repository, so fresh
# clones reuse it; rebuilt only when the pin or its requirements change.
sglang-env: sglang-wheel
	@$(BIN)/python -m tests.real_sglang.env
	@$(BIN)/python -m tests.real_sglang.specforge_env

demo: venv redis
	$(BIN)/python -m dflash_tasks.demo $(DEMO_ARGS)

# scripts/ensure_redis.sh (the redis target) also installs the redis-server binary the tests start.
# scripts/ensure_prometheus.sh (the prometheus target) installs the binaries the dashboard tests start.
test: venv redis prometheus browser sglang-wheel sglang-env
	$(BIN)/pytest -q -p no:cacheprovider $(if $(filter-out 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

lint: venv
	@status=0; \
	echo "ruff check"; $(BIN)/ruff check . || status=1; \
	echo "ruff format --check"; $(BIN)/ruff format --check . || status=1; \
	echo "mypy"; $(BIN)/mypy || status=1; \
	exit $$status

format: venv
	$(BIN)/ruff check --fix-only --select I --quiet .
	$(BIN)/ruff format .

bench: venv redis
	@if [ -f benchmarks/__main__.py ]; then \
		$(BIN)/python -m benchmarks $(BENCH_ARGS); \
	else \
		echo "no benchmarks yet (benchmarks/__main__.py does not exist)"; \
	fi

# pytest exits 5 when the marker selects nothing: that is not a failure here.
reliability: venv redis
	@$(BIN)/pytest -q -p no:cacheprovider -m reliability $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "no reliability tests yet"; exit 0; fi; exit $$status

# Mutation testing: see docs/testing.md for the scope, the score and the survivors that remain.
# mutmut keeps its results in mutants/ and re-runs only what changed; `make clean` starts afresh.
mutate: venv redis
	@$(BIN)/mutmut run --max-children 2; status=$$?; \
	echo "surviving mutants (mutmut show NAME prints one):"; $(BIN)/mutmut results; exit $$status

# Needs root (network namespaces, a tmpfs); exits 1 when an invariant broke and prints how to replay.
chaos: venv redis
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

clean:
	rm -rf demo-output test-artifacts mutants .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .cache
