"""The order spec changes mid-stream twice, through Dagster (its prefixed jobs in-process, the
webserver's GraphQL for what the UI shows): a new measure of a field bronze never kept, then a new
dimension. After each edit the dates computed before are stale; the new generation is built
apart from the Kafka log while the old one stays readable and proven; the backfill
(`reprocess_dates`) makes the dates fresh, and the switch job names the new generation current
where it was built (nothing moves), where gold == the replay == the independent reference under
the new spec; the old ones stay readable until retired."""

import dataclasses
import os
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import free_port

from lakehouse.tables.reads import bronze_dates, compare_tables, read
from testkit.reference import VALID_KINDS
from testkit.runs import run_in

REPO = Path(__file__).resolve().parents[2]
V1 = yaml.safe_load((REPO / "examples/orders.yaml").read_text())
V2 = {**V1, "fields": {**V1["fields"], "quantity": "decimal(10,0)"},
      "measures": [*V1["measures"], {"field": "quantity", "aggregates": ["sum", "max"]}]}
V3 = {**V2, "fields": {**V2["fields"], "channel": "string"},
      "dimensions": [*V1["dimensions"], "channel"]}
GOLD = ["orders", "reconciled_aggregates"]


def as_read_by(spec, records):
    """Records generated for the last spec, with the kinds `spec` sees: a record spoiled in a
    field `spec` does not read is an event to it."""
    used = {*spec.shape.dimension_names, *spec.shape.measure_fields}
    spoiled = {f"{p}{f}{s}": f for f in V3["fields"]
               for p, s in (("missing_", ""), ("invalid_", ""), ("", "_too_precise"),
                            ("", "_out_of_range"))}
    return [dataclasses.replace(r, kind="event")
            if r.kind not in VALID_KINDS and spoiled.get(r.kind, next(iter(used))) not in used
            else r for r in records]


def proven(spec, settings, recs) -> None:
    """gold == the replay (every date) == the independent reference, read with delta-rs."""
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    assert all(compare_tables(settings, d) == 0 for d in bronze_dates(settings))
    expected = expected_windows_for_spec(spec, as_read_by(spec, recs))
    assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected


def stale(url: str, dates) -> dict[str, str]:
    """Gold's stale status per date, as the UI shows it (GraphQL)."""
    from testkit.webserver import gql

    parts = [d.isoformat() for d in dates]
    node = gql(url, """query($key: AssetKeyInput!, $parts: [String!]!) {
        assetNodeOrError(assetKey: $key) { ... on AssetNode {
          staleStatusByPartition(partitions: $parts) } } }""",
               {"key": {"path": GOLD}, "parts": parts})["assetNodeOrError"]
    return dict(zip(parts, node["staleStatusByPartition"], strict=True))


def reload(url: str) -> None:
    from testkit.webserver import gql

    done = gql(url, """mutation { reloadRepositoryLocation(repositoryLocationName:
        "orchestration.definitions") { __typename ... on PythonError { message } } }""")
    assert done["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", done


@pytest.mark.long
def test_the_order_spec_changes_mid_stream_twice(tmp_path, kafka_bootstrap):
    from dagster import DagsterInstance

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.specs.pipeline import load_spec
    from lakehouse.tables.generations import records as registry
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.spec_events import (
        generate_for_spec,
    )
    from testkit.webserver import webserver

    topic, path = f"orders-{uuid.uuid4().hex[:8]}", tmp_path / "orders.yaml"
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "infra/dagster.yaml", home / "dagster.yaml")
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "EVENTS_TOPIC": f"default-{uuid.uuid4().hex[:8]}", "PIPELINES": str(path),
           "DAGSTER_HOME": str(home)}

    def edit(spec: dict):
        path.write_text(yaml.safe_dump({**spec, "topic": topic}))
        defs = definitions_for(spec_pipelines(), LakehouseResource())
        return load_spec(path), defs, defs.resources["lakehouse"].settings_for("orders")

    def run(defs, job: str, **kw):
        result, checks = run_in(defs, f"orders__{job}", instance, **kw)
        assert result.success, (job, kw)
        assert all(c.passed for c in checks), checks
        return checks

    with overridden(env):
        instance = DagsterInstance.from_config(str(home))
        spec1, defs, s1 = edit(V1)
        path.with_name("v3.yaml").write_text(yaml.safe_dump({**V3, "topic": topic}))
        spec3 = load_spec(path.with_name("v3.yaml"))
        end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
        recs = generate_for_spec(spec3, GeneratorConfig(
            count=900, seed=21, end=end, span=timedelta(hours=4), late_fraction=0.05,
            duplicate_fraction=0.04, malformed_fraction=0.04)).records
        thirds = [recs[: len(recs) // 3], recs[len(recs) // 3: 2 * len(recs) // 3],
                  recs[2 * len(recs) // 3:]]

        # v1: the first third, caught up and reconciled date by date.
        produce(s1, thirds[0])
        run(defs, "stream_catch_up")
        dates = sorted(bronze_dates(s1))
        for d in dates:
            run(defs, "reconcile_dates", partition_key=d.isoformat())
        proven(spec1, s1, thirds[0])

        port = free_port()
        with webserver({**os.environ, **env, "DAGSTER_DISABLE_TELEMETRY": "true"}, port,
                       tmp_path / "webserver.log") as url:
            assert set(stale(url, dates).values()) == {"FRESH"}
            seen, old = thirds[0], (spec1, s1)
            for spec_dict, third in ((V2, thirds[1]), (V3, thirds[2])):
                spec, defs, settings = edit(spec_dict)
                reload(url)
                # The edit needs a rebuild: a generation of its own, apart.
                assert settings.home == s1.root and "_generations" in settings.root
                assert set(stale(url, dates).values()) == {"STALE"}, stale(url, dates)
                produce(settings, third)  # mid-stream
                prior, seen = seen, seen + third
                run(defs, "stream_catch_up")  # the new generation, from the log's start
                dates = sorted(bronze_dates(settings))
                for d in dates:  # the backfill of the stale dates (and the new ones)
                    checks = run(defs, "reprocess_dates", partition_key=d.isoformat())
                    assert {c.check_name for c in checks} >= {"reconciled_equals_replay"}
                assert set(stale(url, dates).values()) == {"FRESH"}
                # Until the switch, the old generation is current, readable and proven.
                proven(*old, prior)
                run(defs, "switch_generation")
                now = defs.resources["lakehouse"].settings_for("orders")
                assert (now.root, now.home) == (settings.root, s1.root)  # where it was built
                proven(spec, now, seen)
                assert set(stale(url, dates).values()) == {"FRESH"}
                old = (spec, now)

    rows = registry(now)
    statuses = [(r["spec_version"], r["status"]) for r in rows]
    v1, v3 = s1.results_version, now.results_version
    assert statuses[-1] == (v3, "active") and (v1, "retired") in statuses
    assert [s for _, s in statuses].count("retired") == 2 and "building" in {s for _, s in statuses}
    proven(spec1, s1, thirds[0])  # retired, where it was
