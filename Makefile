# The two commands: `make run` (the main job) and `make test` (lint, types, all tests).
# The venv is made from the declared minimum Python (pyproject's requires-python) when the machine has it, so
# `make test` (and CI, .ci/run) proves the minimum; PYTHON=... picks another (3.11 or newer).
PYTHON ?= $(shell command -v python3.11 || echo python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench fuzz catchup chaos soak services-down clean tools wheel
# Debian packages, without their recommends (Chromium's would bring avahi-daemon and samba libraries)
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends

$(STAMP): pyproject.toml
	@command -v java >/dev/null && command -v mvn >/dev/null || { echo "need Java 17+ and Maven (Debian: apt-get install --no-install-recommends openjdk-17-jdk-headless maven)"; exit 2; }
	@command -v go >/dev/null && command -v cargo >/dev/null || { echo "need Go and Rust (rustup) to build influxd once"; exit 2; }
	@command -v pkg-config >/dev/null || { apt-get update -qq && $(APT_INSTALL) pkg-config; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "need Python 3.11+ (requires-python): $(PYTHON) is $$($(PYTHON) -V 2>&1)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(STAMP)
	$(BIN)/hermeneut run $(ARGS)

# What the tests drive besides Kafka and InfluxDB, from Debian when missing: Chromium for the dashboard's end-to-end
# tests (Playwright never downloads a browser here), Prometheus and promtool (/metrics scraped, rules checked, history
# imported), systemd-analyze (the units of deploy/systemd verified), openssl (the CA and certificates of the Kafka TLS
# tests).
tools:
	@command -v openssl >/dev/null || { apt-get update -qq && $(APT_INSTALL) openssl; }
	@command -v chromium >/dev/null || { apt-get update -qq && $(APT_INSTALL) chromium; }
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { apt-get update -qq && $(APT_INSTALL) prometheus; }
	@command -v systemd-analyze >/dev/null || { apt-get update -qq && $(APT_INSTALL) systemd; }

# the wheel the Dockerfile builds and tests/integration/test_packaging.py installs in a clean venv
wheel: $(STAMP)
	$(BIN)/python -m pip wheel --no-deps --wheel-dir dist .

# lint, types, the fuzz run, then the unit tests on every core (pytest-xdist; a module's tests stay on one worker,
# so its fixtures are made once) and the integration tests one at a time (they run stages against one Kafka and one
# InfluxDB and wait on real time)
test: $(STAMP) tools
	@$(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(VENV) runs $$($(BIN)/python -V 2>&1), below requires-python 3.11: make clean, then make test"; exit 2; }
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(call FUZZ,$(TEST_FUZZ_INPUTS))
	$(BIN)/hermeneut services install
	$(BIN)/pytest -n auto --dist loadfile tests/unit $(PYTEST_ARGS)
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.pipeline $(ARGS)
	$(BIN)/python -m bench.codec
	$(BIN)/python -m bench.simulator
	$(BIN)/python -m bench.collector
	$(BIN)/python -m bench.context
	$(BIN)/python -m bench.scoring
	$(BIN)/python -m bench.detectors
	$(BIN)/python -m bench.metrics
	$(BIN)/python -m bench.alerts
	$(BIN)/python -m bench.queries
	$(BIN)/python -m bench.dashboard
	$(BIN)/python -m bench.importer
	$(BIN)/python -m bench.repeats

# every property-based test with FUZZ_INPUTS inputs per target from a fixed seed; prints inputs, exceptions and time.
# `make fuzz` runs 100,000 per target; `make test` runs 10,000 (TEST_FUZZ_INPUTS) before the suite, where the suite's
# own seeded run of the same tests is only a few hundred
FUZZ_INPUTS      ?= 100000
TEST_FUZZ_INPUTS ?= 10000
FUZZ = HYPOTHESIS_PROFILE=fuzz FUZZ_INPUTS=$(1) FUZZ_FANOUT=50 $(BIN)/pytest -m fuzz -p no:cacheprovider --hypothesis-seed=14 -q tests/unit
fuzz: $(STAMP)
	$(call FUZZ,$(FUZZ_INPUTS)) $(PYTEST_ARGS)

# the 1,000,000-sample catch-up of issue 17 on fresh local servers (tests/integration/test_sizes.py runs it at CI size)
catchup: $(STAMP)
	$(BIN)/python -m bench.catchup $(ARGS)

# the chaos suite of `make test` with every scene's rounds and outages stretched CHAOS_SCALE times; each scene
# prints its counts (and appends them as JSON to $(CHAOS_REPORT) when set)
CHAOS_SCALE ?= 4
chaos: $(STAMP) tools
	CHAOS_SCALE=$(CHAOS_SCALE) $(BIN)/pytest -p no:cacheprovider -s --timeout 7200 tests/integration/test_chaos.py

# an hour of 1,000 GPUs through the whole pipeline, the memory of every process sampled (ARGS="--minutes 10")
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(ARGS)

services-down: $(STAMP)
	$(BIN)/hermeneut services down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
