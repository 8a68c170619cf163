"""Exact windows of a date recomputed from bronze (all, or a scope of windows)."""

from __future__ import annotations

from datetime import date, datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings, from_micros
from spark_jobs.transforms.counting import events_for_date
from spark_jobs.transforms.windows import aggregate_windows, with_window_bounds


def recompute(bronze: DataFrame, settings: Settings, d: date, scope: DataFrame | None) -> DataFrame:
    """Exact windows of `d` from its bronze rows: all of them, or those in `scope`. Dedup needs
    every copy of an event id in the date, so the rows read are the scope's windows (pruned by
    event time) plus the other copies of their ids."""
    if scope is None:
        return aggregate_windows(events_for_date(bronze, settings, d), settings)
    keys = list(settings.shape.window_id)
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
