"""The comparisons of two window tables that need no Great Expectations (importing GX costs
~4 s on this machine): the full outer join the proof validates (`comparison_frame`), and the
fast path's gap to the replay (`fast_path_gap`, a warning check that runs without GX)."""

from __future__ import annotations

from datetime import date
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakehouse.events.shape import DEFAULT_SHAPE, EventShape

WINDOW = "_window"  # the window as UTC text, in the comparison and its Data Docs


def comparison_frame(left: DataFrame, right: DataFrame, left_name: str, right_name: str,
                     shape: EventShape = DEFAULT_SHAPE, carry: dict[str, str] | None = None):
    """Full outer join on (window_start, dimensions): the window (also as UTC text, `_window`),
    and each side's measures as `<side>_<measure>` (null where the window is not on that
    side); `carry` maps more columns of the left side to their names in the frame. Working
    columns start with _ (a spec's column names start with a letter), and no dimension is a
    measure's `<side>_` image (`lakehouse.events.shape.IMAGE_PREFIXES`)."""
    l_, r_ = left.alias("l"), right.alias("r")
    joined = l_.join(r_, [F.col(f"l.{k}") == F.col(f"r.{k}") for k in shape.window_id],
                     "full_outer")
    start = F.coalesce("l.window_start", "r.window_start")
    return joined.select(
        start.alias("window_start"),
        # The window as UTC text (the session's time zone), for the Data Docs: a collected
        # timestamp would be shown in the host's zone.
        F.date_format(start, "yyyy-MM-dd'T'HH:mm:ss'Z'").alias(WINDOW),
        *[F.coalesce(f"l.{d}", f"r.{d}").alias(d) for d in shape.dimension_names],
        *[F.col(f"l.{m}").alias(f"{left_name}_{m}") for m in shape.measure_columns],
        *[F.col(f"r.{m}").alias(f"{right_name}_{m}") for m in shape.measure_columns],
        *[F.col(f"l.{c}").alias(name) for c, name in (carry or {}).items()],
    )


def differs(left_name: str, right_name: str, shape: EventShape = DEFAULT_SHAPE) -> Column:
    """Rows of a comparison frame whose measures differ (a missing side differs): for the
    evidence and the fast path's gap; the proof itself is GX's."""
    return ~F.expr(" AND ".join(f"{left_name}_{m} <=> {right_name}_{m}"
                                for m in shape.measure_columns))


def sum_columns(shape: EventShape) -> dict[str, str]:
    """The shape's sum columns and their types (the default's: value_sum decimal(38,6))."""
    return {c: t for c, t in shape.measure_columns_typed() if c in shape.columns_of("sum")}


def missed(sum_column: str) -> str:
    """The fast-path gap's name for what the watermark cost a sum: `value_sum` -> `value_missed`."""
    return sum_column.removesuffix("_sum") + "_missed"


def fast_path_gap(streaming: DataFrame, replay: DataFrame, late: DataFrame, d: date,
                  late_events: int, shape: EventShape = DEFAULT_SHAPE) -> dict:
    """How far the fast path was from the replay for one date: the windows, events and sums
    the watermark cost. A differing window is explained when the late lane recorded events in
    it (`late`: its rows of the date, `late_events` of them; not read when 0), or when the
    fast path still has it open."""
    keys = list(shape.window_id)
    frame = comparison_frame(streaming, replay, "streaming", "replay", shape,
                             carry={"status": "_fast_path_status"})
    if late_events:
        frame = frame.join(late.select(*keys).distinct().withColumn("_has_late", F.lit(True)),
                           keys, "left")
    else:  # no late event of the date: its late table is not read
        frame = frame.withColumn("_has_late", F.lit(None).cast("boolean"))
    differs_ = differs("streaming", "replay", shape)
    # A window the fast path counted before an in-place spec edit added a measure column holds
    # null there (never a partial value): not computed under this spec, so not a gap.
    before_edit = F.col("streaming_event_count").isNotNull() & reduce(
        lambda a, b: a | b, [F.col(f"streaming_{c}").isNull() for c in shape.measure_columns])
    explained = (F.col("_has_late").isNotNull() | (F.col("_fast_path_status") == "open")
                 | before_edit)

    def total(col: str) -> F.Column:
        return F.coalesce(F.sum(F.coalesce(F.col(col), F.lit(0))), F.lit(0))

    row = frame.agg(
        F.count("*").alias("windows_compared"),
        F.count(F.when(differs_, 1)).alias("windows_differing"),
        F.count(F.when(F.col("streaming_event_count").isNull(), 1)).alias("windows_missing"),
        F.count(F.when(before_edit, 1)).alias("windows_before_spec_edit"),
        F.count(F.when(differs_ & ~F.coalesce(explained, F.lit(False)), 1))
        .alias("windows_unexplained"),
        (total("replay_event_count") - total("streaming_event_count")).alias("events_missed"),
        *[(total(f"replay_{c}") - total(f"streaming_{c}")).cast(t).alias(missed(c))
          for c, t in sum_columns(shape).items()],
    ).first()
    gap = row.asDict()
    for c in sum_columns(shape):
        gap[missed(c)] = str(gap[missed(c)])
    gap["late_events"] = late_events
    gap["event_date"] = d.isoformat()
    return gap
