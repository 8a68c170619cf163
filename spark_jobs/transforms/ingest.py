"""The ingest batch's DataFrame logic, pure (no I/O): the watermark's next value, the late
lane's rows, the events that count, and the aggregate rows with their status. The job that
reads and writes around them is `spark_jobs.stream`."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.events.shape import EventShape
from lakehouse.tables.commit_tags import StreamCommit
from spark_jobs.transforms.counting import ARRIVAL_ORDER
from spark_jobs.transforms.windows import window_of


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


def fold_into_open(open_rows: DataFrame, deltas: DataFrame | None, shape: EventShape,
                   commit: StreamCommit, batch_id: int) -> DataFrame:
    """The open windows after a batch: `open_rows` (every `streaming_aggregates` row still open
    before it) with the batch's window deltas added in, each row's status from the next
    watermark (`final` once it has passed the window's end).

    A delta's window is always open or new (its events lie above the batch's watermark, so its
    end does too), so this frame is every row the batch changes: written in place of the open
    rows, it is the whole publication of the batch. Rows the batch adds into or closes carry its
    watermark, batch, bronze version and time; the others keep theirs."""
    next_ts = F.timestamp_millis(F.lit(commit.next_watermark_ms))
    keys = ["event_date", *shape.window_id]
    o = open_rows.alias("o")
    if deltas is None:
        touched = F.lit(False)
        both = o
        pick = {c: F.col(f"o.{c}") for c in ("window_end", *shape.measure_columns)}
    else:
        d = deltas.alias("d")
        both = o.join(d, keys, "full_outer")
        touched = F.col("d.event_count").isNotNull()
        was_open = F.col("o.event_count").isNotNull()

        # A window on one side only keeps that side's value. A measure column an open window
        # lacks (null: an in-place spec edit added it after the window opened) stays null: its
        # earlier events were never counted into it, and a partial value would pass for a total.
        def folded(c: str, combine) -> Column:
            o_c, d_c = F.col(f"o.{c}"), F.col(f"d.{c}")
            return (F.when(~was_open, d_c).when(~touched | o_c.isNull(), o_c)
                    .otherwise(combine(o_c, d_c)))

        pick = {"window_end": F.coalesce("o.window_end", "d.window_end"),
                **{c: folded(c, lambda a, b: a + b) for c in shape.additive_columns},
                **{c: folded(c, F.least) for c in shape.columns_of("min")},
                **{c: folded(c, F.greatest) for c in shape.columns_of("max")}}
    closing = pick["window_end"] <= next_ts
    changed = touched | closing
    return both.select(
        *keys, pick["window_end"].alias("window_end"),
        *[pick[c].alias(c) for c in shape.measure_columns],
        F.when(closing, "final").otherwise("open").alias("status"),
        F.when(changed, next_ts).otherwise(F.col("o.watermark")).alias("watermark"),
        F.when(touched, F.lit(batch_id).cast("long")).otherwise(F.col("o.batch_id"))
        .alias("batch_id"),
        F.when(changed, F.current_timestamp()).otherwise(F.col("o.updated_at")).alias("updated_at"),
        F.when(touched, F.lit(commit.version).cast("long")).otherwise(F.col("o.bronze_version"))
        .alias("bronze_version"))
