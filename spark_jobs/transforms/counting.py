"""Which events count for a date: the dedup and horizon rules (docs/design.md §4), in one place.

Corrections (from bronze) and the replay (from the raw log) both call `events_for_date`, so the
two sides of the proof apply the same rules without either importing the other.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings

# Order that decides which copy of a duplicated event_id is "first": broker append time, then
# log position. Deterministic, so corrections and replay pick the same copy.
ARRIVAL_ORDER = ("kafka_timestamp", "topic", "partition", "offset")


def dedup_first(events: DataFrame) -> DataFrame:
    """Keep the first copy of each event_id within its event_date (a re-sent event keeps its id,
    its event time and so its date, and counts once). A hash aggregate (the smallest struct led
    by the arrival order, which is unique per record), not a sort per (date, id)."""
    keys = ("event_date", "event_id")
    rest = [c for c in events.columns if c not in keys and c not in ARRIVAL_ORDER]
    first = F.min(F.struct(*ARRIVAL_ORDER, *rest)).alias("_first")
    return events.groupBy(*keys).agg(first).select(
        *[F.col(c) if c in keys else F.col(f"_first.{c}").alias(c) for c in events.columns])


def within_horizon(settings: Settings, d: date) -> Column:
    """True for records of date `d` that reached the broker within the correction horizon."""
    return F.col("kafka_timestamp") <= F.lit(settings.applicable_cutoff(d))


def events_for_date(events: DataFrame, settings: Settings, d: date) -> DataFrame:
    """Valid events of `d` that count: within the horizon, first copy of each event_id."""
    in_date = events.where(F.col("event_date") == F.lit(d))
    return dedup_first(in_date.where(within_horizon(settings, d)))
