# The two commands: `make up` runs the whole stack on the embedded default; `make test` runs the tests.
.PHONY: up test lint setup setup-test bench

up: setup
	.venv/bin/rag up

test: setup-test
	$(MAKE) lint
	.venv/bin/python -m pytest

# The linters the tests run first: ruff (lint, then the format left unchanged) and mypy (pyproject.toml).
lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

setup:
	bash scripts/setup.sh

setup-test:
	bash scripts/setup.sh --test
