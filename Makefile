# Everything a fresh machine needs is installed by these targets (docs/design.md §10).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
MVN := infra/jars/fetch.sh
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export GX_ANALYTICS_ENABLED := false
export TQDM_DISABLE := 1
export DAGSTER_DISABLE_TELEMETRY := true
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(CURDIR)/$(VENV)/bin/python
PYTEST_ARGS ?=
# make test's xdist workers (tests/conftest.py says what runs together): each has its own
# SparkSession (4 GB driver). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
# Dagster instance storage: sqlite (default, in DAGSTER_HOME) or postgres (the cluster stack:
# `make pg-up`, then `make setup DAGSTER_INSTANCE=postgres` puts infra/dagster-postgres.yaml in
# DAGSTER_HOME; the DAGSTER_PG_* defaults below reach every Dagster process make starts).
DAGSTER_INSTANCE ?= sqlite
# The local servers' generated secrets (infra/local_secrets.py; made by pg-up, s3-up and the
# cluster targets): owner-only, never in the repo.
export LOCAL_SECRETS_FILE ?= $(CURDIR)/.secrets/local.env
LOCAL_SECRETS := $(LOCAL_SECRETS_FILE)
ifeq ($(DAGSTER_INSTANCE),sqlite)
DAGSTER_YAML := infra/dagster.yaml
else ifeq ($(DAGSTER_INSTANCE),postgres)
DAGSTER_YAML := infra/dagster-postgres.yaml
export DAGSTER_PG_HOST ?= 127.0.0.1
export DAGSTER_PG_PORT ?= 5433
export DAGSTER_PG_USERNAME ?= dagster
export DAGSTER_PG_PASSWORD ?= $(shell sed -n 's/^DAGSTER_PG_PASSWORD=//p' $(LOCAL_SECRETS) 2>/dev/null)
export DAGSTER_PG_DB ?= dagster
else
$(error DAGSTER_INSTANCE=$(DAGSTER_INSTANCE): use sqlite or postgres)
endif

.PHONY: setup system-deps materialize scorecard kafka-up kafka-down demo test test-unit ui stream bench bench-guard bench-jfr bench-stages bench-steps bench-service bench-commits bench-fence bench-run-path bench-replay-cost report profile drills lint clean screenshots dagster-instance \
	s3-up s3-down registry-up registry-down pg-up pg-down spark-cluster-up spark-cluster-down kafka-cluster-up \
	kafka-cluster-down cluster-up cluster-down cluster-connect-down demo-cluster ui-cluster test-cluster test-cluster-run \
	observe-up observe-down daily-metrics dashboards test-alerts test-long spark-up spark-down \
	prerequisites down class-archive

setup: prerequisites system-deps $(VENV)/.installed .jars/.fetched .jars/logstore/.built \
	.jars/registry/.fetched dagster-instance

# Before the venv is created (only then): Python 3.11 with its venv module, memory for two Spark
# drivers and a broker, disk for the venv and the jars; one line saying what is missing, exit 1
# (infra/prerequisites.sh; PREREQ_MIN_MEMORY_GB=6 and PREREQ_MIN_DISK_GB=3, 0 skips a check).
prerequisites:
	@test -x $(PY) || infra/prerequisites.sh $(PYTHON)

