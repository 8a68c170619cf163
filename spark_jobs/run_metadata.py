"""Small table summaries for materialization metadata and the demo report."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakehouse.settings import Settings, from_micros
from spark_jobs import checkpoint as ckpt
from spark_jobs.checkpoint import AGG_QUERY, stream_watermark
from spark_jobs.tables import BRONZE, LATE, QUARANTINE, STREAMING, read_table


def bronze_summary(spark: SparkSession, settings: Settings) -> dict:
    bronze = read_table(spark, settings, BRONZE).agg(
        F.count("*").alias("rows"), F.max(F.unix_micros("event_time")).alias("newest")
    ).first()
    reasons = {
        r.reason: r.n
        for r in read_table(spark, settings, QUARANTINE).groupBy("reason")
        .agg(F.count("*").alias("n")).collect()
    }
    return {
        "bronze_rows": bronze.rows,
        "newest_event_time": from_micros(bronze.newest).isoformat() if bronze.newest else None,
        "quarantined_rows": sum(reasons.values()),
        "quarantine_reasons": reasons,
    }


def seconds_since(us: int | None, now: datetime) -> float | None:
    """Seconds from epoch microseconds `us` (Spark's `unix_micros`) to `now`."""
    if us is None:
        return None
    return round((now - from_micros(us)).total_seconds(), 1)


def streaming_summary(spark: SparkSession, settings: Settings, batch_ids: list[int]) -> dict:
    """Totals, plus what this run's batches (`batch_ids`) did, and freshness: now minus the
    newest event time, and now minus the end of the newest closed window."""
    now = datetime.now(UTC)
    agg = read_table(spark, settings, STREAMING)
    row = agg.agg(
        F.count("*").alias("windows"),
        F.count(F.when(F.col("status") == "open", 1)).alias("open"),
        F.count(F.when(F.col("status") == "final", 1)).alias("final"),
        F.count(F.when(F.col("batch_id").isin(batch_ids), 1)).alias("touched"),
        F.count(F.when(F.col("batch_id").isin(batch_ids) & (F.col("status") == "final"), 1))
        .alias("closed"),
        F.max(F.when(F.col("status") == "final", F.unix_micros("window_end")))
        .alias("newest_closed"),
    ).first()
    newest_event = read_table(spark, settings, BRONZE).agg(
        F.max(F.unix_micros("event_time"))).first()[0]
    late = read_table(spark, settings, LATE)
    horizon_s = int(settings.correction_horizon.total_seconds())
    cutoff = F.unix_seconds(F.to_timestamp(F.date_add("event_date", 1))) + F.lit(horizon_s)
    late_in_run = late.where(F.col("batch_id").isin(batch_ids)).agg(
        F.count("*").alias("n"),
        F.sum(F.when(F.unix_seconds("kafka_timestamp") > cutoff, 1).otherwise(0)).alias("beyond"),
    ).first()
    wm = stream_watermark(spark, settings)
    committed = ckpt.last_commit_time(spark, settings.checkpoint_path(AGG_QUERY))
    return {
        "windows": row.windows,
        "windows_open": row.open,
        "windows_final": row["final"],
        "windows_updated_in_run": row.touched,
        "windows_closed_in_run": row.closed,
        "watermark": wm.isoformat() if wm else None,
        "late_events": late.count(),
        "late_events_in_run": late_in_run.n,
        # Arrived after their date's correction horizon: kept and reported, never applied.
        "late_events_beyond_horizon_in_run": late_in_run.beyond or 0,
        "freshness_newest_event_s": seconds_since(newest_event, now),
        "freshness_newest_closed_window_s": seconds_since(row.newest_closed, now),
        "checkpoint_age_s": round(now.timestamp() - committed, 1) if committed else None,
    }
