"""Event-time windows and measures, shared by the stream, corrections and replay.

One definition of the measures keeps the three paths comparable row by row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings, spark_interval
from lakehouse.events.shape import EventShape


def fingerprint(event_id: Column) -> Column:
    """Order-independent fingerprint term: 64-bit hash of the id, summed exactly as a decimal."""
    return F.xxhash64(event_id).cast("decimal(20,0)")


def fingerprint_sum(event_id: Column) -> Column:
    """`sum(fingerprint(event_id))` as decimal(38,0), exactly, without a decimal per row: a
    64-bit hash is hi * 2^32 + lo (hi its upper 32 bits, signed; lo its lower 32, unsigned), so
    the sum is sum(hi) * 2^32 + sum(lo), two long sums that cannot overflow below 2^31 rows a
    group. A decimal(20,0) per row is a Java BigDecimal (over 18 digits): the per-row decimal
    sum cost ~2 µs a record in the ingest batch's windows (bench.step_costs)."""
    h = F.xxhash64(event_id)
    hi = F.sum(F.shiftright(h, 32)).cast("decimal(38,0)")
    lo = F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).cast("decimal(38,0)")
    return (hi * F.lit(1 << 32).cast("decimal(38,0)") + lo).cast("decimal(38,0)")


def measures(shape: EventShape) -> list[Column]:
    """The shape's aggregates: the count, each decimal field's sum (widened to 38 digits at its
    scale), min and max, and the fingerprint of the ids counted."""
    out = [F.count(F.lit(1)).alias("event_count")]
    for m in shape.measures:
        for aggregate, (column, kind) in zip(m.aggregates, shape.measure_columns_of(m),
                                             strict=True):
            agg = {"sum": F.sum, "min": F.min, "max": F.max}[aggregate](m.field)
            out.append((agg.cast(kind) if aggregate == "sum" else agg).alias(column))
    out.append(fingerprint_sum(F.col("event_id")).alias("event_fingerprint"))
    return out


def window_of(settings: Settings, time_col: str = "event_time") -> Column:
    return F.window(time_col, spark_interval(settings.window_size))


# The window struct's working column (a spec's column names start with a letter: no dimension
# can take it).
WINDOW = "_window"


def flatten_window(df: DataFrame, shape: EventShape, window_col: str = WINDOW) -> DataFrame:
    """(window struct, dimensions, measures...) -> event_date, window_start, window_end,
    dimensions, measures."""
    dims = shape.dimension_names
    others = [c for c in df.columns if c != window_col and c not in dims]
    return df.select(
        F.to_date(F.col(f"{window_col}.start")).alias("event_date"),
        F.col(f"{window_col}.start").alias("window_start"),
        F.col(f"{window_col}.end").alias("window_end"),
        *dims,
        *others,
    )


def aggregate_windows(events: DataFrame, settings: Settings) -> DataFrame:
    """Batch aggregation of already-deduplicated events into tumbling windows per dimensions."""
    shape = settings.shape
    agg = events.groupBy(window_of(settings).alias(WINDOW), *shape.dimension_names).agg(
        *measures(shape))
    return flatten_window(agg, shape)


def with_window_bounds(events: DataFrame, settings: Settings) -> DataFrame:
    w = window_of(settings)
    return events.withColumn("window_start", w.start).withColumn("window_end", w.end)
