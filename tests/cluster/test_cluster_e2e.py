"""`make test-cluster`: the end-to-end scenario on the scale-out stack, every part a real server
on loopback: LAKEHOUSE_ROOT on S3Proxy through s3a://, a Spark standalone master with two
workers, the Dagster instance (runs, events, schedules, the daemon) on PostgreSQL, and three
Kafka brokers (replication 3, min.insync.replicas 2). One broker is stopped during a catch-up
and restarted; a Spark worker is SIGKILLed while an ingest batch is in flight. Then the daemon
runs the daily jobs from its queue (schedules and sensors stopped, so only those) over a Spark
Connect server attached to the cluster. Nothing may be lost or counted twice, and gold must
equal the replay and an independent count.

The stack is brought up and torn down by `make test-cluster` (infra/cluster.env); outside it
this module fails at once, naming what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import REPO, free_port, run_job
from reference import Expected

from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin, topic_offsets
from lakehouse.tables.reads import compare_tables, read
from testkit.generator import GeneratorConfig, generate, produce
from testkit.results import write_result
from testkit.runs import stop_local_spark

RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def stack():
    """The cluster stack's settings for a fresh root and topic of this run."""
    env = os.environ
    missing = [what for what, ok in (
        ("LAKEHOUSE_ROOT=s3a://...", env.get("LAKEHOUSE_ROOT", "").startswith("s3a://")),
        ("SPARK_MASTER=spark://...", env.get("SPARK_MASTER", "").startswith("spark://")),
        ("three KAFKA_BOOTSTRAP_SERVERS", len(env.get("KAFKA_BOOTSTRAP_SERVERS", "").split(",")) == 3),
        ("DAGSTER_INSTANCE=postgres", env.get("DAGSTER_INSTANCE") == "postgres"),
    ) if not ok]
    if missing:
        pytest.fail(f"run this module through `make test-cluster` (missing: {missing})")
    run = uuid.uuid4().hex[:8]
    os.environ["LAKEHOUSE_ROOT"] = f"{env['LAKEHOUSE_ROOT'].rstrip('/')}/run-{run}"
    os.environ["EVENTS_TOPIC"] = f"cluster-{run}"
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    instance = DagsterInstance.get()
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    # Runs an interrupted earlier session left queued or "running" would start on this root.
    for run in instance.get_runs(RunsFilter(statuses=[
            DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
            DagsterRunStatus.STARTED])):
        instance.delete_run(run.run_id)
    yield Settings.from_env(), instance


def in_flight(settings: Settings, query: str) -> int | None:
    """A batch whose write-ahead offsets file is in the checkpoint (on S3) without its commit."""
    base = settings.checkpoint_path(query)
    started = {int(n) for n in storage.list_names(f"{base}/offsets") if n.isdigit()}
    done = {int(n) for n in storage.list_names(f"{base}/commits") if n.isdigit()}
    return max(started - done) if started - done else None


def spark_jobs_running() -> bool:
    """Whether this process's Spark session (the in-process Dagster run's) has jobs running."""
    from pyspark.sql import SparkSession

    session = SparkSession._instantiatedSession
    return session is not None and bool(session.sparkContext.statusTracker().getActiveJobsIds())


def infra(script: str, *args: str) -> str:
    """Drive a server of the stack through its own script, as an operator would."""
    done = subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def worker_running_executor() -> int:
    """The worker (1-based, by its web UI port: master's + N) using cores for an app now."""
    webui = int(os.environ.get("SPARK_MASTER_WEBUI_PORT", 8080))
    with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=5) as response:
        state = json.load(response)
    for worker in state.get("workers", []):
        if worker.get("state") == "ALIVE" and worker.get("coresused", 0) > 0:
            return int(worker["webuiaddress"].rsplit(":", 1)[1]) - webui
    raise AssertionError(f"no worker runs an executor: {json.dumps(state)[:2000]}")


def launch(instance, job: str, partition: str, env) -> str:
    """Submit a run to the instance's queue the way an operator does (the daemon launches it);
    returns its run id."""
    before = {r.run_id for r in instance.get_runs(limit=50)}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "job", "launch", "-w", "workspace.yaml",
         "-j", job, "--tags", json.dumps({"dagster/partition": partition})],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    new = [r for r in instance.get_runs(limit=50) if r.run_id not in before
           and r.job_name == job and r.tags.get("dagster/partition") == partition]
    assert len(new) == 1, [(r.job_name, r.tags) for r in new]
    return new[0].run_id