# The Debian packages the targets and tests run (infra/system_packages.sh: installed with apt-get
# as root; otherwise it prints the command to run and stops): a JDK 17 and Maven for the jars,
# Kafka and Spark, PostgreSQL's server for the cluster stack and the writer-lock tests,
# Prometheus (with promtool) and Alertmanager for `make observe-up` and the rules' tests.
SYSTEM_PACKAGES := openjdk-17-jdk-headless=java maven=mvn postgresql=/usr/lib/postgresql/*/bin/initdb \
	prometheus=promtool prometheus-alertmanager=prometheus-alertmanager
system-deps:
	@infra/system_packages.sh $(SYSTEM_PACKAGES)

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: install Python 3.11 (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install -q -e '.[dev]'
	@touch $@

.jars/.fetched: infra/jars/spark/pom.xml infra/jars/kafka/pom.xml infra/jars/s3proxy/pom.xml \
		infra/jars/s3/pom.xml infra/jars/settings.xml | system-deps
	rm -rf .jars/spark .jars/kafka .jars/s3proxy .jars/s3
	$(MVN) infra/jars/spark/pom.xml
	$(MVN) infra/jars/s3/pom.xml
	$(MVN) infra/jars/kafka/pom.xml
	$(MVN) infra/jars/s3proxy/pom.xml
	@touch $@

# The Delta log store of s3a:// roots (infra/jars/logstore: PgLogStore.java, whose commit point is
# a row in the lock server, fenced by the writer's lock; docs/design.md §2.2), compiled with javac
# against pyspark's Hadoop client and Delta's storage jar, beside the PostgreSQL JDBC driver.
LOGSTORE_SOURCES := $(wildcard infra/jars/logstore/src/lakehouse/delta/*.java)
.jars/logstore/.built: $(LOGSTORE_SOURCES) infra/jars/logstore/build.sh infra/jars/logstore/pom.xml \
		infra/jars/settings.xml .jars/.fetched $(VENV)/.installed | system-deps
	rm -rf .jars/logstore
	$(MVN) infra/jars/logstore/pom.xml
	infra/jars/logstore/build.sh $(PY)
	@touch $@

# Apicurio Registry (a schema registry with a Confluent-compatible API; its Quarkus tar.gz
# unpacked into .jars/registry/app) for Avro specs whose writer schemas are registered.
.jars/registry/.fetched: infra/jars/registry/pom.xml infra/jars/settings.xml | system-deps
	rm -rf .jars/registry
	$(MVN) infra/jars/registry/pom.xml
	mkdir -p .jars/registry/app
	tar xzf .jars/registry/apicurio-registry-app-*-all.tar.gz -C .jars/registry/app
	rm .jars/registry/apicurio-registry-app-*-all.tar.gz
	@touch $@

# DAGSTER_HOME/dagster.yaml is a copy of the selected instance file, refreshed when it differs.
dagster-instance:
	@mkdir -p $(DAGSTER_HOME)
	@cmp -s $(DAGSTER_YAML) $(DAGSTER_HOME)/dagster.yaml || cp -v $(DAGSTER_YAML) $(DAGSTER_HOME)/dagster.yaml

kafka-up: setup
	@$(PY) infra/kafka/broker.py up

# This machine's class archive for the product's Spark drivers (AppCDS, .jars/cds/): a fresh
# process's driver maps Spark's, Delta's and Kafka's classes instead of loading them (a session in
# ~4 s instead of ~8). Dumped once by a catch-up and a reconcile on a scratch topic (about two
# minutes here; infra/spark/class_archive.py), again when the JDK, pyspark or the jars change.
class-archive: setup kafka-up
	@$(PY) infra/spark/class_archive.py

# Stopping needs no set-up (and does nothing where nothing was installed).
kafka-down:
	@test ! -x $(PY) || $(PY) infra/kafka/broker.py down

# The Spark Connect server on 127.0.0.1:$SPARK_CONNECT_PORT (default 15002; infra/spark/connect.py,
# state and server.log in .spark-connect/): a warm engine with the project's jars; runs use it when
# SPARK_REMOTE=sc://127.0.0.1:15002 is set, and run classic (a driver of their own) without it.
# It admits only clients presenting its token (a new one at each start, in
# .spark-connect/connect-<port>.token, mode 0600): the project's runs read it there.
spark-up: setup
	@$(PY) infra/spark/connect.py up

spark-down:
	@test ! -x $(PY) || $(PY) infra/spark/connect.py down

# Every server the targets start, stopped: the Spark Connect server, Prometheus, Alertmanager and
# the daily exporter, the schema registry, the broker, the cluster stack. Keeps the data (`make
# clean` removes it). Needs no set-up. Foreground targets (make stream, ui, demo's runs) stop
# with Ctrl-C; `make demo` leaves the broker running.
down: spark-down observe-down registry-down kafka-down cluster-down

# The cluster stack on loopback (infra/cluster.env lists the settings that point the pipeline at
# it): S3Proxy object store, PostgreSQL for Dagster, Spark standalone, three Kafka brokers.
s3-up: setup
	@$(PY) infra/s3/s3proxy.py up

# The schema registry on 127.0.0.1:$REGISTRY_PORT (default 8081; in memory: a restart forgets
# its schemas); a spec's `avro.registry.url` is http://127.0.0.1:8081/apis/ccompat/v7.
registry-up: setup
	@$(PY) infra/registry/registry.py up

registry-down:
	@test ! -x $(PY) || $(PY) infra/registry/registry.py down

pg-up: setup
	@$(PY) infra/postgres/pg.py up

spark-cluster-up: setup
	@$(PY) infra/spark/cluster.py up

kafka-cluster-up: setup
	@$(PY) infra/kafka/broker.py cluster-up

cluster-up: s3-up pg-up spark-cluster-up kafka-cluster-up

s3-down:
	@test ! -x $(PY) || $(PY) infra/s3/s3proxy.py down

pg-down:
	@test ! -x $(PY) || $(PY) infra/postgres/pg.py down

spark-cluster-down:
	@test ! -x $(PY) || $(PY) infra/spark/cluster.py down

kafka-cluster-down:
	@test ! -x $(PY) || $(PY) infra/kafka/broker.py cluster-down

cluster-down: cluster-connect-down s3-down pg-down spark-cluster-down kafka-cluster-down

cluster-connect-down:
	@test ! -x $(PY) || $(PY) $(CLUSTER_CONNECT) down

# Monitoring on loopback (infra/prometheus/observe.py): Prometheus with the rules of
# infra/prometheus/rules, Alertmanager, and the daily-side exporter, state in .observe/.
observe-up: setup
	@$(PY) infra/prometheus/observe.py up

observe-down:
	@test ! -x $(PY) || $(PY) infra/prometheus/observe.py down

# The daily-side exporter in the foreground (observe-up runs it as a daemon).
daily-metrics: setup
	$(PY) -m orchestration.daily_metrics

# The Grafana dashboard JSON (infra/grafana/lakehouse.json) from its generator.
dashboards: setup
	$(PY) infra/grafana/dashboard.py > infra/grafana/lakehouse.json.tmp
	mv infra/grafana/lakehouse.json.tmp infra/grafana/lakehouse.json

demo: setup kafka-up class-archive
	$(PY) -m testkit.demo

# The same pipeline on the cluster stack (infra/cluster.env: s3a:// root on S3Proxy, Spark
# standalone, Dagster on PostgreSQL in .dagster_home_cluster, three brokers). The servers keep
# running afterwards for `make ui-cluster`; `make cluster-down` stops them.
CLUSTER_HOME := $(CURDIR)/.dagster_home_cluster
CLUSTER_ENV := $(PY) infra/local_secrets.py ensure >/dev/null || exit 1; set -a; \
	. $(LOCAL_SECRETS); . infra/cluster.env; set +a; export DAGSTER_HOME=$(CLUSTER_HOME)
# A recipe line holding $(MAKE) runs even under `make -n`: such lines call make only.
CLUSTER_INSTANCE := $(MAKE) --no-print-directory dagster-instance DAGSTER_INSTANCE=postgres \
	DAGSTER_HOME=$(CLUSTER_HOME)
demo-cluster: setup cluster-up
	@$(CLUSTER_INSTANCE)
	@$(CLUSTER_ENV); $(PY) -m testkit.demo

# With SPARK_REMOTE naming this machine, the daily runs use a Spark Connect server attached to the
# cluster: started first under the cluster's settings (state in .spark-connect-cluster, where its
# runs read its token; make cluster-down stops it).
CLUSTER_CONNECT_STATE := $(CURDIR)/.spark-connect-cluster
CLUSTER_CONNECT := infra/spark/connect.py --state-dir $(CLUSTER_CONNECT_STATE)
ui-cluster: setup
	@$(CLUSTER_INSTANCE)
	@$(CLUSTER_ENV); $(if $(LOCAL_CONNECT),$(PY) $(CLUSTER_CONNECT) up &&) \
	  SPARK_CONNECT_STATE_DIR=$(CLUSTER_CONNECT_STATE) \
	  $(VENV)/bin/dagster dev -h 127.0.0.1 -p $${DAGSTER_PORT:-3000} -w workspace.yaml

# The end-to-end scenario on the cluster stack with a broker stopped and a Spark worker killed
# (tests/cluster); brings the stack up and tears it down. Run by .ci/run after `make test`.
test-cluster: setup
	@$(MAKE) --no-print-directory cluster-up
	@$(MAKE) --no-print-directory test-cluster-run; rc=$$?; \
	  $(MAKE) --no-print-directory cluster-down; \
	  $(MAKE) --no-print-directory test-alerts || rc=1; \
	  $(MAKE) --no-print-directory test-long || rc=1; exit $$rc

# The local stack's tests of several minutes each (marked `long`: the three-pipeline service,
# its crash and every date proven after it, the UI in a browser: Debian's chromium, installed
# here, driven by Playwright); run by test-cluster.
test-long: setup kafka-up class-archive
	@infra/system_packages.sh chromium=chromium
	SUITE_TIER=long $(PY) -m pytest -o addopts=-ra -p no:randomly -m long --ignore=tests/cluster --ignore=tests/alerts -n $(TEST_WORKERS) --dist loadgroup tests $(PYTEST_ARGS)

# Alerts end to end on the local stack (tests/alerts: the real service, Prometheus, Alertmanager
# and a webhook; a minute or two, so not in `make test`); run by test-cluster.
test-alerts: setup kafka-up class-archive
	SUITE_TIER=alerts $(PY) -m pytest -o addopts=-ra -p no:randomly tests/alerts $(PYTEST_ARGS)

# The scenario alone, on a running cluster stack.
test-cluster-run: setup
	@$(CLUSTER_INSTANCE)
	@$(CLUSTER_ENV); \
	  SUITE_TIER=cluster $(PY) -m pytest -o addopts=-ra -o timeout=2400 -p no:randomly tests/cluster $(PYTEST_ARGS)

# The suite on the local stack (lint, the broker, every test but those marked `long`), on
# TEST_WORKERS workers. Left to `make test-cluster` (of tens of minutes, run after it): the
# cluster scenario (tests/cluster: object store, Spark standalone, three brokers, PostgreSQL), the
# alerts end to end (tests/alerts: the service, Prometheus, Alertmanager; `make test-alerts`) and
# the `long` tests (`make test-long`: the multi-pipeline service and its crash).
test: setup lint kafka-up class-archive
	$(PY) -m bench.guard
	SUITE_TIER=test $(PY) -m pytest --ignore=tests/cluster --ignore=tests/alerts -m "not long" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The tests that need no JVM, no broker and no server (tests/unit), on the xdist workers: under a
# minute. `make test` runs them too, with tests/spark and tests/e2e.
test-unit: setup
	SUITE_TIER=unit $(PY) -m pytest tests/unit -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The daemon runs the schedules and sensors, which read the broker. With SPARK_REMOTE naming this
# machine (sc://127.0.0.1:<port>), the daily runs it launches use that Spark Connect server:
# started first (make spark-up, on SPARK_REMOTE's port).
LOCAL_CONNECT = $(if $(filter sc://127.0.0.1:% sc://localhost:%,$(SPARK_REMOTE)),spark-up)
ui: setup kafka-up class-archive $(LOCAL_CONNECT)
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p $${DAGSTER_PORT:-3000} -w workspace.yaml

stream: setup kafka-up class-archive
	$(PY) -m orchestration.service.runner

# One run from the command line, recorded in DAGSTER_HOME like the UI's (README "Operations"):
# The readiness scorecard of the running deployment (its default pipeline; SCORECARD=<prefix>/
# readiness_scorecard for a spec pipeline of PIPELINES): seven rows with their evidence, in
# $(LAKEHOUSE_ROOT)/reports/scorecard.html; a row that fails is a failed asset check.
SCORECARD ?= readiness_scorecard
scorecard: setup kafka-up
	$(VENV)/bin/dagster asset materialize -m orchestration.definitions --select '$(SCORECARD)'
	@$(PY) -m assets.observe.scorecard

# make materialize SELECT=<asset,...> [PARTITION=<date> | PARTITION_RANGE=<date>...<date>]
#   [CONFIG='<run config JSON>']
ifneq ($(filter materialize,$(MAKECMDGOALS)),)
ifeq ($(SELECT),)
$(error name the assets: make materialize SELECT=<asset,...> [PARTITION=YYYY-MM-DD | PARTITION_RANGE=YYYY-MM-DD...YYYY-MM-DD] [CONFIG='<json>'])
endif
endif
materialize: setup kafka-up class-archive
	$(VENV)/bin/dagster asset materialize -m orchestration.definitions --select '$(SELECT)' \
	  $(if $(PARTITION),--partition '$(PARTITION)') \
	  $(if $(PARTITION_RANGE),--partition-range '$(PARTITION_RANGE)') \
	  $(if $(CONFIG),--config-json '$(CONFIG)')

# The product against hand-written Spark jobs on one topic, warmed, interleaved, medians of 3
# (bench.ratios: BENCH_EVENTS=2000000), then the service at 20,000 and 5,000 events/s
# (bench.service_run: BENCH_SERVICE_SECONDS=600 and 180).
bench: setup kafka-up class-archive
	$(PY) -m bench.ratios
	$(PY) -m bench.service_run
	BENCH_SERVICE_RATE=5000 BENCH_SERVICE_SECONDS=180 $(PY) -m bench.service_run

# Each stage on its own (raw consume, parse, catch-up, corrections, replay; BENCH_AT_SCALE=1 adds
# 20M rows of history).
bench-stages: setup kafka-up class-archive
	$(PY) -m bench.run

# The service next to three live queries written by hand (naive, tuned, medallion), interleaved, at
# 20,000 and 5,000 events/s (bench.service_peers: BENCH_SERVICE_ROUNDS=3, BENCH_SERVICE_WARMUP=90,
# BENCH_SERVICE_SECONDS=180); BENCH_KNEE=1 adds each one's knee (=only: the knee alone);
# BENCH_SERVICE_ALONE=1 (or service_run's options): the service alone (bench.service_run).
bench-service: setup kafka-up class-archive
	$(PY) -m bench.service_peers

# An ingest batch's steps on a cached batch (no Kafka, no commits): µs a record by step
# (bench.step_costs), and one step's variants A/B in the JVM's CPU seconds (bench.step_ab:
# STEP_AB=bronze|windows).
STEP_AB ?= bronze
# The guard on the engine's price (`make test` runs it first): the service's steps against the
# hand-written query's on one cached frame, failing 15% above the ratio in bench/guard.json
# (bench.guard: GUARD_EVENTS=60000, GUARD_ROUNDS=6; `--record` moves the ratio).
bench-guard: setup
	$(PY) -m bench.guard

bench-steps: setup
	$(PY) -m bench.step_costs
	$(PY) -m bench.step_ab $(STEP_AB)

# Java Flight Recorder samples of the service's steps and of the hand-written query's on the
# guard's frame: the JVM frames the CPU goes to (bench.jfr_steps; JFR_EVENTS, JFR_ROUNDS).
bench-jfr: setup
	$(PY) -m bench.jfr_steps

# Where an ingest batch's time goes (50k, 270k, 2M records): Spark jobs by step, Delta commits
# per table, the fixed cost of a one-record batch.
profile: setup kafka-up class-archive
	$(PY) -m bench.profile

# A Dagster run from a cold start (`dagster asset materialize` in a fresh process) against the
# hand-written jobs each in a fresh process: catch-up, empty catch-up, reconcile_dates, replay
# (bench.run_path: RUN_PATH_EVENTS=3000, RUN_PATH_ROUNDS=3).
bench-run-path: setup kafka-up class-archive dagster-instance
	$(PY) -m bench.run_path

# What a replay costs by its drivers (records and bytes fetched, written, CPU): docs/cost.md.
bench-replay-cost: setup kafka-up
	$(PY) -m bench.replay_cost

# What one small Delta commit costs here, by kind (plain/idempotent append, UPDATE), in Spark jobs.
bench-commits: setup
	$(PY) -m bench.commit_costs

# What the fenced log store of s3a:// roots costs a commit against Delta's single-driver S3 log
# store, on S3Proxy and a lock server of its own, interleaved (bench.fenced_commits:
# BENCH_FENCE_ROUNDS=15, BENCH_FENCE_WARMUP=2).
bench-fence: setup
	$(PY) -m bench.fenced_commits

# docs/performance.md's and docs/cluster.md's tables and plots (docs/images/perf-*.png) from
# the files in bench/results/ (bench.report); tests/unit/test_performance_page.py fails when they differ.
report: $(VENV)/.installed
	$(PY) -m bench.report

# Fault drills (bench/drills): crashes, a broker outage, a schema registry outage, concurrent
# writers, bad input at volume, retention, transactions, authentication, lifecycle, old dates, the
# object store. DRILLS_SCALE=0.05 for a quick run; results in bench/results/.
drills: setup kafka-up class-archive
	$(PY) -m bench.drills $(DRILLS_ARGS)

# Headless Chromium (installed for this target and test-long): the README's pictures from the
# demo's instance, and docs/images/ui/ from the browser test's pages (its own small instance).
screenshots: setup kafka-up class-archive
	@infra/system_packages.sh chromium=chromium
	$(PY) scripts/screenshots.py
	UI_SCREENSHOTS=$(CURDIR)/docs/images/ui SUITE_TIER=long $(PY) -m pytest -o addopts=-ra -p no:randomly -m long tests/e2e/test_ui_browser.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vulture
	$(VENV)/bin/dg check yaml
	$(VENV)/bin/dg check defs

clean: kafka-down cluster-down observe-down registry-down spark-down
	rm -rf .lakehouse .dagster_home .dagster_home_cluster .kafka .s3proxy .postgres .spark \
	  .kafka-cluster .observe .registry .spark-connect .secrets
