"""`make test-cluster`: an incompatible edit of the order spec mid-stream, through Dagster, on the
scale-out stack (LAKEHOUSE_ROOT on S3Proxy through s3a://, the writer and registry locks in
PostgreSQL, Spark standalone, three brokers, the Dagster instance on PostgreSQL). The new
generation is built apart under `_generations/<version>` from the Kafka log, the switch is one
commit of the generations registry (nothing is renamed: an object store has none), the old
generation stays readable (delta-rs, no Spark) and proven until `retire_generation` deletes it,
and every date is proven afterwards, the stream and the daily runs writing the switched-in
generation."""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.config import storage
from lakehouse.tables.reads import bronze_dates, compare_tables

REPO = Path(__file__).resolve().parents[2]
V1 = yaml.safe_load((REPO / "examples/orders.yaml").read_text())
# A measure of a field bronze never kept: a rebuild from the log.
V2 = {**V1, "fields": {**V1["fields"], "quantity": "decimal(10,0)"},
      "measures": [*V1["measures"], {"field": "quantity", "aggregates": ["sum", "max"]}]}


@pytest.fixture(autouse=True)
def cluster_cores_freed():
    """The test's runs share this process's SparkSession on the standalone cluster: stopped after
    it, so the next application (test_cluster_service's service) gets the cluster's cores."""
    yield
    from testkit.runs import stop_local_spark

    stop_local_spark()


def test_an_incompatible_spec_edit_mid_stream_switches_by_reference(tmp_path):
    env = dict(os.environ)
    if not (env.get("LAKEHOUSE_ROOT", "").startswith("s3a://")
            and env.get("SPARK_MASTER", "").startswith("spark://")
            and env.get("LAKEHOUSE_LOCK_URL") and env.get("DAGSTER_INSTANCE") == "postgres"):
        pytest.fail("run this module through `make test-cluster`")
    from dagster import DagsterInstance
    from test_spec_generations_e2e import proven

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.specs.pipeline import load_spec
    from lakehouse.tables.generations import current_root, records
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, produce
    from testkit.runs import run_in, step_failures
    from testkit.spec_events import (
        generate_for_spec,
    )

    run = uuid.uuid4().hex[:8]
    root = env["LAKEHOUSE_ROOT"].rstrip("/").rsplit("/run-", 1)[0]
    path = tmp_path / "orders.yaml"
    topic = f"gen-orders-{run}"
    env = {"LAKEHOUSE_ROOT": f"{root}/generations-{run}", "EVENTS_TOPIC": f"gen-default-{run}",
           "PIPELINES": str(path)}
    times: dict[str, float] = {}

    def edit(spec: dict):
        path.write_text(yaml.safe_dump({**spec, "topic": topic}))
        defs = definitions_for(spec_pipelines(), LakehouseResource())
        return load_spec(path), defs, defs.resources["lakehouse"].settings_for("orders")

    def job(defs, name: str, **kw):
        started = time.monotonic()
        result, checks = run_in(defs, f"orders__{name}", instance, **kw)
        times[name] = times.get(name, 0.0) + time.monotonic() - started
        assert result.success, (name, kw, step_failures(result))
        assert all(c.passed for c in checks), checks
        return result

    with overridden(env):
        instance = DagsterInstance.get()
        path.with_name("v2.yaml").write_text(yaml.safe_dump({**V2, "topic": topic}))
        spec2 = load_spec(path.with_name("v2.yaml"))
        # One date (each date is a run per step on the cluster): what crosses a midnight is
        # the local test's (tests/e2e/test_spec_generations_e2e.py).
        end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        if end.hour < 5:
            end = (end - timedelta(days=1)).replace(hour=23, minute=50)
        recs = generate_for_spec(spec2, GeneratorConfig(
            count=600, seed=46, end=end, span=timedelta(hours=4), late_fraction=0.05,
            duplicate_fraction=0.04, malformed_fraction=0.03)).records
        thirds = [recs[: len(recs) // 3], recs[len(recs) // 3: 2 * len(recs) // 3],
                  recs[2 * len(recs) // 3:]]

        # v1: the first third, caught up and reconciled date by date.
        spec1, defs, s1 = edit(V1)
        assert s1.home is None and s1.root.startswith("s3a://")
        produce(s1, thirds[0])
        job(defs, "stream_catch_up")
        for d in sorted(bronze_dates(s1)):
            job(defs, "reconcile_dates", partition_key=d.isoformat())
        proven(spec1, s1, thirds[0])

        # The edit, mid-stream: the new spec's runs write a generation of their own.
        _, defs, s2 = edit(V2)
        building = f"{s1.root}/_generations/{s2.results_version}"
        assert (s2.root, s2.home) == (building, s1.root)
        produce(s2, thirds[1])
        job(defs, "stream_catch_up")  # from the log's start
        dates = sorted(bronze_dates(s2))
        for d in dates:
            job(defs, "reprocess_dates", partition_key=d.isoformat())
        assert current_root(s1.root) == s1.root  # readers: still v1's, proven
        proven(spec1, s1, thirds[0])

        job(defs, "switch_generation")
        now = defs.resources["lakehouse"].settings_for("orders")
        assert (now.root, now.home) == (building, s1.root)
        assert current_root(s1.root) == building
        rows = [(r["spec_version"], r["status"], r["location"]) for r in records(s1)]
        assert rows[-2:] == [(s1.results_version, "retired", "."),
                             (s2.results_version, "active", f"_generations/{s2.results_version}")]
        proven(spec2, now, thirds[0] + thirds[1])
        proven(spec1, s1, thirds[0])  # the old generation: readable where it was, as it was

        # After the switch the stream and the daily runs write the new generation.
        produce(now, thirds[2])
        job(defs, "stream_catch_up")
        dates = sorted(bronze_dates(now))
        for d in dates:
            job(defs, "reconcile_dates", partition_key=d.isoformat())
        proven(spec2, now, recs)
        proven(spec1, s1, thirds[0])
        # The replay's cost drivers in its run's metadata: its tasks' CPU on the executors, S3A's
        # requests (the driver's: the executors' file systems count their own).
        from dagster import AssetKey

        replayed = instance.get_latest_materialization_event(
            AssetKey(["orders", "replay_aggregates"])).asset_materialization.metadata
        costs = [r["cost"] for r in replayed["per_date"].value]
        s3a = {k: v for c in costs for k, v in c.get("storage", {}).items() if k.startswith("s3a.")}
        assert costs and all(c["measured_in"] == "driver" and c["kafka_records_fetched"] > 0
                             and c["executors_cpu_s"] > 0 for c in costs), costs
        assert any(v > 0 for k, v in s3a.items() if "request" in k), costs
        requests = sum(v for k, v in s3a.items() if "request" in k)

        # Retired: v1's tables and checkpoint deleted from the object store; v2 untouched.
        job(defs, "retire_generation", run_config={"ops": {"orders__retire_old_generation": {
            "config": {"spec_version": s1.results_version}}}})
        left = storage.list_names(s1.root)
        assert "bronze_events" not in left and "_checkpoints" not in left, left
        assert {"spec_generations", "_generations"} <= set(left), left
        assert records(s1)[-1]["status"] == "deleted"
        assert current_root(s1.root) == building
        proven(spec2, now, recs)
        assert dates and all(compare_tables(now, d) == 0 for d in dates)
    print(f"\ngenerations on the cluster: {len(recs)} records, {len(dates)} dates, "
          + ", ".join(f"{k} {v:.0f}s" for k, v in times.items())
          + f"; the last replay's S3A requests (driver): {requests}")
