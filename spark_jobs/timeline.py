"""The observability timeline: small bucketed series aggregated in Spark, rendered to one HTML file.

Only aggregates leave Spark (about 120 rows per series, one row for the histogram); every value is
collected as epoch microseconds and turned into UTC datetimes here, so nothing depends on the
Python process's time zone. The drawing (plotly) is `assets.observe.timeline_page`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import BRONZE, INGEST_QUERY, LATE, PROGRESS
from spark_jobs.tables import read_table

Value = float | datetime

# Steps (seconds) for bucket sizes: round numbers of s/min/h/days.
NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400, 172800, 604800, 2592000)

TIMELINE_SERIES = ("lateness_p50", "lateness_p99", "lateness_max", "watermark", "consumer_lag",
                   "batch_duration", "aggregate_freshness")
HISTOGRAM, WHAT_IF = "lateness_histogram", "what_if_late_records"
UNITS = {"lateness_p50": "s", "lateness_p99": "s", "lateness_max": "s", "watermark": "time",
         "consumer_lag": "records", "batch_duration": "s",
         "aggregate_freshness": "s", HISTOGRAM: "records", WHAT_IF: "records"}
NO_DATA = "no data yet"


# ---- data ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Series:
    """One timeline series: (bucket start in UTC, value) points sorted by time. The value is
    seconds, a record count, or a datetime (the watermark)."""

    name: str
    points: tuple[tuple[datetime, Value], ...] = ()


@dataclass(frozen=True)
class Histogram:
    """Records by lag behind the running max event time. `counts` has len(edges) + 1 bins:
    counts[0] is below edges[0] (including records that advanced the max and the very first
    record), counts[i] is [edges[i-1], edges[i]), counts[-1] is edges[-1] and above."""

    edges: tuple[timedelta, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class TimelineData:
    """Everything the report shows; all times are UTC. `start`/`end`/`bucket` are None when
    neither bronze nor the progress table has a row yet."""

    topic: str
    generated_at: datetime
    watermark_delay: timedelta
    pipeline: str = "default"
    start: datetime | None = None
    end: datetime | None = None
    bucket: timedelta | None = None
    series: tuple[Series, ...] = ()
    histogram: Histogram | None = None
    what_if: tuple[tuple[timedelta, int], ...] = ()  # (candidate delay, records late under it)
    late_events_rows: int = 0
    bronze_rows: int = 0
    newest_event_time: datetime | None = None
    lateness_overall: Mapping[str, float] = field(default_factory=dict)  # p50/p99/max seconds

    def get(self, name: str) -> Series:
        return next((s for s in self.series if s.name == name), Series(name))


def choose_bucket(span: timedelta, target: int = 120) -> timedelta:
    """The smallest round bucket that cuts `span` into at most `target` buckets (so 48-120 of
    them for spans above two minutes)."""
    seconds = span.total_seconds() / target
    return timedelta(seconds=next((s for s in NICE_STEPS_S if s >= seconds), NICE_STEPS_S[-1]))


DEFAULT_DELAYS = tuple(timedelta(seconds=s) for s in (0, 5, 10, 30, 60, 120, 300, 900, 3600))
US = 1_000_000
# Before its first event a query reports watermark 0 (1970-01-01): that is "no watermark yet".
NO_WATERMARK_BEFORE_US = 86_400 * US


@dataclass(frozen=True)
class _Axis:
    start_us: int
    end_us: int
    bucket_us: int


def _utc(us: int | None) -> datetime | None:
    return None if us is None else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(us))


def _us(td: timedelta) -> int:
    return td // timedelta(microseconds=1)


def _since(df: DataFrame, column: str, since: datetime | None) -> DataFrame:
    """Rows at or after `since` (a naive datetime is taken as UTC)."""
    if since is None:
        return df
    since = since if since.tzinfo else since.replace(tzinfo=UTC)
    return df.where(F.unix_micros(column) >= _us(since - _utc(0)))


def _bucket(column: str, bucket_us: int) -> Column:
    """Start of the bucket holding `column`, in epoch microseconds."""
    return F.floor(F.unix_micros(column) / F.lit(bucket_us)) * F.lit(bucket_us)


def _lateness_s() -> Column:
    return (F.unix_micros("kafka_timestamp") - F.unix_micros("event_time")) / F.lit(float(US))


# ---- bronze --------------------------------------------------------------------------------------
def _bronze_stats(bronze: DataFrame):
    """One pass: row count, arrival span, newest event time, overall lateness percentiles."""
    arrival = F.unix_micros("kafka_timestamp")
    return bronze.agg(
        F.count(F.lit(1)).alias("rows"), F.min(arrival).alias("first_us"), F.max(arrival).alias("last_us"),
        F.max(F.unix_micros("event_time")).alias("newest_us"),
        F.percentile_approx(_lateness_s(), [0.5, 0.99]).alias("pct"), F.max(_lateness_s()).alias("max_s"),
    ).first()


def _lateness_series(bronze: DataFrame, bucket_us: int) -> tuple[Series, ...]:
    rows = (
        bronze.groupBy(_bucket("kafka_timestamp", bucket_us).alias("b"))
        .agg(F.percentile_approx(_lateness_s(), [0.5, 0.99]).alias("pct"), F.max(_lateness_s()).alias("max_s"))
        .orderBy("b")
        .collect()
    )
    return (
        Series("lateness_p50", tuple((_utc(r.b), r.pct[0]) for r in rows)),
        Series("lateness_p99", tuple((_utc(r.b), r.pct[1]) for r in rows)),
        Series("lateness_max", tuple((_utc(r.b), r.max_s) for r in rows)),
    )


def _lag_behind_max(bronze: DataFrame, edges: tuple[timedelta, ...]) -> tuple[Histogram, tuple]:
    """Histogram of each record's lag behind the running max event time, and what-if counts.

    lag_behind_max = (max event_time of all records that arrived strictly before it, ordered by
    kafka_timestamp, partition, offset) - event_time; the record is late under a delay D iff
    lag_behind_max >= D, i.e. event_time <= running max - D. The first record has no lag (never
    late). This is a per-record estimate and an upper bound of the real late lane: Spark advances
    the watermark only between micro-batches, so a batch's watermark lags the running max and some
    records counted here were still on time in their batch.

    The window has no partitioning (arrival order is global, like the query's watermark), so Spark
    sorts the two needed columns in one task; only one aggregated row is collected.
    """
    order = Window.orderBy("kafka_timestamp", "partition", "offset").rowsBetween(Window.unboundedPreceding, -1)
    event_us = F.unix_micros("event_time")
    lag = F.col("lag_us")
    lagged = bronze.select((F.max(event_us).over(order) - event_us).alias("lag_us"))
    cuts = [_us(e) for e in edges]
    bins = [lag.isNull() | (lag < cuts[0])]
    bins += [(lag >= lo) & (lag < hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]
    bins += [lag >= cuts[-1]]
    row = lagged.agg(
        *[F.count(F.when(c, 1)).alias(f"bin{i}") for i, c in enumerate(bins)],
        *[F.count(F.when(lag >= cut, 1)).alias(f"late{i}") for i, cut in enumerate(cuts)],
    ).first()
    histogram = Histogram(edges, tuple(row[f"bin{i}"] for i in range(len(bins))))
    return histogram, tuple((e, row[f"late{i}"]) for i, e in enumerate(edges))


# ---- stream_progress -----------------------------------------------------------------------------
def _progress_span(progress: DataFrame):
    at = F.unix_micros("batch_timestamp")
    return progress.agg(F.min(at).alias("first_us"), F.max(at).alias("last_us")).first()


def _progress_series(progress: DataFrame, bucket_us: int) -> tuple[Series, ...]:
    """Per query and bucket the worst value: max lag, max duration, max staleness (the watermark
    only moves forward, so its max is the bucket's latest)."""
    wm_us = F.when(F.unix_micros("watermark") >= NO_WATERMARK_BEFORE_US, F.unix_micros("watermark"))
    rows = (
        progress.where(F.col("batch_timestamp").isNotNull())
        .groupBy("query", _bucket("batch_timestamp", bucket_us).alias("b"))
        .agg(
            F.max(wm_us).alias("wm_us"),
            F.max("kafka_lag").alias("lag"),
            F.max("trigger_ms").alias("trigger_ms"),
            F.max(F.unix_micros("batch_timestamp") - wm_us).alias("stale_us"),
        )
        .orderBy("query", "b")
        .collect()
    )

    def series(name: str, query: str, value) -> Series:
        points = ((_utc(r.b), value(r)) for r in rows if r.query == query)
        return Series(name, tuple((t, v) for t, v in points if v is not None))

    def seconds(field: str, scale: int):
        return lambda r: None if r[field] is None else r[field] / scale

    return (
        series("watermark", INGEST_QUERY, lambda r: _utc(r.wm_us)),
        series("consumer_lag", INGEST_QUERY, lambda r: r.lag),
        series("batch_duration", INGEST_QUERY, seconds("trigger_ms", 1000)),
        series("aggregate_freshness", INGEST_QUERY, seconds("stale_us", US)),
    )


# ---- assembly ------------------------------------------------------------------------------------
def _axis(*spans) -> _Axis | None:
    """The shared time axis over every table's span, cut into round buckets."""
    firsts = [s.first_us for s in spans if s.first_us is not None]
    lasts = [s.last_us for s in spans if s.last_us is not None]
    if not firsts:
        return None
    first, last = min(firsts), max(lasts)
    bucket = _us(choose_bucket(timedelta(microseconds=last - first)))
    start = first // bucket * bucket
    return _Axis(start, last // bucket * bucket + bucket, bucket)


def _edges(delays: list[timedelta] | None, configured: timedelta) -> tuple[timedelta, ...]:
    """Candidate delays plus the configured one (so its estimate can sit next to late_events)."""
    chosen = set(DEFAULT_DELAYS if delays is None else delays) | {configured}
    if any(d < timedelta(0) for d in chosen):
        raise ValueError(f"watermark delays must not be negative: {sorted(chosen)}")
    return tuple(sorted(chosen))


def collect_timeline(
    spark: SparkSession,
    settings: Settings,
    since: datetime | None = None,
    delays: list[timedelta] | None = None,
) -> TimelineData:
    """Read bronze_events, stream_progress and late_events (rows arriving at or after `since`)
    and aggregate them into the report's series. `what_if` covers `delays` (default
    DEFAULT_DELAYS) plus settings.watermark_delay."""
    bronze = _since(read_table(spark, settings, BRONZE), "kafka_timestamp", since)
    progress = _since(read_table(spark, settings, PROGRESS), "batch_timestamp", since)
    late = _since(read_table(spark, settings, LATE), "kafka_timestamp", since)
    stats = _bronze_stats(bronze)
    axis = _axis(stats, _progress_span(progress))
    edges = _edges(delays, settings.watermark_delay)
    series = _lateness_series(bronze, axis.bucket_us) + _progress_series(progress, axis.bucket_us) if axis else ()
    histogram, what_if = _lag_behind_max(bronze, edges) if stats.rows else (None, ())
    overall = {} if not stats.rows else {"p50": stats.pct[0], "p99": stats.pct[1], "max": stats.max_s}
    return TimelineData(
        pipeline=settings.pipeline,
        topic=settings.events_topic,
        generated_at=datetime.now(UTC),
        watermark_delay=settings.watermark_delay,
        start=_utc(axis.start_us) if axis else None,
        end=_utc(axis.end_us) if axis else None,
        bucket=timedelta(microseconds=axis.bucket_us) if axis else None,
        series=series,
        histogram=histogram,
        what_if=what_if,
        late_events_rows=late.count(),
        bronze_rows=stats.rows,
        newest_event_time=_utc(stats.newest_us),
        lateness_overall=overall,
    )
