# The two commands: `make run` (the main job) and `make test` (lint, types, all tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench services-down clean chromium prometheus

$(STAMP): pyproject.toml
	@command -v java >/dev/null && command -v mvn >/dev/null || { echo "need Java 17+ and Maven (Debian: apt-get install openjdk-17-jdk-headless maven)"; exit 2; }
	@command -v go >/dev/null && command -v cargo >/dev/null || { echo "need Go and Rust (rustup) to build influxd once"; exit 2; }
	@command -v pkg-config >/dev/null || { apt-get update -qq && apt-get install -y -qq pkg-config; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(STAMP)
	$(BIN)/hermeneut run $(ARGS)

# the dashboard's end-to-end tests drive Debian's Chromium (Playwright never downloads a browser here)
CHROMIUM := $(shell command -v chromium 2>/dev/null)

chromium:
ifeq ($(CHROMIUM),)
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
endif

# the import tests read from a real Prometheus (Debian's 2.42 and promtool), started by pipeline/services/prometheus.py
PROMETHEUS := $(shell command -v prometheus 2>/dev/null)

prometheus:
ifeq ($(PROMETHEUS),)
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
endif

test: $(STAMP) chromium prometheus
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.pipeline $(ARGS)
	$(BIN)/python -m bench.codec
	$(BIN)/python -m bench.simulator
	$(BIN)/python -m bench.collector
	$(BIN)/python -m bench.context
	$(BIN)/python -m bench.scoring
	$(BIN)/python -m bench.detectors
	$(BIN)/python -m bench.alerts
	$(BIN)/python -m bench.queries
	$(BIN)/python -m bench.dashboard
	$(BIN)/python -m bench.importer

services-down: $(STAMP)
	$(BIN)/hermeneut services down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
