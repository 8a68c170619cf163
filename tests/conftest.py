"""Shared fixtures: a real Kafka broker, one SparkSession for the suite, isolated instances."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest

from testkit.faults import DRIVER_JAVA_OPTIONS
from testkit.infra import broker_module
from testkit.ports import free_port  # the tests import it from here
from testkit.runs import run_job  # noqa: F401 - the tests import it from here

REPO = Path(__file__).resolve().parents[1]
# With SUITE_TIER set (the make targets), the run's timings go to bench/results/suite-*.json.
pytest_plugins = ["testkit.suite_timings"]
# The tiers (tests/unit: no JVM, no broker; tests/spark; tests/e2e): a test imports another's
# helpers by module name whichever tier it is in (tests/cluster and tests/alerts do too).
sys.path[1:1] = [str(REPO / "tests" / tier) for tier in ("unit", "spark", "e2e")]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
# The definitions load once per worker, before any test's instance has data: their daily
# partitions start at a fixed date, not at the first event date of whichever root is set then.
os.environ.setdefault("PARTITIONS_START", "2025-01-01")


# `make test` spreads the suite over xdist workers (TEST_WORKERS, `--dist loadgroup`). Tests that
# share an expensive fixture run on one worker, so that it is built once: their group is derived
# from the fixtures they use (any module-scoped one, and the session-scoped ones below, which are
# worth building once per run rather than once per worker); any other test goes anywhere. Tests
# marked `slow` go first (after pytest-randomly's shuffle) so that none is left for the end.
SHARED_SESSION_FIXTURES = {"scenario", "spark_connect", "schema_registry", "pg_lock_url"}


def xdist_group(item: pytest.Item) -> str | None:
    """The group of the expensive fixture a test uses, None when it uses none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::", 1)[0]
    for name in sorted(info.names_closure):
        fixturedefs = info.name2fixturedefs.get(name)
        if not fixturedefs:
            continue
        scope = fixturedefs[-1].scope
        if scope == "module":
            return module  # module-scoped fixtures: one instance per module
        if scope == "session" and name in SHARED_SESSION_FIXTURES:
            return name
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    # Before every other implementation: xdist's worker hook reads the marks to group the items.
    # (It groups by rewriting node ids, which pytest 9.2 ignores: pyproject.toml pins pytest below
    # it, and tests/unit/test_test_groups.py fails should grouping stop working again.)
    for item in items:
        if group := xdist_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    return (yield)


# tests/unit stays unit (`make test-unit`, under a minute): no JVM, no broker, no server. A test
# there that asks for one of these fixtures fails before it is built; one that starts Spark or
# opens a Kafka client in the test's process fails at that call. (A subprocess is not watched.)
UNIT = REPO / "tests" / "unit"
NOT_IN_UNIT = {"spark", "spark_connect", "kafka_bootstrap", "instance_env", "scenario",
               "pg_lock_url", "schema_registry"}


def in_unit(item: pytest.Item) -> bool:
    return Path(item.path).is_relative_to(UNIT)


@pytest.hookimpl(tryfirst=True)  # before any fixture is set up
def pytest_runtest_setup(item):
    if in_unit(item) and (used := NOT_IN_UNIT & set(item.fixturenames)):
        pytest.fail(f"tests/unit has no JVM, broker or server: this test uses "
                    f"{', '.join(sorted(used))}; move it to tests/spark or tests/e2e",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _unit_tier_guard(request, monkeypatch):
    if not in_unit(request.node):
        return

    def refuse(what: str):
        def refused(*_args, **_kwargs):
            raise RuntimeError(f"tests/unit has no JVM or broker: this test {what}; move it to "
                               "tests/spark or tests/e2e")
        return refused

    monkeypatch.setattr("pyspark.sql.SparkSession.Builder.getOrCreate",
                        refuse("starts Spark (SparkSession.builder.getOrCreate)"))
    monkeypatch.setattr("pyspark.context.launch_gateway", refuse("starts a JVM (SparkContext)"))
    monkeypatch.setattr("lakehouse.kafka.admin.AdminClient",
                        refuse("opens a Kafka admin client"))
    monkeypatch.setattr("confluent_kafka.Producer", refuse("opens a Kafka producer"))
    monkeypatch.setattr("confluent_kafka.Consumer", refuse("opens a Kafka consumer"))


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    """The broker at KAFKA_BOOTSTRAP_SERVERS when it answers (make test starts one), else a
    broker of the suite's own on free ports, stopped at the end."""
    broker = broker_module()
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    port = int(configured.split(",")[0].rsplit(":", 1)[1])
    if broker._answers(port):
        yield f"127.0.0.1:{port}"
        return
    port = free_port(span=2)
    own = broker.Broker(tmp_path_factory.mktemp("kafka"), port, port + 1)
    own.up()
    try:
        yield own.bootstrap
    finally:
        own.down()


@contextmanager
def pipeline_env(root: Path, bootstrap: str, prefix: str, topic: str | None = None):
    """Environment of an independent pipeline instance (own LAKEHOUSE_ROOT and, unless `topic`
    is given, own topic) for a module-scoped scenario; restores the environment afterwards.
    Yields its Settings."""
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings

    env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "EVENTS_TOPIC": topic or f"{prefix}-{uuid.uuid4().hex[:8]}",
        "LAKEHOUSE_ROOT": str(root / "lakehouse"),
    }
    with overridden(env):
        yield Settings.from_env()



