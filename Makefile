# The two commands: `make up` runs the whole stack on the embedded default; `make test` runs the tests.
.PHONY: up test setup setup-test bench

up: setup
	.venv/bin/rag up

test: setup-test
	.venv/bin/python -m pytest

setup:
	bash scripts/setup.sh

setup-test:
	bash scripts/setup.sh --test
