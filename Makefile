# The project's commands. The README names them; CI (.ci/run) calls `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)

.PHONY: dev test check fmt bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: venv
	$(BIN)/python -m bench

dev: venv
	@echo "make dev: the services arrive with the table service (issue 3); the engine is in shared/engine."

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