@pytest.fixture(scope="session")
def pg_lock_url():
    """A throwaway PostgreSQL server (infra/postgres/pg.py, the cluster stack's) for the writer
    locks of object-store roots; its URL."""
    import shutil
    import subprocess
    import sys
    import tempfile

    state = tempfile.mkdtemp(prefix="lakehouse-pg-test-", dir="/tmp")
    port, password = free_port(), f"pw-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DAGSTER_PG_PASSWORD": password, "DAGSTER_PG_DB": "locks"}
    cli = [sys.executable, str(REPO / "infra/postgres/pg.py")]
    args = ["--state-dir", state, "--port", str(port)]
    subprocess.run([*cli, "up", *args], env=env, check=True, capture_output=True, timeout=300)
    try:
        yield f"postgresql://dagster:{password}@127.0.0.1:{port}/locks"
    finally:
        subprocess.run([*cli, "down", *args], env=env, check=False, capture_output=True,
                       timeout=120)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def schema_registry():
    """A real schema registry (Apicurio, in memory; infra/registry/registry.py, the script
    behind `make registry-up`) on a free port; its Confluent-compatible API's base URL."""
    import shutil
    import subprocess
    import sys
    import tempfile

    state = tempfile.mkdtemp(prefix="lakehouse-registry-test-", dir="/tmp")
    cli = [sys.executable, str(REPO / "infra/registry/registry.py")]
    args = ["--state-dir", state, "--port", str(free_port())]
    up = subprocess.run([*cli, "up", *args], capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        pytest.fail(f"the schema registry did not start: {up.stderr.strip() or up.stdout}")
    url = up.stdout.split(" on ", 1)[1].split()[0]
    REGISTRY_PID_FILES[url] = Path(state) / "registry.pid"
    try:
        yield url
    finally:
        subprocess.run([*cli, "down", *args], check=False, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


REGISTRY_PID_FILES: dict[str, Path] = {}  # the `schema_registry` fixture's server, by URL


@contextmanager
def registry_hung(url: str) -> Iterator[None]:
    """The registry at `url` (the `schema_registry` fixture's) hung within the block: SIGSTOPped,
    so requests to it time out, and its schemas (in memory) are still there after SIGCONT."""
    import signal

    pid = int(REGISTRY_PID_FILES[url].read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture()
def instance_env(tmp_path, kafka_bootstrap, monkeypatch):
    """An independent pipeline instance: its own LAKEHOUSE_ROOT and topic."""
    topic = f"test-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("EVENTS_TOPIC", topic)
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    from lakehouse.config.settings import Settings

    return Settings.from_env()


# A worker's driver runs the suite's in-process runs for its whole ~18 minutes: throughput work
# whose GC pauses nobody waits on. The parallel collector cost ~10% less CPU and wall than G1
# there (catch-ups and reconciles in one process, two A/B rounds, 2026-11-28: docs/testing.md).
# It keeps C2. Its JIT compilers took 486 of its JVMs' 1,192 CPU seconds over a whole `make
# test` (2026-12-07, sampled per thread), but with C1 only the slower code ate what they saved:
# pytest ran 973 s and 1,045 s against 1,066 s and 1,043 s with C2, within the run-to-run spread
# (bench/results/suite-test-2026-12-07T201412.json and T212512.json against T194236.json and
# T203215.json).
WORKER_JAVA_OPTIONS = "-XX:+UseParallelGC"


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from lakehouse.config.settings import Settings
    from spark_jobs.session import get_spark

    root = tmp_path_factory.mktemp("spark")
    session = get_spark(Settings.from_env({
        "LAKEHOUSE_ROOT": str(root),
        DRIVER_JAVA_OPTIONS: WORKER_JAVA_OPTIONS}))
    yield session
    session.stop()



def publish_instance(settings, cfg, chunks: int, instance):
    """Produce `cfg`'s records in `chunks` arrival-ordered chunks with a stream catch-up after
    each, then reconcile every event date. Returns (records, dates)."""
    from testkit.generator import generate, produce

    records = generate(cfg).records
    step = -(-len(records) // chunks)
    for i in range(chunks):
        produce(settings, records[i * step:(i + 1) * step])
        result, _ = run_job("stream_catch_up", instance)
        assert result.success, f"catch-up {i} failed"
    from lakehouse.tables.reads import bronze_dates

    dates = sorted(bronze_dates(settings))
    for d in dates:
        result, checks = run_job("reconcile_dates", instance, partition_key=d.isoformat())
        assert result.success and all(c.passed for c in checks), f"reconcile {d} failed"
    return records, dates


@pytest.fixture(scope="session")
def scenario(tmp_path_factory, kafka_bootstrap, spark):
    """The end-to-end scenario, run once: two dates, late events (hours late, across midnight),
    duplicates, malformed records, two chunks with a catch-up each, the first date published
    mid-way. Yields (settings, expected, dates, outcomes, chunks)."""
    with pipeline_env(tmp_path_factory.mktemp("e2e"), kafka_bootstrap, "e2e") as settings:
        from dagster import DagsterInstance
        from reference import Expected

        from testkit.generator import GeneratorConfig, end_across_midnight, generate, produce

        # Spans a midnight at any hour (tests/unit/test_generator.py pins the clock near midnight).
        end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
        cfg = GeneratorConfig(count=4000, seed=11, end=end, span=timedelta(hours=6), keys=8,
                              late_fraction=0.05, duplicate_fraction=0.04,
                              malformed_fraction=0.02)
        records = generate(cfg).records
        # Two chunks, a catch-up each: the first date is published after the first and
        # corrected by the second (its late events and late copies).
        cut = 2 * len(records) // 3
        chunks = [records[:cut], records[cut:]]
        expected = Expected.of(chunks)
        dates = sorted({r.time.date() for r in expected.rows})
        instance = DagsterInstance.ephemeral()
        outcomes = {"catch_ups": [], "instance": instance}
        for i, chunk in enumerate(chunks):
            produce(settings, chunk)
            result, _ = run_job("stream_catch_up", instance)
            assert result.success, f"catch-up {i} failed"
            materializations = [e.event_specific_data.materialization
                                for e in result.get_asset_materialization_events()]
            outcomes["catch_ups"].append({
                m.asset_key.to_user_string(): {k: v.value for k, v in m.metadata.items()}
                for m in materializations})
            if i == 0:  # publish the first date before the last chunk: it gets corrected
                result, checks = run_job("reconcile_dates", instance,
                                         partition_key=dates[0].isoformat())
                outcomes["mid"] = (result.success, {c.check_name: c for c in checks})
        for d in dates:
            result, checks = run_job("reconcile_dates", instance, partition_key=d.isoformat())
            outcomes[d] = (result.success, {c.check_name: c for c in checks})
            outcomes["replay", d] = next(
                {k: v.value for k, v in m.metadata.items()}
                for m in result.asset_materializations_for_node("replay_aggregates"))
        yield settings, expected, dates, outcomes, chunks


@contextmanager
def observe_stack(state: Path, stream_ports: list[int], rules_dir: Path | None = None,
                  webhook: str | None = None, interval: str = "1s", daily_port: int | None = None):
    """Prometheus and Alertmanager (the Debian binaries, started by infra/prometheus/observe.py,
    the script behind `make observe-up`) on free ports in `state`, scraping `stream_ports`
    every `interval` (and a daily exporter's `daily_port`), alerts posted to `webhook`; yields the
    `Stack`. Stopped at the end."""
    from lakehouse.config.env import overridden
    from testkit.infra import infra_module

    observe = infra_module("prometheus/observe.py")
    env = {"PROMETHEUS_PORT": str(free_port()), "ALERTMANAGER_PORT": str(free_port()),
           "STREAM_METRICS_PORTS": ",".join(map(str, stream_ports)),
           "OBSERVE_SCRAPE_INTERVAL": interval, "ALERT_WEBHOOK_URL": webhook or "",
           "ALERT_GROUP_WAIT": "1s", "DAILY_METRICS_PORT": str(daily_port or free_port())}
    with overridden(env):
        stack = observe.Stack(state, rules_dir or observe.RULES, exporter=False)
        stack.scrape_daily = daily_port is not None
        try:
            stack.up()
        except observe.ServerError as exc:
            pytest.fail(f"the monitoring stack did not start: {exc}")
        try:
            yield stack
        finally:
            stack.down()


class LocalConnect(NamedTuple):
    """The test session's Spark Connect server: its URL as a user gives it (no token), its
    server.log, its state folder (its pid and token files) and its port; `env`: what a run's
    environment sets to use it (SPARK_REMOTE, and the state folder its clients read the
    server's token from)."""

    url: str
    log: Path
    state: Path
    port: int

    @property
    def env(self) -> dict[str, str]:
        return {"SPARK_REMOTE": self.url, "SPARK_CONNECT_STATE_DIR": str(self.state)}


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory):
    """One Spark Connect server for the test session (infra/spark/connect.py, the script behind
    `make spark-up`) on a free port with its own state dir: a `LocalConnect`. Runs use it with
    its `env` set in their own process (a process holding a Connect session starts no classic
    one, so never in a test worker's). Stopped at the end."""
    import subprocess
    import sys

    state = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    cli = [sys.executable, str(REPO / "infra/spark/connect.py")]
    args = ["--state-dir", str(state), "--port", str(port)]
    up = subprocess.run([*cli, "up", *args], capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        pytest.fail(f"the Spark Connect server did not start: {up.stderr.strip() or up.stdout}")
    try:
        yield LocalConnect(up.stdout.split(" on ", 1)[1].split()[0], state / "server.log", state,
                           port)
    finally:
        subprocess.run([*cli, "down", *args], check=False, capture_output=True, timeout=120)
