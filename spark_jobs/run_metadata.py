"""Run metadata for the stream assets, at a cost that does not grow with history: totals from
the Delta log's statistics (`lakehouse.table_stats`), what this run did from its own batches'
rows (found by Delta data skipping on `batch_id`/`bronze_batch_id`), and the few open or recently
closed windows (skipping on `status`, partition pruning on `event_date`). No query here reads
the whole of a table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from lakehouse.settings import Settings, from_micros
from lakehouse.table_stats import log_stats
from spark_jobs import checkpoint as ckpt
from spark_jobs.checkpoint import AGG_QUERY, stream_watermark
from spark_jobs.tables import BRONZE, LATE, QUARANTINE, STREAMING, read_table

# How far before the watermark the newest closed window is looked for first (partition-pruned);
# only a stream whose keys were all silent for longer falls back to an unbounded query.
CLOSED_WINDOW_LOOKBACK = timedelta(days=1)


def _in_run(column: str, batch_ids: list[int]) -> Column:
    """Rows written by this run's batches; the range lets Delta skip every older file."""
    return (F.col(column) >= min(batch_ids)) & F.col(column).isin(batch_ids)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def bronze_summary(spark: SparkSession, settings: Settings, batch_ids: list[int]) -> dict:
    bronze = log_stats(settings, BRONZE.name, max_of=("event_time",))
    quarantine = log_stats(settings, QUARANTINE.name)
    reasons = {}
    if batch_ids:
        reasons = {
            r.reason: r.n
            for r in read_table(spark, settings, QUARANTINE)
            .where(_in_run("bronze_batch_id", batch_ids))
            .groupBy("reason").agg(F.count("*").alias("n")).collect()
        }
    return {
        "bronze_rows": bronze.rows,
        # From the files' statistics: to the millisecond.
        "newest_event_time": _iso(bronze.max["event_time"]),
        "quarantined_rows": quarantine.rows,
        "quarantined_rows_in_run": sum(reasons.values()),
        "quarantine_reasons_in_run": reasons,
    }


def seconds_since(value: datetime | int | None, now: datetime) -> float | None:
    """Seconds from `value` (a datetime, or epoch microseconds as Spark's `unix_micros`) to
    `now`."""
    if value is None:
        return None
    when = from_micros(value) if isinstance(value, int) else value
    return round((now - when).total_seconds(), 1)


def recent_windows(spark: SparkSession, settings: Settings, batch_ids: list[int],
                    watermark: datetime | None):
    """One pass over the files that can hold an open window, a row of this run's batches, or a
    window closed within CLOSED_WINDOW_LOOKBACK of the watermark."""
    agg = read_table(spark, settings, STREAMING)
    is_open = F.col("status") == "open"
    in_run = _in_run("batch_id", batch_ids) if batch_ids else F.lit(False)
    lower = (watermark - CLOSED_WINDOW_LOOKBACK) if watermark else None
    recent = ((F.col("event_date") >= F.lit(lower.date())) & (F.col("window_end") > F.lit(lower))
              if lower else F.lit(False))
    closed = F.col("status") == "final"
    row = agg.where(is_open | in_run | recent).agg(
        F.count(F.when(is_open, 1)).alias("open"),
        F.count(F.when(in_run, 1)).alias("touched"),
        F.count(F.when(in_run & closed, 1)).alias("closed"),
        # Epoch micros: a collected TIMESTAMP would come back in the host's local time.
        F.max(F.when(closed & recent, F.unix_micros("window_end"))).alias("newest_closed"),
    ).first()
    newest_closed = row.newest_closed
    if newest_closed is None and watermark is not None:
        newest_closed = agg.where(closed).agg(F.max(F.unix_micros("window_end"))).first()[0]
    return row, newest_closed


def streaming_summary(spark: SparkSession, settings: Settings, batch_ids: list[int]) -> dict:
    """Totals, plus what this run's batches (`batch_ids`) did, and freshness: now minus the
    newest event time, and now minus the end of the newest closed window."""
    now = datetime.now(UTC)
    wm = stream_watermark(spark, settings)
    windows = log_stats(settings, STREAMING.name)
    late = log_stats(settings, LATE.name)
    newest_event = log_stats(settings, BRONZE.name, max_of=("event_time",)).max["event_time"]
    row, newest_closed = recent_windows(spark, settings, batch_ids, wm)
    late_in_run = {"n": 0, "beyond": 0}
    if batch_ids:
        horizon_s = int(settings.correction_horizon.total_seconds())
        cutoff = F.unix_seconds(F.to_timestamp(F.date_add("event_date", 1))) + F.lit(horizon_s)
        late_in_run = read_table(spark, settings, LATE).where(_in_run("batch_id", batch_ids)).agg(
            F.count("*").alias("n"),
            F.sum(F.when(F.unix_seconds("kafka_timestamp") > cutoff, 1).otherwise(0))
            .alias("beyond"),
        ).first().asDict()
    committed = ckpt.last_commit_time(spark, settings.checkpoint_path(AGG_QUERY))
    return {
        "windows": windows.rows,
        "windows_open": row.open,
        "windows_final": windows.rows - row.open if windows.rows is not None else None,
        "windows_updated_in_run": row.touched,
        "windows_closed_in_run": row.closed,
        "watermark": wm.isoformat() if wm else None,
        "late_events": late.rows,
        "late_events_in_run": late_in_run["n"],
        # Arrived after their date's correction horizon: kept and reported, never applied.
        "late_events_beyond_horizon_in_run": late_in_run["beyond"] or 0,
        "freshness_newest_event_s": seconds_since(newest_event, now),
        "freshness_newest_closed_window_s": seconds_since(newest_closed, now),
        "checkpoint_age_s": round(now.timestamp() - committed, 1) if committed else None,
    }