def stop_automation(instance) -> list[str]:
    """Stop every schedule and sensor in the instance (they default to running), so the daemon
    launches only the runs this test queues: on two cores each automatic run (a Spark app of
    its own) would queue ahead of ours. Stopped states live in Postgres like any operator's.
    One workspace load for all of them (what `dagster schedule stop` does once per name)."""
    from dagster import __version__
    from dagster._cli.workspace.cli_target import get_repository_from_cli_opts
    from dagster_shared.cli import WorkspaceOpts

    opts = WorkspaceOpts(workspace=[str(REPO / "workspace.yaml")])
    with get_repository_from_cli_opts(instance, __version__, opts, None) as repo:
        for schedule in repo.get_schedules():
            instance.stop_schedule(schedule.get_remote_origin_id(), schedule.selector_id,
                                   schedule)
        for sensor in repo.get_sensors():
            instance.stop_sensor(sensor.get_remote_origin_id(), sensor.selector_id, sensor)
        names = [i.name for i in (*repo.get_schedules(), *repo.get_sensors())]
    assert names, "no schedules or sensors found in the workspace"
    return sorted(names)


def restore_automation(instance, names: list[str]) -> None:
    """Forget the stopped states `stop_automation` stored: back to their default (running)."""
    from dagster._core.scheduler.instigation import InstigatorStatus

    for state in instance.all_instigator_state():
        if state.instigator_name in names and state.status == InstigatorStatus.STOPPED:
            instance.delete_instigator_state(state.instigator_origin_id, state.selector_id)


def wait_for_writers(instance, ours: set[str], since: float, timeout_s: float = RUN_TIMEOUT_S):
    """Wait until our runs have finished and no run that writes the tables (job tag
    `lakehouse/writes`: ours, and what the daemon's schedules and sensors started meanwhile)
    is queued or running. Returns the writing runs created after `since`."""
    from dagster import DagsterRunStatus, RunsFilter

    unfinished = {DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED,
                  DagsterRunStatus.STARTING, DagsterRunStatus.STARTED}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [r for r in instance.get_runs(RunsFilter(
            created_after=datetime.fromtimestamp(since, UTC))) if "lakehouse/writes" in r.tags]
        mine = [r for r in runs if r.run_id in ours]
        if len(mine) == len(ours) and not any(r.status in unfinished for r in runs):
            return runs
        time.sleep(3)
    raise AssertionError(f"runs still going after {timeout_s}s: "
                         f"{[(r.job_name, r.status) for r in runs]}")


def check_results(instance, run) -> dict[str, bool]:
    from dagster import DagsterEventType

    records = instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    return {r.dagster_event.event_specific_data.check_name: r.dagster_event.event_specific_data.passed
            for r in records}


