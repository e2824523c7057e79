# The two commands of the README: `make up` (set up + run) and `make test` (set up + the whole suite).
# `make ctproxy ARGS="status"` runs the installed command (it lives in .venv/bin, not on PATH).
.PHONY: up test bench lint bootstrap ctproxy

bootstrap:
	@./scripts/bootstrap.sh

up: bootstrap
	.venv/bin/ctproxy up $(ARGS)

ctproxy: bootstrap
	.venv/bin/ctproxy $(ARGS)

test: bootstrap
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/python -m pytest $(PYTEST_ARGS)

bench: bootstrap
	.venv/bin/python -m bench $(ARGS)

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/lint-imports
