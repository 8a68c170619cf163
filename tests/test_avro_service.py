"""The Avro orders pipeline as a service (`make stream PIPELINE=examples/orders_avro.yaml`):
SIGKILLed inside its first batch (its quarantine and bronze committed, its aggregates not), then
caught up on the same checkpoint (the killed batch re-run, then the rest), it loses and
duplicates nothing: every offset once, in bronze or the quarantine under its reason, and the
live aggregates exact (every event once, except exactly the copies the late lane recorded),
against the independent reference's reading of the Avro records."""

import os
import shutil
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.settings import Settings
from lakehouse.table_reads import read
from spark_jobs import stream
from specs.pipeline import load_spec
from testkit.faults import kill_inside_batch, running_service
from testkit.generator import GeneratorConfig, produce
from testkit.reference import VALID_KINDS
from testkit.spec_events import (
    generate_for_spec,
    rows_for_spec,
    table_windows_for_spec,
    windows_of_rows,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def rows(settings, table: str) -> int:
    try:
        return read(settings, table).num_rows
    except Exception:
        return 0


@pytest.mark.slow
def test_a_crashed_avro_service_loses_and_duplicates_nothing(instance_env, tmp_path, spark):
    del instance_env  # its environment (broker, fresh root) is os.environ now
    for name in ("orders_v1.avsc", "orders_v2.avsc"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    path = tmp_path / "orders_avro.yaml"
    path.write_text(yaml.safe_dump({**data, "topic": f"orders-avro-{uuid.uuid4().hex[:8]}"}))
    env = {**os.environ, "PIPELINE": str(path), "STREAM_TRIGGER_INTERVAL": "1 second",
           "MAX_OFFSETS_PER_TRIGGER": "300"}
    spec = load_spec(path)
    settings = spec.settings(Settings.from_env(env), env)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate_for_spec(spec, GeneratorConfig(
        count=900, seed=23, end=end, span=timedelta(hours=2), late_fraction=0.05,
        duplicate_fraction=0.04, malformed_fraction=0.04)).records
    valid = sum(1 for r in records if r.kind in VALID_KINDS)
    produce(settings, records)

    with running_service(env, tmp_path / "service.log") as svc:
        kill_inside_batch(svc, settings, "bronze_before_aggregates", min_batch=0)
    assert 0 < rows(settings, "bronze_events") < valid  # the killed batch's bronze, no more

    def live() -> dict:
        try:
            return table_windows_for_spec(spec, read(settings, "streaming_aggregates"))
        except Exception:
            return {}

    def expected() -> dict:
        """Every valid event once, except exactly the copies the late lane recorded."""
        late_ids = Counter(read(settings, "late_events")["event_id"].to_pylist())
        kept = []
        for r in reversed(rows_for_spec(spec, records)):  # a late copy comes after the counted
            if late_ids[r.event_id]:
                late_ids[r.event_id] -= 1
            else:
                kept.append(r)
        assert not +late_ids
        return windows_of_rows(spec, list(reversed(kept)))

    # A catch-up on the same checkpoint (the lock released with the dead process): the killed
    # batch re-run with its offsets, then the rest in one batch.
    stream.catch_up(spark, settings.model_copy(update={"max_offsets_per_trigger": 10_000}))

    positions: Counter = Counter()
    for table in ("bronze_events", "quarantined_events"):
        t = read(settings, table)
        positions.update(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
    assert max(positions.values()) == 1
    assert sum(positions.values()) == len(records)  # with the offsets dense: each one once
    for p in {p for p, _ in positions}:
        offsets = {o for pp, o in positions if pp == p}
        assert offsets == set(range(len(offsets))), p
    assert rows(settings, "bronze_events") == valid
    quarantine = read(settings, "quarantined_events")["reason"].to_pylist()
    assert Counter(quarantine) == Counter(r.kind for r in records if r.kind not in VALID_KINDS)
    assert {"unknown_schema_id", "invalid_avro"} <= set(quarantine)
    assert read(settings, "late_events").num_rows > 0
    assert live() == expected()
