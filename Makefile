# Everything a fresh machine needs is installed by these targets (DESIGN §9).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
MVN := mvn -q -B -s infra/jars/settings.xml
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export GX_ANALYTICS_ENABLED := false
export TQDM_DISABLE := 1
export DAGSTER_DISABLE_TELEMETRY := true
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(CURDIR)/$(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup kafka-up kafka-down demo test ui stream bench lint clean screenshots

setup: $(VENV)/.installed .jars/.fetched $(DAGSTER_HOME)/dagster.yaml

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: install Python 3.11 (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

.jars/.fetched: infra/jars/spark/pom.xml infra/jars/kafka/pom.xml infra/jars/settings.xml
	@command -v mvn >/dev/null || { echo "error: mvn not found: install Apache Maven 3.8+ (apt-get install maven)"; exit 1; }
	@command -v java >/dev/null || { echo "error: java not found: install a JDK 17 (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	rm -rf .jars/spark .jars/kafka
	$(MVN) -f infra/jars/spark/pom.xml dependency:copy-dependencies
	$(MVN) -f infra/jars/kafka/pom.xml dependency:copy-dependencies
	@touch $@

$(DAGSTER_HOME)/dagster.yaml: infra/dagster.yaml
	@mkdir -p $(DAGSTER_HOME)
	cp infra/dagster.yaml $@

kafka-up: setup
	@$(PY) infra/kafka/broker.py up

kafka-down:
	@$(PY) infra/kafka/broker.py down

demo: setup kafka-up
	$(PY) -m orchestration.demo

test: setup kafka-up
	$(PY) -m pytest $(PYTEST_ARGS)

ui: setup
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p $${DAGSTER_PORT:-3000} -w workspace.yaml

stream: setup kafka-up
	$(PY) -m spark_jobs.service

bench: setup kafka-up
	$(PY) -m bench.run

screenshots: setup
	$(PY) scripts/screenshots.py

lint: setup
	$(VENV)/bin/ruff check .

clean: kafka-down
	rm -rf .lakehouse .dagster_home .kafka
