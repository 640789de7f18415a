# The project's commands. The README names them; CI (.ci/run) calls `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEV_LOCK := requirements/dev.txt
# The venv is the dev lock's set: installed again whenever the lock (or pyproject) changes, or
# the checkout it serves does (the project's editable install points at one checkout, and a
# git worktree sharing this venv re-points it: back here, it is pointed back).
VENV_KEY := $(shell (cat pyproject.toml $(DEV_LOCK); echo '$(CURDIR)') | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(VENV_KEY)

.PHONY: dev test check fmt bench chaos chaos-cluster venv lock clean servers servers-stop asyncapi openapi docs manifests \
	browser node promtool image image-tools \
	contracts-schema contracts-dist

venv: $(STAMP)

# Exactly the locked versions, each file checked against its hash (requirements/dev.txt pins pip
# and setuptools too); then the project itself, built with the locked setuptools; then out
# goes whatever the lock no longer pins.
$(STAMP): pyproject.toml $(DEV_LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r $(DEV_LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python scripts/lock.py prune
	@rm -f $(VENV)/.installed-* && touch $@

# Resolve requirements/service.txt and requirements/dev.txt again from pyproject (uv pip compile,
# for CPython 3.11 on Linux x86_64 and aarch64, with hashes). Pins pyproject still allows are
# kept; UPGRADE=1 takes the newest allowed versions, UPGRADE="aiohttp yarl" those packages'.
lock: venv
	$(BIN)/python scripts/lock.py lock $(if $(filter 1,$(UPGRADE)),--upgrade,$(foreach p,$(UPGRADE),--upgrade-package $(p)))

# The checks run first: CI (.ci/run) calls only `make test`, and a lint or type error fails it.
# The tests run in two pytest-xdist workers, a file at a time (a file's servers and fixtures
# stay in one worker); each worker is a run of its own, with its own database and broker prefix
# (tests/conftest.py). PYTEST_ARGS replaces that: PYTEST_ARGS="-n 0" runs them in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile
test: check browser node promtool image-tools
	node --test web/tests/
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# tests/web drive Debian's Chromium (/usr/bin/chromium): installed here when missing (as root,
# or with sudo that asks no password). When it cannot be, those tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  echo "make: installing Debian's chromium for the browser tests"; \
	  mkdir -p .run; \
	  { $$sudo apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q chromium; \
	  } >.run/chromium.log 2>&1 || \
	  echo "make: chromium could not be installed (see .run/chromium.log): tests/web will skip"; }

# The alerts and dashboards are checked with promtool (tests/deploy: `promtool check rules`,
# `promtool test rules`), from Debian's prometheus package: installed here when missing, as
# chromium (only promtool is used; the package's daemon is not started). When it cannot be,
# those tests skip and say why.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  echo "make: installing Debian's prometheus for promtool"; \
	  mkdir -p .run; \
	  { $$sudo apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends \
	      prometheus && { $$sudo systemctl disable --now prometheus 2>/dev/null || true; }; \
	  } >.run/promtool.log 2>&1 || \
	  echo "make: promtool could not be installed (see .run/promtool.log): its tests will skip"; }

# web/tests (the page's reducer) run on Debian's nodejs: installed here when missing, as chromium.
node:
	@command -v node >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  echo "make: installing Debian's nodejs for web/tests"; \
	  mkdir -p .run; \
	  { $$sudo apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q nodejs; \
	  } >.run/nodejs.log 2>&1 || \
	  { echo "make: nodejs could not be installed (see .run/nodejs.log)"; exit 1; }; }

# The image of the Dockerfile, built here with Debian's buildah on a base made from Debian's
# packages (scripts/image.py: no registry of images needed): IMAGE=... names it.
IMAGE ?= ghcr.io/selminha/gin:dev
image: image-tools
	$(PYTHON) scripts/image.py build --tag $(IMAGE)

# buildah, podman, runc and mmdebstrap: installed when missing (as root, or with sudo that asks
# no password). When they cannot be, tests/deploy/test_image.py skips and says why.
image-tools:
	@command -v buildah >/dev/null 2>&1 && command -v podman >/dev/null 2>&1 && \
	command -v runc >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  echo "make: installing Debian's buildah, podman, runc and mmdebstrap for the image"; \
	  mkdir -p .run; \
	  { $$sudo apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q buildah podman runc mmdebstrap; \
	  } >.run/image-tools.log 2>&1 || \
	  echo "make: the image's tools could not be installed (see .run/image-tools.log): tests/deploy/test_image.py will skip"; }

servers: venv
	$(BIN)/python scripts/servers.py ensure --state-dir .run/servers --env-file .run/servers.env

servers-stop:
	$(PYTHON) scripts/servers.py stop --state-dir .run/servers

# The locks first (offline: they agree with pyproject), pip-audit on them last (skipped, saying
# so, when the advisory data cannot be reached).
check: venv
	$(BIN)/python scripts/lock.py check
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .
	$(BIN)/python -m mypy
	$(BIN)/python scripts/lock.py audit

fmt: venv
	$(BIN)/python -m ruff check --fix .
	$(BIN)/python -m ruff format .

bench: venv
	$(BIN)/python -m bench

# The backend under faults (kill -9 of each service, PostgreSQL restarts, RabbitMQ stopped) on
# throwaway servers of its own; one JSON report, exit 1 unless its counts are all 0 (minutes
# long: not part of make test).
chaos: venv
	$(BIN)/python -m chaos

# Production's shape on this machine (issue 28): a PostgreSQL primary and synchronous standby,
# three RabbitMQ nodes, two of each service, failovers and partitions during play.
# CHAOS_SYNC=off makes the standby asynchronous: what a promotion would then lose.
chaos-cluster: venv
	$(BIN)/python -m chaos.cluster

dev: venv
	$(BIN)/python scripts/dev.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

asyncapi: venv
	$(BIN)/python scripts/asyncapi.py > docs/asyncapi.yaml.tmp && mv docs/asyncapi.yaml.tmp docs/asyncapi.yaml

openapi: venv
	$(BIN)/python scripts/openapi.py > docs/openapi.yaml.tmp && mv docs/openapi.yaml.tmp docs/openapi.yaml

# The message contracts' schema, kept per schema version (docs/contracts/v<N>.json): rewritten
# only when the change is additive (docs/subscribing.md); a break fails here and in make test.
contracts-schema: venv
	$(BIN)/python scripts/contracts_schema.py

docs: asyncapi openapi contracts-schema

# shared/contracts alone, as the wheel selminha-gin-contracts (msgspec its only dependency) in
# dist/: what other teams' services install to read the events (docs/subscribing.md).
contracts-dist: venv
	$(BIN)/python scripts/build_contracts.py dist

manifests:
	kubectl kustomize deploy/k8s/overlays/dev
	kubectl kustomize deploy/k8s/overlays/prod
