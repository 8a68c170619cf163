"""Which windows of a date an incremental corrections run recomputes, and the event-time ranges
of bronze it reads for them."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE, RECONCILED
from lakehouse.tables.correction_result import CorrectionResult
from spark_jobs.tables import read_changes, read_table
from spark_jobs.transforms.windows import with_window_bounds


def affected_windows(spark: SparkSession, settings: Settings, d: date, bronze: DataFrame,
                     first: int, last: int) -> DataFrame:
    """(window_start, dimensions) of `d` whose counted events may differ after bronze commits
    first..last: windows of changed rows, windows of every other copy of their event ids (a new
    copy can come first in arrival order), and gold windows still open (they may close)."""
    keys = list(settings.shape.window_id)
    changed = (
        read_changes(spark, settings, BRONZE, first, last)
        .where(F.col("event_date") == F.lit(d))
        .select("event_id", "event_time", *settings.shape.dimension_names)
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
    up). Whether bronze changed the date at all is read from its log first (no Spark job)."""
    changed = state.bronze_version < bronze_version and delta_log.partition_changed(
        settings.table_path(BRONZE.name), BRONZE.partition_by, d.isoformat(),
        state.bronze_version + 1, bronze_version)
    if changed is False:
        # No bronze row of the date changed since gold was computed from it, so a recompute
        # gives every window gold holds: only open windows the watermark has closed since
        # change (their status). Usually none: then nothing is read or diffed.
        closing = (F.col("window_end") <= F.lit(result.watermark) if result.watermark
                   else F.lit(False))
        scope = (read_table(spark, settings, RECONCILED)
                 .where((F.col("event_date") == F.lit(d)) & (F.col("status") == "open") & closing)
                 .select(*settings.shape.window_id))
        return scope.localCheckpoint(eager=True)
    try:
        return affected_windows(spark, settings, d, bronze, state.bronze_version + 1,
                                bronze_version).localCheckpoint(eager=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable change feed means: recompute all
        result.mode = "full"
        result.reason = (f"bronze change feed unavailable since version {state.bronze_version + 1}: "
                         f"{str(exc).splitlines()[0][:200]}")
        return None
