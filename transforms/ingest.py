"""The ingest batch's DataFrame logic, pure (no I/O): the watermark's next value, the late
lane's rows, the events that count, and the aggregate rows with their status. The job that
reads and writes around them is `spark_jobs.stream`."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakehouse.commit_tags import StreamCommit
from lakehouse.settings import Settings
from lakehouse.shape import EventShape
from transforms.counting import ARRIVAL_ORDER
from transforms.windows import window_of


def next_watermark_ms(watermark_ms: int, newest_event_ms: int | None, settings: Settings) -> int:
    """The watermark after a batch: never moves back; max event time seen minus the delay."""
    if newest_event_ms is None:
        return watermark_ms
    return max(watermark_ms, newest_event_ms - int(settings.watermark_delay.total_seconds() * 1000))


def late_projection(valid: DataFrame, settings: Settings, watermark_ms: int,
                    batch_id: int) -> DataFrame:
    """`late_events` rows of valid events at or below the watermark (the caller filters)."""
    wm = F.timestamp_millis(F.lit(watermark_ms))
    w = window_of(settings)
    shape = settings.shape
    return valid.select(
        "event_id", *shape.dimension_names, "event_time", *shape.measure_fields, "event_date",
        w.start.alias("window_start"), w.end.alias("window_end"),
        (F.lit(watermark_ms) - F.unix_millis("event_time")).alias("lateness_ms"),
        F.lit(batch_id).cast("long").alias("batch_id"),
        wm.alias("batch_watermark"),
        "topic", "partition", "offset", "kafka_timestamp",
        F.current_timestamp().alias("recorded_at"),
    )


def first_copies(events: DataFrame, shape: EventShape) -> DataFrame:
    """One row per (event_date, event_id): the first copy by broker time, then log position
    (the order corrections and the replay use), with a hash aggregate instead of a sort."""
    kept = (*shape.dimension_names, "event_time", *shape.measure_fields)
    first = F.min(F.struct(*ARRIVAL_ORDER, *kept)).alias("f")
    return events.groupBy("event_date", "event_id").agg(first).select(
        "event_date", "event_id", *[F.col(f"f.{c}").alias(c) for c in kept])


def counted_events(on_time: DataFrame, earlier: DataFrame | None, shape: EventShape
                   ) -> DataFrame:
    """The on-time events that count: the first copy of each event_id in the batch, unless an
    earlier batch already ingested a copy still above the watermark (`earlier`: event_date,
    event_id). A copy at or below the watermark cannot have a counted twin: its twin is late too
    (a re-sent event keeps its event time)."""
    firsts = first_copies(on_time, shape)
    if earlier is None:
        return firsts
    return firsts.join(earlier, ["event_date", "event_id"], "left_anti")


def with_status(deltas: DataFrame, commit: StreamCommit, batch_id: int) -> DataFrame:
    """New `streaming_aggregates` rows from window deltas: final when the next watermark has
    passed their end."""
    next_ts = F.timestamp_millis(F.lit(commit.next_watermark_ms))
    return deltas.select(
        *deltas.columns,
        F.when(F.col("window_end") <= next_ts, "final").otherwise("open").alias("status"),
        next_ts.alias("watermark"), F.lit(batch_id).cast("long").alias("batch_id"),
        F.current_timestamp().alias("updated_at"),
        F.lit(commit.version).cast("long").alias("bronze_version"))
