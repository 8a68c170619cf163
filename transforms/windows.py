"""Event-time windows and measures, shared by the stream, corrections and replay.

One definition of the measures keeps the three paths comparable row by row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakehouse.settings import Settings, spark_interval


def fingerprint(event_id: Column) -> Column:
    """Order-independent fingerprint term: 64-bit hash of the id, summed exactly as a decimal."""
    return F.xxhash64(event_id).cast("decimal(20,0)")


def measures() -> list[Column]:
    return [
        F.count(F.lit(1)).alias("event_count"),
        F.sum("value").cast("decimal(38,6)").alias("value_sum"),
        F.min("value").alias("value_min"),
        F.max("value").alias("value_max"),
        F.sum(fingerprint(F.col("event_id"))).cast("decimal(38,0)").alias("event_fingerprint"),
    ]


def window_of(settings: Settings, time_col: str = "event_time") -> Column:
    return F.window(time_col, spark_interval(settings.window_size))


def flatten_window(df: DataFrame, window_col: str = "window") -> DataFrame:
    """(window struct, key, measures...) -> event_date, window_start, window_end, key, measures."""
    others = [c for c in df.columns if c not in (window_col, "key")]
    return df.select(
        F.to_date(F.col(f"{window_col}.start")).alias("event_date"),
        F.col(f"{window_col}.start").alias("window_start"),
        F.col(f"{window_col}.end").alias("window_end"),
        "key",
        *others,
    )


def aggregate_windows(events: DataFrame, settings: Settings) -> DataFrame:
    """Batch aggregation of already-deduplicated events into tumbling windows per key."""
    agg = events.groupBy(window_of(settings).alias("window"), "key").agg(*measures())
    return flatten_window(agg)


def with_window_bounds(events: DataFrame, settings: Settings) -> DataFrame:
    w = window_of(settings)
    return events.withColumn("window_start", w.start).withColumn("window_end", w.end)
