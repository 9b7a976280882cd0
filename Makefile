# evermirror: `make run` serves on 127.0.0.1:8000, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install run test lint typecheck fmt migrate openapi bench bench-smoke check clean

help: ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the project with its dev tools

run: $(STAMP) ## migrate the embedded SQLite file and serve on 127.0.0.1:8000
	$(BIN)/python -m app serve

test: $(STAMP) ## run the suite (SQLite; PostgreSQL too when TEST_DATABASE_URL is set)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check app tests scripts bench
	$(BIN)/ruff format --check app tests scripts bench

fmt: $(STAMP) ## format and fix
	$(BIN)/ruff format app tests scripts bench
	$(BIN)/ruff check --fix app tests scripts bench

typecheck: $(STAMP) ## mypy --strict on app/
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
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
