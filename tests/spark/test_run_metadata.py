"""Run metadata costs what the run did, not what history holds, and no Spark job: totals come
from the Delta log, the run's own rows and the open windows from the files delta-rs keeps by
their statistics. Proved by deleting the older data files from storage (left in the log): any
query that read the whole table would fail on them, and the totals still count them. (Spark
writes the tables here, as the stream does.)"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import types as T

from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import BRONZE, LATE, QUARANTINE, STREAMING
from lakehouse.tables.run_metadata import bronze_summary, late_in_run, recent_windows
from lakehouse.tables.stats import LogStats, log_stats
from spark_jobs.tables import read_table
from spark_jobs.writer import ensure_tables

NOW = datetime.now(UTC).replace(microsecond=0)
OLD = NOW - timedelta(days=30)
DEFAULTS = {T.StringType: "x", T.IntegerType: 0, T.LongType: 0, T.TimestampType: NOW,
            T.DateType: NOW.date(), T.DecimalType: Decimal(1)}


def append(spark, settings, table, rows: list[dict]) -> set[str]:
    """Append `rows` (missing columns get defaults) in one commit; returns the new data files."""
    path = Path(settings.table_path(table.name))
    before = set(path.rglob("*.parquet"))
    schema = read_table(spark, settings, table).schema
    filled = [tuple(r.get(f.name, DEFAULTS[type(f.dataType)]) for f in schema.fields)
              for r in rows]
    spark.createDataFrame(filled, schema).coalesce(1).write.format("delta").mode("append") \
        .save(str(path))
    return set(path.rglob("*.parquet")) - before


def window(start: datetime, status: str, batch: int) -> dict:
    return {"event_date": start.date(), "window_start": start,
            "window_end": start + timedelta(minutes=1), "key": f"k{start:%H%M}{status}",
            "status": status, "batch_id": batch}


def test_run_metadata_reads_only_the_runs_rows_and_the_log(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    assert log_stats(settings, BRONZE.name, max_of=("event_time",)) == LogStats(
        0, 0, {"event_time": None})  # no table yet
    ensure_tables(spark, settings)
    # History: a month-old date, every window final, written by batch 0.
    old = [append(spark, settings, BRONZE, [{"event_time": OLD, "event_date": OLD.date(),
                                             "bronze_batch_id": 0}] * 3),
           append(spark, settings, QUARANTINE, [{"reason": "invalid_json",
                                                 "bronze_batch_id": 0}] * 4),
           append(spark, settings, STREAMING, [window(OLD + timedelta(minutes=m), "final", 0)
                                               for m in range(5)]),
           append(spark, settings, LATE, [{"batch_id": 0, "event_date": OLD.date()}] * 2)]
    # This run: batches 7 and 8.
    newest = NOW - timedelta(minutes=3, milliseconds=250)
    append(spark, settings, BRONZE, [{"event_time": newest, "event_date": newest.date(),
                                      "bronze_batch_id": 7}] * 2)
    append(spark, settings, QUARANTINE, [{"reason": "missing_key", "bronze_batch_id": 7},
                                         {"reason": "invalid_value", "bronze_batch_id": 8}])
    start = NOW.replace(second=0) - timedelta(minutes=10)
    append(spark, settings, STREAMING, [window(start, "final", 7), window(start, "open", 8),
                                        window(start + timedelta(minutes=1), "open", 8)])
    # Batch 8's late rows: one within its date's correction horizon, one a microsecond beyond.
    cutoff = settings.applicable_cutoff(OLD.date())
    append(spark, settings, LATE, [
        {"batch_id": 8, "event_date": OLD.date(), "kafka_timestamp": cutoff},
        {"batch_id": 8, "event_date": OLD.date(),
         "kafka_timestamp": cutoff + timedelta(microseconds=1)}])
    for f in set().union(*old):
        f.unlink()  # still in the Delta log: a full scan would now fail
    for table in (QUARANTINE, STREAMING, LATE):
        with pytest.raises(Exception, match="(?i)not exist|FileNotFound|FAILED_READ_FILE"):
            read_table(spark, settings, table).groupBy("batch_id" if table != QUARANTINE
                                                       else "reason").count().collect()

    bronze = bronze_summary(settings, [7, 8])
    assert bronze["bronze_rows"] == 5 and bronze["quarantined_rows"] == 6
    assert bronze["quarantine_reasons_in_run"] == {"missing_key": 1, "invalid_value": 1}
    assert datetime.fromisoformat(bronze["newest_event_time"]) == newest
    assert bronze_summary(settings, [])["quarantine_reasons_in_run"] == {}
    assert late_in_run(settings, [7, 8]) == (2, 1)
    assert late_in_run(settings, [7]) == (0, 0) and late_in_run(settings, []) == (0, 0)

    watermark = start + timedelta(minutes=1, seconds=30)
    recent = recent_windows(settings, [7, 8], watermark)
    assert (recent.open, recent.touched, recent.closed) == (2, 3, 1)
    assert recent.newest_closed_end == start + timedelta(minutes=1)
    assert recent_windows(settings, [], watermark).open == 2
    assert log_stats(settings, STREAMING.name).rows == 8
    assert log_stats(settings, LATE.name).rows == 4

    # A rewrite (what each stream batch does to the open partitions) takes files out of the snapshot: the totals follow.
    spark.sql(f"DELETE FROM delta.`{settings.table_path(STREAMING.name)}` "
              f"WHERE batch_id = 8 AND window_start = '{start + timedelta(minutes=1):%Y-%m-%d %H:%M:%S}'")
    assert log_stats(settings, STREAMING.name).rows == 7
    recent = recent_windows(settings, [7, 8], watermark)
    assert recent.open == 1
    # The rewritten file now lies wholly below the watermark: the newest closed window is its
    # maximum, from the log (the floor), not a row the query returned.
    assert recent.newest_closed_end == start + timedelta(minutes=1)

