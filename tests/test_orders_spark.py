"""The order pipeline's Spark path on the real broker, without Dagster: a spec's events through
the stream (two catch-ups), corrections and the replay, every table asserted against the
independent reference (testkit.spec_events)."""

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lakehouse.settings import Settings
from lakehouse.spec import load_spec
from lakehouse.table_reads import bronze_dates, compare_tables, read

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def orders(tmp_path_factory, kafka_bootstrap, spark):
    import uuid

    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import run_available_now
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.spec_events import generate_for_spec

    spec = load_spec(EXAMPLES / "orders.yaml")
    root = tmp_path_factory.mktemp("orders")
    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(root), "PARTITIONS_START": "2025-01-01"})
    settings = spec.settings(base, {}).model_copy(
        update={"events_topic": f"orders-{uuid.uuid4().hex[:8]}"})
    end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
    cfg = GeneratorConfig(count=1500, seed=5, end=end, span=timedelta(hours=5), late_fraction=0.05,
                          duplicate_fraction=0.04, malformed_fraction=0.03)
    records = generate_for_spec(spec, cfg).records
    half = len(records) // 2
    for chunk in (records[:half], records[half:]):  # gold published mid-way, then corrected
        produce(settings, chunk)
        run_available_now(spark, settings)
        for d in sorted(bronze_dates(settings)):
            run_corrections(spark, settings, d, run_id="t")
    dates = sorted(bronze_dates(settings))
    for d in dates:
        run_replay(spark, settings, d, run_id="t")
    return spec, settings, records, dates


def test_orders_land_in_their_own_folder_with_their_columns(orders):
    spec, settings, records, dates = orders
    assert settings.root.endswith("/orders") and len(dates) == 2
    gold = read(settings, "reconciled_aggregates")
    assert {"region", "currency", "amount_sum", "amount_min", "amount_max"} <= set(
        gold.column_names)
    assert "key" not in gold.column_names and "value_sum" not in gold.column_names


def test_gold_and_replay_equal_the_reference(orders):
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    spec, settings, records, dates = orders
    expected = expected_windows_for_spec(spec, records)
    assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected
    assert all(compare_tables(settings, d) == 0 for d in dates)


def test_every_bad_order_is_quarantined_with_its_field_s_reason(orders):
    spec, settings, records, _ = orders
    from testkit.reference import VALID_KINDS

    bad = Counter(r.kind for r in records if r.kind not in VALID_KINDS)
    quarantine = read(settings, "quarantined_events")
    assert Counter(quarantine["reason"].to_pylist()) == bad
    assert {"missing_region", "amount_too_precise", "invalid_amount"} <= set(bad)


def test_late_orders_are_corrected_and_logged(orders):
    _, settings, records, _ = orders
    late = read(settings, "late_events")
    assert late.num_rows > 0 and "amount" in late.column_names
    changes = read(settings, "late_corrections")
    assert changes.num_rows > 0
    assert {"before_amount_sum", "after_amount_sum", "region"} <= set(changes.column_names)
    assert set(changes["cause"].to_pylist()) <= {"late_event", "duplicate", "reprocess"}
