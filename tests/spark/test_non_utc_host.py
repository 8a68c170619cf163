"""The Python process in a non-UTC time zone, across a DST change (America/New_York falls back
on 2026-11-01 at 06:00 UTC, so local 01:30 happens twice): corrections' time-range pruning and
the run metadata still see UTC instants. (The JVM runs in UTC; Python's `collect()` returns
naive local datetimes, which is what this guards against.)"""

import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import BRONZE
from lakehouse.tables.run_metadata import bronze_summary
from spark_jobs.tables import read_table
from spark_jobs.transforms.recompute import recompute
from spark_jobs.writer import ensure_tables

FALL_BACK = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)  # 02:00 EDT -> 01:00 EST


@pytest.fixture()
def new_york(monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    assert time.localtime(FALL_BACK.timestamp() - 1800).tm_hour == 1  # 01:30 EDT
    assert time.localtime(FALL_BACK.timestamp() + 1800).tm_hour == 1  # 01:30 EST
    yield
    monkeypatch.undo()
    time.tzset()


def bronze_rows(spark, times):
    rows = [(f"e{i}", "k", t, Decimal(i + 1), t.date(), t, "events", 0, i)
            for i, t in enumerate(times)]
    return spark.createDataFrame(rows, "event_id string, key string, event_time timestamp, "
                                       "value decimal(38,6), event_date date, "
                                       "kafka_timestamp timestamp, topic string, partition int, "
                                       "offset long")


@pytest.mark.usefixtures("new_york")
def test_corrections_scope_prunes_by_utc_instants_across_the_dst_change(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    # One event per minute from 05:00 to 07:00 UTC: local 01:00-01:59 twice, then 02:00-02:59.
    times = [FALL_BACK - timedelta(hours=1) + timedelta(minutes=m, seconds=10) for m in range(120)]
    bronze = bronze_rows(spark, times)
    # Scope: the window at 05:30 UTC (01:30 EDT) and at 06:30 UTC (01:30 EST), same local clock.
    wanted = [FALL_BACK - timedelta(minutes=30), FALL_BACK + timedelta(minutes=30)]
    scope = spark.createDataFrame([(w, "k") for w in wanted], "window_start timestamp, key string")
    got = recompute(bronze, settings, date(2026, 11, 1), scope).select(
        F.unix_micros("window_start").alias("us"), "event_count", "value_sum").collect()
    assert sorted((r.us, r.event_count) for r in got) == [
        (int(w.timestamp() * 1_000_000), 1) for w in wanted]
    assert sorted(r.value_sum for r in got) == [Decimal(31), Decimal(91)]


@pytest.mark.usefixtures("new_york")
def test_run_metadata_times_are_utc_on_a_non_utc_host(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    ensure_tables(spark, settings)
    newest = FALL_BACK + timedelta(minutes=30, seconds=5)  # local 01:30:05 EST, the second one
    extra = spark.createDataFrame([], read_table(spark, settings, BRONZE).schema).columns
    rows = bronze_rows(spark, [FALL_BACK - timedelta(minutes=30), newest]).select(
        "*", F.lit(None).cast("string").alias("attributes"),
        F.lit(None).cast("string").alias("record_key"),
        F.lit(None).cast("string").alias("record_key_base64"),
        F.col("event_time").alias("payload_event_time"),
        F.current_timestamp().alias("ingested_at"), F.lit(0).cast("long").alias("bronze_batch_id"))
    rows.select(*extra).write.format("delta").mode("append").save(settings.table_path(BRONZE.name))
    summary = bronze_summary(settings, [0])
    assert summary["bronze_rows"] == 2
    assert datetime.fromisoformat(summary["newest_event_time"]) == newest
