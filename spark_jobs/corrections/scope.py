"""Which windows of a date an incremental corrections run recomputes, and the event-time ranges
of bronze it reads for them."""

from __future__ import annotations

from datetime import date, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.settings import Settings
from spark_jobs.corrections.result import KEY, CorrectionResult
from spark_jobs.tables import BRONZE, RECONCILED, read_changes, read_table
from transforms.windows import with_window_bounds


def affected_windows(spark: SparkSession, settings: Settings, d: date, bronze: DataFrame,
                     first: int, last: int) -> DataFrame:
    """(window_start, key) of `d` whose counted events may differ after bronze commits
    first..last: windows of changed rows, windows of every other copy of their event ids (a new
    copy can come first in arrival order), and gold windows still open (they may close)."""
    keys = list(KEY)
    changed = (
        read_changes(spark, settings, BRONZE, first, last)
        .where(F.col("event_date") == F.lit(d))
        .select("event_id", "event_time", "key")
    )
    copies = bronze.join(F.broadcast(changed.select("event_id").distinct()), "event_id",
                         "left_semi")
    still_open = (
        read_table(spark, settings, RECONCILED)
        .where((F.col("event_date") == F.lit(d)) & (F.col("status") == "open"))
        .select(*keys)
    )
    return (
        with_window_bounds(changed, settings).select(*keys)
        .unionByName(with_window_bounds(copies, settings).select(*keys))
        .unionByName(still_open)
        .distinct()
    )


def incremental_scope(spark: SparkSession, settings: Settings, d: date, bronze: DataFrame, state,
                       bronze_version: int, result: CorrectionResult) -> DataFrame | None:
    """The windows to recompute (computed once, cut from their lineage), or None (whole date)
    when the bronze change feed for the range can no longer be read (e.g. log files cleaned
    up)."""
    if state.bronze_version >= bronze_version:
        scope = (read_table(spark, settings, RECONCILED)
                 .where((F.col("event_date") == F.lit(d)) & (F.col("status") == "open"))
                 .select(*KEY))
        return scope.localCheckpoint(eager=True)
    try:
        return affected_windows(spark, settings, d, bronze, state.bronze_version + 1,
                                bronze_version).localCheckpoint(eager=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable change feed means: recompute all
        result.mode = "full"
        result.reason = (f"bronze change feed unavailable since version {state.bronze_version + 1}: "
                         f"{str(exc).splitlines()[0][:200]}")
        return None


def time_ranges(starts: list[datetime], size: timedelta, max_ranges: int = 32
                ) -> list[tuple[datetime, datetime]]:
    """[lo, hi) event-time ranges covering windows starting at `starts` (sorted), adjacent ones
    merged, at most `max_ranges` (the smallest gaps are closed first). They prune bronze files
    by their event_time statistics: a few late windows early in the day plus the open windows
    at its end read two small ranges, not the whole day."""
    ranges: list[list[datetime]] = []
    for start in starts:
        if ranges and start <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], start + size)
        else:
            ranges.append([start, start + size])
    while len(ranges) > max_ranges:
        i = min(range(len(ranges) - 1), key=lambda j: ranges[j + 1][0] - ranges[j][1])
        ranges[i:i + 2] = [[ranges[i][0], ranges[i + 1][1]]]
    return [(lo, hi) for lo, hi in ranges]
