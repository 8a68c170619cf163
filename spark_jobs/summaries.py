"""Small table summaries for materialization metadata and the demo report."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakehouse.settings import Settings
from spark_jobs.corrections import stream_watermark
from spark_jobs.tables import BRONZE, LATE, QUARANTINE, STREAMING, read_table


def bronze_summary(spark: SparkSession, settings: Settings) -> dict:
    bronze = read_table(spark, settings, BRONZE).agg(
        F.count("*").alias("rows"), F.max("event_time").alias("newest")
    ).first()
    reasons = {
        r.reason: r.n
        for r in read_table(spark, settings, QUARANTINE).groupBy("reason")
        .agg(F.count("*").alias("n")).collect()
    }
    return {
        "bronze_rows": bronze.rows,
        "newest_event_time": bronze.newest.isoformat() if bronze.newest else None,
        "quarantined_rows": sum(reasons.values()),
        "quarantine_reasons": reasons,
    }


def streaming_summary(spark: SparkSession, settings: Settings) -> dict:
    agg = read_table(spark, settings, STREAMING)
    by_status = {r.status: r.n for r in agg.groupBy("status").agg(F.count("*").alias("n")).collect()}
    wm = stream_watermark(spark, settings)
    return {
        "windows": sum(by_status.values()),
        "windows_open": by_status.get("open", 0),
        "windows_final": by_status.get("final", 0),
        "watermark": wm.isoformat() if wm else None,
        "late_events": read_table(spark, settings, LATE).count(),
    }
