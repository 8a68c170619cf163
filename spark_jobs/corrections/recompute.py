"""Exact windows of a date recomputed from bronze (all, or a scope of windows)."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakehouse.settings import Settings, from_micros
from spark_jobs.corrections.result import KEY
from spark_jobs.corrections.scope import time_ranges
from transforms.counting import events_for_date
from transforms.windows import aggregate_windows, with_window_bounds


def recompute(bronze: DataFrame, settings: Settings, d: date, scope: DataFrame | None) -> DataFrame:
    """Exact windows of `d` from its bronze rows: all of them, or those in `scope`. Dedup needs
    every copy of an event id in the date, so the rows read are the scope's windows (pruned by
    event time) plus the other copies of their ids."""
    if scope is None:
        return aggregate_windows(events_for_date(bronze, settings, d), settings)
    keys = list(KEY)
    # As epoch micros, not datetimes: collect() would give naive local times (wrong across a
    # DST change when the Python process is not in UTC).
    starts = sorted(from_micros(r.us) for r in scope.select(
        F.unix_micros("window_start").alias("us")).distinct().collect())
    if not starts:
        return aggregate_windows(bronze.limit(0), settings)
    in_ranges = F.lit(False)
    for lo, hi in time_ranges(starts, settings.window_size):
        in_ranges = in_ranges | ((F.col("event_time") >= F.lit(lo)) & (F.col("event_time") < F.lit(hi)))
    in_scope = with_window_bounds(bronze.where(in_ranges), settings).join(
        F.broadcast(scope), keys, "left_semi")
    candidates = bronze.join(F.broadcast(in_scope.select("event_id").distinct()), "event_id",
                             "left_semi")
    counted = (
        with_window_bounds(events_for_date(candidates, settings, d), settings)
        .join(F.broadcast(scope), keys, "left_semi")
        .drop("window_start", "window_end")
    )
    return aggregate_windows(counted, settings)
