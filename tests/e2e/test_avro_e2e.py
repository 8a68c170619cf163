"""The Avro orders pipeline (examples/orders_avro.yaml: Confluent wire format, two schema
versions) end to end on a real broker: generated records of both versions, with unknown schema
ids and undecodable bytes among them, ingested by its prefixed Dagster jobs' catch-up in batches
of 300 (MAX_OFFSETS_PER_TRIGGER), then every date reconciled. Gold == replay == the independent
reference (fastavro's decoding, plain Python counting) for every date, with the blocking proof
passing; every offset once, in bronze or in the quarantine under its reason with its bytes; the
live aggregates exact (every event once, except exactly the copies the late lane recorded).
(A service killed inside a batch and recovered: tests/e2e/test_service.py for the default
pipeline, tests/e2e/test_service_pipelines.py for spec pipelines; the decoding is the same.)"""

import base64
import shutil
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lakehouse.tables.reads import bronze_dates, read
from testkit.runs import run_in

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def avro_orders(tmp_path_factory, kafka_bootstrap):
    from dagster import DagsterInstance

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.specs.pipeline import load_spec
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, produce
    from testkit.spec_events import generate_for_spec

    tmp = tmp_path_factory.mktemp("avro")
    for name in ("orders_v1.avsc", "orders_v2.avsc"):
        shutil.copy(EXAMPLES / name, tmp / name)
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    path = tmp / "orders_avro.yaml"
    path.write_text(yaml.safe_dump({**data, "topic": f"orders-avro-{uuid.uuid4().hex[:8]}"}))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp / "lake"),
           "PIPELINES": str(path), "MAX_OFFSETS_PER_TRIGGER": "300"}
    with overridden(env):
        defs = definitions_for(spec_pipelines(), LakehouseResource())
        spec, instance = load_spec(path), DagsterInstance.ephemeral()
        settings = defs.resources["lakehouse"].settings_for("orders_avro")
        end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        records = generate_for_spec(spec, GeneratorConfig(
            count=800, seed=41, end=end, span=timedelta(hours=4), late_fraction=0.06,
            duplicate_fraction=0.04, malformed_fraction=0.05)).records
        proofs = {}
        produce(settings, records)
        result = run_in(defs, "orders_avro__stream_catch_up", instance)[0]
        assert result.success
        batches = next(e.event_specific_data.materialization.metadata["batches"].value
                       for e in result.get_asset_materialization_events()
                       if e.event_specific_data.materialization.asset_key.path[-1]
                       == "bronze_events")
        for d in sorted(bronze_dates(settings)):
            result, checks = run_in(defs, "orders_avro__reconcile_dates", instance,
                                 partition_key=d.isoformat())
            proofs[d] = (result.success, {c.check_name: c.passed for c in checks})
        yield SimpleNamespace(spec=spec, settings=settings, records=records, proofs=proofs,
                              batches=batches)


@pytest.mark.slow  # the module's fixture: over a minute alone
def test_every_date_is_proven_and_equals_the_reference(avro_orders):
    from testkit.spec_events import (
        expected_windows_for_spec,
        rows_for_spec,
        table_windows_for_spec,
    )

    spec, settings, records = avro_orders.spec, avro_orders.settings, avro_orders.records
    assert avro_orders.proofs
    for d, (ok, checks) in avro_orders.proofs.items():
        assert ok and checks.get("reconciled_equals_replay") is True, (d, checks)
        assert all(checks.values()), (d, checks)
    expected = expected_windows_for_spec(spec, records)
    gold = table_windows_for_spec(spec, read(settings, "reconciled_aggregates"))
    assert gold == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected
    # Version 1's orders (no currency) are counted under the reader schema's default.
    assert {k[2] for k in gold} >= {"EUR", "USD"}
    bronze = read(settings, "bronze_events")
    assert bronze.num_rows == len(rows_for_spec(spec, records))  # every valid record, once


@pytest.mark.slow  # the module's fixture: over a minute alone
def test_the_quarantine_holds_each_malformed_record_under_its_reason(avro_orders):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import malformed_kinds

    bad = [r for r in avro_orders.records if r.kind not in VALID_KINDS]
    quarantine = read(avro_orders.settings, "quarantined_events").to_pylist()
    assert Counter(q["reason"] for q in quarantine) == Counter(r.kind for r in bad)
    assert set(malformed_kinds(avro_orders.spec)) <= {r.kind for r in bad}
    assert {"unknown_schema_id", "invalid_avro"} <= {q["reason"] for q in quarantine}
    assert Counter(base64.b64decode(q["raw_value"]) for q in quarantine) == Counter(
        r.value for r in bad)
    assert all(q["detail"] for q in quarantine if q["reason"] in ("unknown_schema_id",
                                                                 "invalid_avro"))


@pytest.mark.slow  # the module's fixture: over a minute alone
def test_every_offset_lands_once_and_the_live_aggregates_are_exact(avro_orders):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import rows_for_spec, table_windows_for_spec, windows_of_rows

    spec, settings, records = avro_orders.spec, avro_orders.settings, avro_orders.records
    valid = sum(1 for r in records if r.kind in VALID_KINDS)
    assert avro_orders.batches >= 2 and valid > 300  # several batches of at most 300 records
    positions: Counter = Counter()
    for table in ("bronze_events", "quarantined_events"):
        t = read(settings, table)
        positions.update(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
    assert max(positions.values()) == 1
    assert sum(positions.values()) == len(records)
    for p in {p for p, _ in positions}:  # dense offsets: with the count, each one once
        offsets = {o for pp, o in positions if pp == p}
        assert offsets == set(range(len(offsets))), p
    late_ids = Counter(read(settings, "late_events")["event_id"].to_pylist())
    assert late_ids
    kept = []
    for r in reversed(rows_for_spec(spec, records)):  # a late copy arrives after the counted one
        if late_ids[r.event_id]:
            late_ids[r.event_id] -= 1
        else:
            kept.append(r)
    assert not +late_ids
    assert table_windows_for_spec(spec, read(settings, "streaming_aggregates")) == (
        windows_of_rows(spec, list(reversed(kept))))
