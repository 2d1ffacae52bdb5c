# The two set-up commands: `make demo` and `make test`. Both work from a fresh clone.
# As root they apt-get install the Postgres JDBC driver (Iceberg's JDBC catalog) and Chromium (the UI test).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup system-deps services demo lint test docs dev bench down clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[dev,bench]'
	touch $@

system-deps:
	@bash scripts/system-deps.sh

services: setup system-deps
	$(BIN)/runstate services up

demo: services
	$(BIN)/runstate demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint services
	$(BIN)/pytest -n 3 --dist loadgroup --durations=15 $(PYTEST_ARGS)

# The documentation site (mkdocs.yml) into site/, strict: a broken link or reference fails it.
docs: setup
	$(BIN)/mkdocs build --strict

dev: services
	$(BIN)/runstate dev

bench: services
	$(BIN)/python bench/eventstore.py
	$(BIN)/python bench/wal.py
	$(BIN)/python bench/maintenance.py
	$(BIN)/python bench/dataset_tables.py

down:
	-$(BIN)/runstate services down

clean: down
	rm -rf $(VENV) .runstate
