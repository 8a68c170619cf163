"""The order pipeline through Dagster, beside the default one in one code location: its prefixed
jobs catch the stream up, correct and prove each date (gold == replay == the independent
reference), and neither pipeline's runs touch the other's tables or checkpoints."""

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey

from assets.resources import LakehouseResource
from lakehouse.tables.reads import bronze_dates, read
from orchestration.definitions import definitions_for
from testkit.runs import run_in

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def orders_spec(folder: Path) -> Path:
    """The order example with a topic of its own (tests share one broker)."""
    import uuid

    spec = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    spec["topic"] = f"orders-{uuid.uuid4().hex[:8]}"
    path = folder / "orders.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def tree(root: Path) -> dict[str, float]:
    """Every file under `root` with its modification time (what a run may have touched)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for p in root.rglob("*") if p.is_file()} if root.exists() else {}


@pytest.fixture(scope="module")
def two_pipelines(tmp_path_factory, kafka_bootstrap):
    """One code location with the default pipeline and the orders one; the orders pipeline run
    through its prefixed jobs (two catch-ups, each followed by the proof of every date, so late
    orders correct published windows). Yields what the tests look at."""
    import uuid
    from types import SimpleNamespace

    from dagster import DagsterInstance

    from assets.pipelines import Pipeline, spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from lakehouse.specs.pipeline import load_spec
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.spec_events import generate_for_spec

    tmp = tmp_path_factory.mktemp("two")
    spec_path = orders_spec(tmp)
    lake = tmp / "lake"
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(lake),
           "EVENTS_TOPIC": f"default-{uuid.uuid4().hex[:8]}", "PIPELINES": str(spec_path)}
    with overridden(env):
        default = Pipeline.of(Settings.from_env())
        # The resource of this environment (the module's was built when the tests started).
        defs = definitions_for([default, *spec_pipelines()], LakehouseResource())
        spec, instance = load_spec(spec_path), DagsterInstance.ephemeral()
        settings = defs.resources["lakehouse"].settings_for("orders")
        end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
        records = generate_for_spec(spec, GeneratorConfig(
            count=1200, seed=9, end=end, span=timedelta(hours=4), late_fraction=0.05,
            duplicate_fraction=0.04, malformed_fraction=0.03)).records
        half, proofs = len(records) // 2, []
        for chunk in (records[:half], records[half:]):
            produce(settings, chunk)
            assert run_in(defs, "orders__stream_catch_up", instance)[0].success
            for d in sorted(bronze_dates(settings)):
                result, checks = run_in(defs, "orders__reconcile_dates", instance,
                                     partition_key=d.isoformat())
                proofs.append((result.success, [(c.check_name, c.passed) for c in checks]))
        yield SimpleNamespace(defs=defs, spec=spec, instance=instance, lake=lake,
                              settings=settings, records=records, proofs=proofs,
                              written=tree(lake))


def dagster_for(settings, spec):
    """The code location of the orders pipeline alone, its resource from this environment."""
    from assets.pipelines import Pipeline
    from assets.resources import LakehouseResource
    from orchestration.definitions import definitions_for

    return definitions_for([Pipeline.of(settings, spec.prefix)], LakehouseResource())


def test_orders_through_dagster_equal_the_reference_and_stay_in_their_folder(two_pipelines):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    t = two_pipelines
    settings, spec, records = t.settings, t.spec, t.records
    assert settings.root == f"{t.lake}/orders"
    # Every run succeeded and both blocking checks passed, for every date, each time.
    assert t.proofs and all(ok and checks and all(p for _, p in checks) for ok, checks in t.proofs)
    assert {name for _, checks in t.proofs for name, _ in checks} == {
        "reconciled_equals_replay", "fast_path_vs_replay"}
    expected = expected_windows_for_spec(spec, records)
    assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected
    assert read(settings, "late_corrections").num_rows > 0
    assert read(settings, "late_events").num_rows > 0
    # Every bad order is quarantined with its field's reason.
    bad = Counter(r.kind for r in records if r.kind not in VALID_KINDS)
    assert Counter(read(settings, "quarantined_events")["reason"].to_pylist()) == bad
    assert {"missing_region", "amount_too_precise", "invalid_amount"} <= set(bad)
    # Only the orders folder was written: no default table, checkpoint or report appeared.
    assert all(p.startswith("orders/") for p in t.written), sorted(t.written)[:5]
    assert {p.split("/")[1] for p in t.written} >= {"bronze_events", "_checkpoints",
                                                   "reconciled_aggregates"}


def test_the_default_pipeline_never_touches_the_orders_folder(two_pipelines):
    from testkit.generator import GeneratorConfig, generate, produce

    t = two_pipelines
    default = t.defs.resources["lakehouse"].settings
    produce(default, generate(GeneratorConfig(count=200, seed=3, span=timedelta(hours=1)))
            .records)
    orders_before = tree(t.lake / "orders")
    assert orders_before  # the orders pipeline's tables are there (the fixture ran it)
    result, _ = run_in(t.defs, "stream_catch_up", t.instance)
    assert result.success
    assert read(default, "bronze_events").num_rows > 0
    assert tree(t.lake / "orders") == orders_before


def positions(table) -> Counter:
    return Counter(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))


# Two to five minutes beside the other tests (make test-long): the Avro pipeline's service crash
# (tests/e2e/test_avro_e2e.py) and the default's (tests/e2e/test_service.py) stay in `make test`.
@pytest.mark.long
def test_orders_service_crashes_lose_and_duplicate_nothing(tmp_path, kafka_bootstrap):
    """`make stream PIPELINE=<orders spec>` killed in flight and inside a batch (after bronze,
    before the aggregates MERGE), restarted each time: every offset lands once, the late lane
    once, and the orders proven per date equal the replay and the reference."""
    import os
    import signal

    from dagster import DagsterInstance

    from lakehouse.config.env import overridden
    from lakehouse.specs.pipeline import selected_pipeline
    from spark_jobs.stream import INGEST_QUERY
    from testkit.faults import kill_in_flight, kill_inside_batch, next_batch, running_service, start_service, wait_for
    from testkit.generator import GeneratorConfig, produce
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, generate_for_spec, table_windows_for_spec

    spec_path = orders_spec(tmp_path)
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "PIPELINE": str(spec_path), "PIPELINES": str(spec_path)}
    with overridden(env):
        spec, settings = selected_pipeline()
    service_env = {**os.environ, **env, "STREAM_TRIGGER_INTERVAL": "2 seconds",
                   "MAX_OFFSETS_PER_TRIGGER": "400"}
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate_for_spec(spec, GeneratorConfig(
        count=1800, seed=21, end=end, span=timedelta(hours=3), late_fraction=0.05)).records
    chunks = [records[:600], records[600:1200], records[1200:]]
    valid = sum(1 for r in records if r.kind in VALID_KINDS)
    checkpoint = settings.checkpoint_path(INGEST_QUERY)

    def bronze_rows() -> int:
        try:
            return read(settings, "bronze_events").num_rows
        except Exception:  # noqa: BLE001 - not created yet
            return 0

    produce(settings, chunks[0])
    with running_service(service_env) as svc:
        wait_for(lambda: bronze_rows() > 0, svc, what="first bronze batch")
        produce(settings, chunks[1])
        kill_in_flight(svc, checkpoint, min_batch=1)  # offsets/N written, commits/N not
    with running_service(service_env) as svc:
        wait_for(lambda: bronze_rows() > 600, svc, what="progress after restart")
        produce(settings, chunks[2])
        kill_inside_batch(svc, settings, "bronze_before_aggregates", next_batch(checkpoint))
    svc = start_service({**service_env, "MAX_OFFSETS_PER_TRIGGER": "10000"})
    wait_for(lambda: bronze_rows() >= valid, svc, what="all records in bronze")
    svc.send_signal(signal.SIGTERM)
    out, _ = svc.communicate(timeout=120)
    assert svc.returncode == 0 and "stopped cleanly" in out, out[-3000:]

    with overridden(env):
        defs, instance = dagster_for(settings, spec), DagsterInstance.ephemeral()
        assert run_in(defs, "orders__stream_catch_up", instance)[0].success
        for d in sorted(bronze_dates(settings)):
            result, checks = run_in(defs, "orders__reconcile_dates", instance,
                                 partition_key=d.isoformat())
            assert result.success and checks and all(c.passed for c in checks), checks

    bronze, quarantine = read(settings, "bronze_events"), read(settings, "quarantined_events")
    landed = positions(bronze) + positions(quarantine)
    assert max(landed.values()) == 1 and bronze.num_rows == valid  # nothing twice
    for p in {p for p, _ in landed}:  # nothing lost: dense offsets per partition
        assert {o for pp, o in landed if pp == p} == set(range(sum(1 for pp, _ in landed
                                                                    if pp == p))), p
    late = read(settings, "late_events")
    assert late.num_rows > 0 and max(positions(late).values()) == 1
    # The late lane is exactly what the fast path left out: the stream's aggregates equal the
    # reference of every record but the late copies (a late copy arrives after the one counted).
    late_ids, kept = Counter(late["event_id"].to_pylist()), []
    for r in reversed(records):
        event_id = str(json.loads(r.value)[spec.shape.event_id]) if r.kind in VALID_KINDS else None
        if late_ids[event_id]:
            late_ids[event_id] -= 1
        else:
            kept.append(r)
    assert not +late_ids
    assert table_windows_for_spec(spec, read(settings, "streaming_aggregates")) == \
        expected_windows_for_spec(spec, list(reversed(kept)))
    expected = expected_windows_for_spec(spec, records)
    assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected


def test_a_spec_change_leaves_the_dates_computed_before_stale(two_pipelines, tmp_path):
    """The spec version is the assets' code version: with the spec the dates were computed under,
    Dagster finds them fresh; after a change of what they hold (a new measure aggregate), stale,
    the cause a changed code version; a change of no result (another topic) keeps them fresh."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    from assets.pipelines import Pipeline
    from lakehouse.specs.pipeline import load_spec

    t = two_pipelines
    gold = AssetKey(["orders", "reconciled_aggregates"])

    def status(spec_data: dict) -> list:
        path = tmp_path / f"orders-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(spec_data))
        spec = load_spec(path)
        settings = spec.settings(t.defs.resources["lakehouse"].settings, {})
        defs = definitions_for([Pipeline.of(settings, spec.prefix)], LakehouseResource())
        resolver = CachingStaleStatusResolver(t.instance, defs.get_repository_def().asset_graph,
                                              LoadingContextForTest(t.instance))
        return [(resolver.get_status(gold, d.isoformat()),
                 [c.category.name for c in resolver.get_stale_causes(gold, d.isoformat())])
                for d in sorted(bronze_dates(t.settings))]

    spec = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    spec["topic"] = t.settings.events_topic
    assert {s for s, _ in status(spec)} == {StaleStatus.FRESH}
    assert {s for s, _ in status({**spec, "topic": "orders-elsewhere"})} == {StaleStatus.FRESH}
    changed = {**spec, "measures": [{"field": "amount", "aggregates": ["sum", "max"]}]}
    after = status(changed)
    assert after and all(s == StaleStatus.STALE and "CODE" in c for s, c in after), after
