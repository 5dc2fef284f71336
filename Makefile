# The two commands a newcomer needs: `make dry-run` and `make test`. Each sets up .venv first
# (Python 3.11 + pip only; every package comes from PyPI, pinned in constraints.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export NO_GCE_CHECK := true

.PHONY: setup tools test lint typecheck pytest orbax-check dry-run ui bench mutmut clean

setup: $(STAMP) tools

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

## Debian tools the tests use, installed with apt-get when missing (CI runs as root): shellcheck checks
## every rendered startup script; the browser test drives Debian's Chromium through Playwright (its own
## browser download does not work offline); the production-server test runs Debian's PostgreSQL
tools:
	@missing=""; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	test -x /usr/bin/chromium || missing="$$missing chromium fonts-dejavu-core"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then apt-get update -qq && \
		apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends $$missing; fi

## the whole test command CI runs: lint, type-check, tests
test: setup lint typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check tpu_ops

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## on 3 workers, even on the 2-core CI machine: the suite mostly waits (pytest-xdist; `make pytest WORKERS=0` for
## one process): a test file, or the files that share a slow session fixture, runs on one worker, files with a
## slow test first (tests/conftest.py; docs/testing.md)
WORKERS ?= 3
pytest: setup
	$(VENV)/bin/pytest -q $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile)

## a real JAX + orbax-checkpoint trainer (CPU) on 2 slices (one preempted during a save), and through the
## ladder v4-16 -> v4-8 (accumulation 2) -> v4-16, ends with the parameters of an uninterrupted run; its
## wheels (~185 MB, examples/orbax_trainer/constraints.txt) are downloaded from PyPI once into
## .tpu-ops/orbax-wheelhouse. A few minutes: not in `make pytest` (docs/orbax-trainer.md).
orbax-check: setup
	$(VENV)/bin/pytest -q -m orbax tests/train/test_orbax_trainer.py

## the main job: the whole pipeline, locally, against emulated clouds
dry-run: $(STAMP)
	$(VENV)/bin/tpu-ops dry-run

## the Prefect UI on http://127.0.0.1:4200 (`make ui PORT=4300` for another port), with its own database
## under .tpu-ops/prefect (not ~/.prefect). Loopback unless told otherwise (UI_HOST=...); with PREFECT_SERVER_API_AUTH_STRING set (from a
## secret store) it refuses clients without PREFECT_API_AUTH_STRING (docs/production-server.md)
## The host and port go into Prefect's settings too: the UI's pages derive the API they call from them (else :4200).
UI_HOME ?= $(CURDIR)/.tpu-ops/prefect
PORT ?= 4200
UI_HOST ?= 127.0.0.1
ui: $(STAMP)
	mkdir -p $(UI_HOME)
	@echo "Prefect UI: http://$(UI_HOST):$(PORT); in the other shells: export PREFECT_API_URL=http://$(UI_HOST):$(PORT)/api"
	@if [ -n "$$PREFECT_SERVER_API_AUTH_STRING" ]; then echo "auth string required: give clients and workers PREFECT_API_AUTH_STRING (from your secret store)"; fi
	PREFECT_HOME=$(UI_HOME) PREFECT_SERVER_API_HOST=$(UI_HOST) PREFECT_SERVER_API_PORT=$(PORT) \
		$(VENV)/bin/prefect server start --host $(UI_HOST) --port $(PORT)

## the benchmarks: mirror against rclone (Debian's rclone is installed if missing), recovery overhead,
## audit verify of 10,000 records
bench: $(STAMP)
	command -v rclone >/dev/null || { apt-get update -qq && apt-get install -y -qq rclone; }
	$(PY) bench/mirror_bench.py
	$(PY) bench/recovery_bench.py
	$(PY) bench/audit_bench.py

## mutation testing against the unit tests, lists survivors. By default the ledger summary and the cost functions
## (a few minutes on 2 cores); `make mutmut MUTANTS=` mutates all of tpu_ops/provision and tpu_ops/mirror.
MUTANTS ?= 'tpu_ops.provision.ledger.x_summarise*' 'tpu_ops.provision.cost.x_*'
mutmut: $(STAMP)
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 $(MUTANTS) || true
	$(VENV)/bin/mutmut results | grep -v ': not checked$$' || true

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache mutants .tpu-ops/dry-run