def test_the_pipeline_on_object_storage_a_spark_cluster_postgres_and_three_brokers(stack, tmp_path):
    settings, instance = stack
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    cfg = GeneratorConfig(count=6000, seed=31, end=now - timedelta(minutes=10),
                          span=timedelta(hours=30), keys=8, late_fraction=0.03,
                          duplicate_fraction=0.03, malformed_fraction=0.02)
    records = generate(cfg).records
    third = len(records) // 3
    chunks = [records[:third], records[third:2 * third], records[2 * third:]]
    expected = Expected.of(chunks)
    dates = sorted({r.time.date() for r in expected.rows})
    figures = {"events": len(records), "dates": [d.isoformat() for d in dates]}
    t0 = time.monotonic()

    # Chunk 1: a plain catch-up (Dagster in this process; its runs recorded in Postgres).
    produce(settings, chunks[0])
    description = admin(settings).list_topics(settings.events_topic, timeout=30).topics
    partitions = description[settings.events_topic].partitions.values()
    assert all(len(p.replicas) == 3 for p in partitions)  # replicated on the three brokers
    result, _ = run_job("stream_catch_up", instance)
    assert result.success

    # Chunk 2: one broker stopped while producing and catching up, then restarted.
    infra("infra/kafka/broker.py", "stop-node", "2")
    try:
        produce(settings, chunks[1])  # acks=all: two in-sync replicas suffice
        result, _ = run_job("stream_catch_up", instance)
        assert result.success
    finally:
        infra("infra/kafka/broker.py", "start-node", "2")
    figures["broker_stopped"] = "node 2 during chunk 2 (produce and catch-up)"

    # Chunk 3: a Spark worker killed while an ingest batch is in flight.
    produce(settings, chunks[2])
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(r=run_job("stream_catch_up", instance)))
    runner.start()
    killed = None
    deadline = time.monotonic() + 600
    while runner.is_alive() and time.monotonic() < deadline:
        batch = in_flight(settings, "ingest")
        # The batch's write-ahead file on S3, with Spark jobs running on the executors (the
        # listing alone can miss a short batch, so the running jobs decide).
        if batch is not None and batch >= 2 or spark_jobs_running():
            killed = worker_running_executor()
            infra("infra/spark/cluster.py", "kill-worker", str(killed))
            figures["worker_killed"] = f"worker {killed} during the chunk-3 catch-up (batch {batch})"
            break
        time.sleep(0.2)
    runner.join(RUN_TIMEOUT_S)
    assert killed is not None, "never saw the ingest batch in flight"
    infra("infra/spark/cluster.py", "start-worker", str(killed))
    assert outcome["r"][0].success  # the lost executor's tasks ran again elsewhere
    stop_local_spark()  # the daemon's runs need the cluster's cores

    # The daily jobs through the daemon: queued, launched in their own processes, with pools,
    # over a Spark Connect server attached to the cluster (SPARK_REMOTE in the daemon's
    # environment, which its runs inherit): the runs start no JVM of their own.
    figures["automation_stopped"] = stop_automation(instance)
    server = ["--state-dir", str(tmp_path / "spark-connect"), "--port", str(free_port())]
    # Its runs read the server's token from its state folder.
    server_log = tmp_path / "spark-connect" / "server.log"
    daemon = None
    try:
        remote = infra("infra/spark/connect.py", "up", *server).split(" on ", 1)[1].split()[0]
        daemon_env = {**os.environ, "SPARK_REMOTE": remote,
                      "SPARK_CONNECT_STATE_DIR": str(tmp_path / "spark-connect")}
        since = time.time()
        daemon = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=REPO, env=daemon_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ours = {launch(instance, "reconcile_dates", d.isoformat(), daemon_env) for d in dates}
        runs = wait_for_writers(instance, ours, since)
        # Each run's operations ran in the server (one log line per operation it executed).
        figures["connect_operations"] = server_log.read_text(errors="replace").count(
            "ExecuteHolder ExecuteKey")
        assert figures["connect_operations"] > 10 * len(ours), figures
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(60)
        restore_automation(instance, figures["automation_stopped"])
        infra("infra/spark/connect.py", "down", *server)
    figures["daily_runs_over"] = remote
    figures["seconds"] = round(time.monotonic() - t0)
    reconciles = [r for r in runs if r.run_id in ours]
    figures["daemon_runs"] = sorted(f"{r.job_name} {r.tags.get('dagster/partition', '')}".strip()
                                    for r in runs)
    assert {r.run_id for r in runs} == ours  # automation stopped: only the queued runs
    for run in runs:
        assert run.status.value == "SUCCESS", (run.job_name, run.run_id, run.status)
    for run in reconciles:
        assert check_results(instance, run)["reconciled_equals_replay"] is True

    # Every produced offset landed once: bronze + quarantine dense and unique per partition.
    latest = {p.partition: p.latest for p in topic_offsets(settings)}
    bronze, quarantine = read(settings, "bronze_events"), read(settings, "quarantined_events")
    seen = Counter(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    seen.update(zip(quarantine["partition"].to_pylist(), quarantine["offset"].to_pylist(),
                    strict=True))
    assert max(seen.values()) == 1 and sum(seen.values()) == len(records)
    for p in {p for p, _ in seen}:
        offsets = sorted(o for pp, o in seen if pp == p)
        assert offsets == list(range(len(offsets))), p
        assert latest[p] == len(offsets)
    # The late lane and quarantine exact; gold equals the replay and the independent count.
    assert Counter(quarantine["reason"].to_pylist()) == expected.malformed
    late = read(settings, "late_events")
    assert Counter(late["event_id"].to_pylist()) == Counter(r.event_id for r in expected.late)
    want = expected.reconciled()
    got = {}
    for d in dates:
        assert compare_tables(settings, d) == 0
        for r in read(settings, "reconciled_aggregates", d).to_pylist():
            got[(r["window_start"].astimezone(UTC).replace(tzinfo=None), r["key"])] = (
                r["event_count"], r["value_sum"], r["value_min"], r["value_max"])
    assert got == want
    figures["reconciled_windows"] = len(got)
    print("cluster run:", json.dumps(figures))
    # A file of its own per run (testkit.results.write_result): the docs cite earlier runs' files.
    write_result("cluster", {"date": datetime.now(UTC).isoformat(timespec="seconds"), **figures})
