"""Run metadata for the stream assets, at a cost that does not grow with history: totals from
the Delta log's statistics (`lakehouse.tables.stats`), what this run did from its own batches'
rows (found by Delta data skipping on `batch_id`/`bronze_batch_id`), the open windows (skipping
on `status`) and the newest closed window (skipping on `window_end`, from a floor the log gives).
No query here reads the whole of a table."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings, from_micros
from lakehouse.tables.catalog import BRONZE, FINAL, INGEST_QUERY, LATE, OPEN, QUARANTINE, STREAMING
from lakehouse.tables.commit_tags import stream_watermark
from lakehouse.tables.delta_log import open_table
from lakehouse.tables.stats import largest_file_max_at_most, log_stats
from spark_jobs import checkpoint as ckpt
from spark_jobs.tables import read_table


def _in_run(column: str, batch_ids: list[int]) -> Column:
    """Rows written by this run's batches; the range lets Delta skip every older file."""
    return (F.col(column) >= min(batch_ids)) & F.col(column).isin(batch_ids)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def bronze_summary(spark: SparkSession | None, settings: Settings, batch_ids: list[int]) -> dict:
    """Totals from the log, and the quarantine reasons of this run's batches (`batch_ids`;
    `spark` may be None when there are none: a run that found nothing to do starts no JVM)."""
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
        "pipeline": settings.pipeline,
        "bronze_rows": bronze.rows,
        # From the files' statistics: to the millisecond.
        "newest_event_time": _iso(bronze.max["event_time"]),
        "quarantined_rows": quarantine.rows,
        "quarantined_rows_in_run": sum(reasons.values()),
        "quarantine_reasons_in_run": reasons,
    }


def seconds_since(when: datetime | None, now: datetime) -> float | None:
    return round((now - when).total_seconds(), 1) if when else None


@dataclass(frozen=True)
class RecentWindows:
    open: int
    touched: int  # rows written by this run's batches
    closed: int  # of those, final
    newest_closed_end: datetime | None


def recent_windows(spark: SparkSession | None, settings: Settings, batch_ids: list[int],
                   watermark: datetime | None) -> RecentWindows:
    """One pass over the files that can hold an open window, a row of this run's batches, or a
    closed window newer than every file lying wholly below the watermark (the log's floor).
    The stream finalizes every window ending at or before the watermark, so the floor is itself
    a closed window's end when the query finds none newer."""
    floor = (largest_file_max_at_most(settings, STREAMING.name, "window_end", watermark)
             if watermark else None)
    if spark is None:
        return _recent_windows_without_spark(settings, batch_ids, floor)
    is_open = F.col("status") == OPEN
    in_run = _in_run("batch_id", batch_ids) if batch_ids else F.lit(False)
    closed = F.col("status") == FINAL
    # Window ends lie on the window grid, so "after the floor" is ">= floor + one window". Not
    # "> floor": Delta widens timestamp maxima by 1 ms (its stats are in milliseconds), so that
    # would still read every file whose maximum is the floor.
    newer_closed = (closed & (F.col("window_end") >= F.lit(floor + settings.window_size))
                    if floor else closed)
    # Status is a partition column: the open partitions, and the final files this run wrote or
    # newer than the floor, are two reads Delta prunes each (an OR across a partition column
    # and data columns would prune nothing).
    table = read_table(spark, settings, STREAMING)
    rows = table.where(is_open).unionByName(table.where(closed & (in_run | newer_closed)))
    row = rows.agg(
        F.count(F.when(is_open, 1)).alias("open"),
        F.count(F.when(in_run, 1)).alias("touched"),
        F.count(F.when(in_run & closed, 1)).alias("closed"),
        # Epoch micros: a collected TIMESTAMP would come back in the host's local time.
        F.max(F.when(newer_closed, F.unix_micros("window_end"))).alias("newest_closed"),
    ).first()
    newest = from_micros(row.newest_closed) if row.newest_closed is not None else floor
    return RecentWindows(row.open, row.touched, row.closed, newest)


def _recent_windows_without_spark(settings: Settings, batch_ids: list[int],
                                  floor: datetime | None) -> RecentWindows:
    """`recent_windows` through delta-rs' query engine (deletion vectors applied, files skipped
    by their statistics as Spark does): what a run that starts no JVM reports."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    table = open_table(settings, STREAMING.name)
    if table is None:
        return RecentWindows(0, 0, 0, floor)
    ids = ", ".join(str(int(b)) for b in batch_ids)
    in_run = f"(batch_id >= {min(batch_ids)} AND batch_id IN ({ids}))" if batch_ids else "FALSE"
    newer_closed = "status = 'final'" + (
        f" AND window_end >= TIMESTAMP '{_iso(floor + settings.window_size)}'" if floor else "")
    row = pa.table(QueryBuilder().register("t", table).execute(
        f"SELECT count(CASE WHEN status = 'open' THEN 1 END) AS open, "
        f"count(CASE WHEN {in_run} THEN 1 END) AS touched, "
        f"count(CASE WHEN {in_run} AND status = 'final' THEN 1 END) AS closed, "
        f"max(CASE WHEN {newer_closed} THEN window_end END) AS newest_closed "
        f"FROM t WHERE status = 'open' OR {in_run} OR ({newer_closed})").read_all()).to_pylist()[0]
    newest = row["newest_closed"]
    return RecentWindows(row["open"], row["touched"], row["closed"],
                         newest.astimezone(UTC) if newest is not None else floor)


def streaming_summary(spark: SparkSession | None, settings: Settings,
                      batch_ids: list[int]) -> dict:
    """Totals, plus what this run's batches (`batch_ids`) did, and freshness: now minus the
    newest event time, and now minus the end of the newest closed window. `spark` may be None
    when `batch_ids` is empty (the open and closed windows then come through delta-rs)."""
    now = datetime.now(UTC)
    wm = stream_watermark(settings)
    windows = log_stats(settings, STREAMING.name)
    late = log_stats(settings, LATE.name)
    newest_event = log_stats(settings, BRONZE.name, max_of=("event_time",)).max["event_time"]
    recent = recent_windows(spark, settings, batch_ids, wm)
    late_in_run = {"n": 0, "beyond": 0}
    if batch_ids:
        horizon_s = int(settings.correction_horizon.total_seconds())
        cutoff = F.unix_seconds(F.to_timestamp(F.date_add("event_date", 1))) + F.lit(horizon_s)
        late_in_run = read_table(spark, settings, LATE).where(_in_run("batch_id", batch_ids)).agg(
            F.count("*").alias("n"),
            F.sum(F.when(F.unix_seconds("kafka_timestamp") > cutoff, 1).otherwise(0))
            .alias("beyond"),
        ).first().asDict()
    committed = ckpt.last_commit_time(spark, settings.checkpoint_path(INGEST_QUERY))
    return {
        "windows": windows.rows,
        "windows_open": recent.open,
        "windows_final": windows.rows - recent.open if windows.rows is not None else None,
        "windows_updated_in_run": recent.touched,
        "windows_closed_in_run": recent.closed,
        "watermark": wm.isoformat() if wm else None,
        "late_events": late.rows,
        "late_events_in_run": late_in_run["n"],
        # Arrived after their date's correction horizon: kept and reported, never applied.
        "late_events_beyond_horizon_in_run": late_in_run["beyond"] or 0,
        "freshness_newest_event_s": seconds_since(newest_event, now),
        "freshness_newest_closed_window_s": seconds_since(recent.newest_closed_end, now),
        "checkpoint_age_s": round(now.timestamp() - committed, 1) if committed else None,
    }
