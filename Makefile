# The two commands of the README: `make up` (set up + run) and `make test` (set up + the whole suite).
.PHONY: up test bench lint bootstrap

bootstrap:
	@./scripts/bootstrap.sh

up: bootstrap
	.venv/bin/ctproxy up $(ARGS)

test: bootstrap
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/python -m pytest $(PYTEST_ARGS)

bench: bootstrap
	.venv/bin/python -m bench $(ARGS)

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/lint-imports
