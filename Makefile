# evermirror: `make run` serves on 127.0.0.1:8000, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime
# The Node packages of the frontend protocol tests (the AI SDK), as locked.
NODE_TESTS := tests/node/node_modules/.installed
LINTED := app tests scripts bench clients/python examples

.PHONY: help install run test lint typecheck fmt migrate openapi bench bench-smoke check clean

help: ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

# `make run` needs the service only; `make install` (and test, lint ...) adds the dev
# tools and the Python client on top.
$(RUNTIME): pyproject.toml
	@echo "installing the service into $(VENV) (once; about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar on -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) pyproject.toml clients/python/pyproject.toml
	@echo "installing the dev tools and the Python client into $(VENV)"
	$(BIN)/pip install --quiet -e '.[dev]' -e clients/python
	touch $(STAMP)

$(NODE_TESTS): tests/node/package.json tests/node/package-lock.json
	@echo "installing the frontend tests' Node packages into tests/node"
	npm ci --prefix tests/node --no-audit --no-fund --loglevel=error
	touch $(NODE_TESTS)

install: $(STAMP) $(NODE_TESTS) ## create .venv and install the project, its dev tools, the Python client and the frontend tests' Node packages

run: $(RUNTIME) ## migrate the embedded SQLite file and serve on 127.0.0.1:8000
	$(BIN)/python -m app serve

# Worker processes for the suite (`make test TEST_WORKERS=0` runs it in one process).
TEST_WORKERS ?= 2

test: $(STAMP) $(NODE_TESTS) ## run the suite, both clients' tests included (SQLite; PostgreSQL too when TEST_DATABASE_URL is set), and hold app/'s coverage to its floor
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --cov --cov-report=term:skip-covered $(PYTEST_ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

fmt: $(STAMP) ## format and fix
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

typecheck: $(STAMP) ## mypy --strict on app/ and the Python client
	$(BIN)/mypy

migrate: $(STAMP) ## apply migrations to DATABASE_URL
	$(BIN)/python -m app migrate

openapi: $(STAMP) ## regenerate openapi/openapi.json
	$(BIN)/python -m app openapi --output openapi/openapi.json

bench: $(STAMP) ## the performance benchmark, both databases (~30 min; docs/performance.md)
	$(BIN)/python -m bench $(BENCH_ARGS)

bench-smoke: $(STAMP) ## every benchmark row once at tiny sizes (~1 min)
	$(BIN)/python -m bench --smoke $(BENCH_ARGS)

check: lint typecheck test ## everything CI runs

clean: ## remove the venv and local data
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache .coverage
