"""History for `make bench` at scale, written straight into the tables with Spark (producing and
streaming 20 million events would take this machine most of an hour).

The rows go in as `dataChange=false` appends: the streaming source and the change feed skip
such commits (as they skip a compaction), so the stream does not re-process them and the
corrections do not see them as news, while the table's snapshot, its log statistics and
every full read hold them, which is what a cost that must not grow with history is measured on.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import BRONZE, STREAMING

KEYS = 1000


def _bronze_rows(spark: SparkSession, rows: int, first_day: date, days: int, first_id: int) -> DataFrame:
    """`rows` valid bronze rows spread over `days` dates from `first_day`, 06:00-18:00 UTC."""
    start = datetime.combine(first_day, time(6))
    ids = spark.range(first_id, first_id + rows)
    event_time = (F.lit(start) + F.make_dt_interval(
        F.col("id") % days, F.lit(0), F.lit(0), (F.col("id") / days).cast("long") % 43_200))
    return ids.select(
        F.concat(F.lit("h-"), F.col("id")).alias("event_id"),
        F.concat(F.lit("k"), F.col("id") % KEYS).alias("key"),
        event_time.alias("event_time"), event_time.alias("payload_event_time"),
        ((F.col("id") % 100_000) / 100).cast("decimal(38,6)").alias("value"),
        F.lit(None).cast("string").alias("attributes"),
        F.concat(F.lit("k"), F.col("id") % KEYS).alias("record_key"),
        F.lit("history").alias("topic"), (F.col("id") % 4).cast("int").alias("partition"),
        F.col("id").alias("offset"), event_time.alias("kafka_timestamp"),
        F.to_date(event_time).alias("event_date"), event_time.alias("ingested_at"),
        F.lit(-1).cast("long").alias("bronze_batch_id"),
    )


def _append_history(df: DataFrame, settings: Settings, table: str) -> None:
    (df.write.format("delta").mode("append").option("dataChange", "false")
     .save(settings.table_path(table)))


def add_bronze(spark: SparkSession, settings: Settings, rows: int, first_day: date, days: int,
               first_id: int = 10**12) -> None:
    _append_history(_bronze_rows(spark, rows, first_day, days, first_id), settings, BRONZE.name)


def add_history(spark: SparkSession, settings: Settings, rows: int, last_day: date,
                days: int = 60) -> None:
    """`rows` bronze rows over the `days` dates up to `last_day`, and a window row (status
    final) per 20 of them in `streaming_aggregates` (sizes, not sums, are what is measured)."""
    first_day = last_day - timedelta(days=days - 1)
    add_bronze(spark, settings, rows, first_day, days)
    start = datetime.combine(first_day, time(6))
    ids = spark.range(rows // 20)
    window_start = F.lit(start) + F.make_dt_interval(
        F.col("id") % days, F.lit(0), (F.col("id") / days / KEYS).cast("long") % 720, F.lit(0))
    window_end = window_start + F.expr("INTERVAL 1 MINUTE")
    _append_history(ids.select(
        F.to_date(window_start).alias("event_date"), window_start.alias("window_start"),
        window_end.alias("window_end"), F.concat(F.lit("k"), (F.col("id") / days).cast("long") % KEYS).alias("key"),
        F.lit(20).cast("long").alias("event_count"), F.lit(20).cast("decimal(38,6)").alias("value_sum"),
        F.lit(1).cast("decimal(38,6)").alias("value_min"), F.lit(1).cast("decimal(38,6)").alias("value_max"),
        F.lit(0).cast("decimal(38,0)").alias("event_fingerprint"), F.lit("final").alias("status"),
        window_end.alias("watermark"), F.lit(-1).cast("long").alias("batch_id"),
        window_end.alias("updated_at")), settings, STREAMING.name)
