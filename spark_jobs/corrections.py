"""Corrections: recompute a date's windows exactly from bronze and publish them to the gold
`reconciled_aggregates`, logging every change of a published window in `late_corrections`.

Rules (DESIGN §4):
- an event counts when it is valid, the first copy of its event_id in its date (arrival order),
  and reached the broker within the correction horizon after its date ended; later arrivals are
  kept in bronze and reported, not applied (the replay applies the same cut-off);
- a window first appears with revision 0; while it is `open` (the stream's watermark has not
  passed its end) it is provisional and updated in place; a change to a `final` or `corrected`
  window is a correction: revision + 1, status `corrected`, one changelog row with the cause;
- the changelog row is written before the gold row, keyed by (window, key, revision), so a run
  that dies between the two writes is completed, not duplicated, by the next run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.settings import Settings
from spark_jobs import checkpoint as ckpt
from spark_jobs.stream import AGG_QUERY
from spark_jobs.tables import (
    BRONZE,
    CORRECTIONS,
    LATE,
    MEASURE_COLUMNS,
    RECONCILED,
    ensure_tables,
    read_table,
)
from spark_jobs.windows import aggregate_windows, dedup_first

KEY = ("window_start", "key")


def day_bounds(d: date) -> tuple[datetime, datetime]:
    start = datetime.combine(d, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def applicable_cutoff(settings: Settings, d: date) -> datetime:
    """Latest broker append time at which an event of date `d` is still applied."""
    return day_bounds(d)[1] + settings.correction_horizon


def events_for_date(events: DataFrame, settings: Settings, d: date) -> DataFrame:
    """Valid events of `d` that count: within the horizon, first copy of each event_id."""
    in_date = events.where(F.col("event_date") == F.lit(d))
    applied = in_date.where(F.col("kafka_timestamp") <= F.lit(applicable_cutoff(settings, d)))
    return dedup_first(applied)


def stream_watermark(spark: SparkSession, settings: Settings) -> datetime | None:
    """The watermark of the aggregation stream's last batch (None before the first batch)."""
    path = settings.checkpoint_path(AGG_QUERY)
    last = ckpt.last_committed_batch(spark, path)
    offsets = ckpt.batch_offsets(spark, path, last) if last is not None else None
    if offsets is None or offsets.watermark_ms <= 0:
        return None
    return datetime.fromtimestamp(offsets.watermark_ms / 1000, tz=UTC)


@dataclass
class CorrectionResult:
    event_date: date
    windows: int = 0
    inserted: int = 0
    corrected: int = 0
    removed: int = 0
    finalized: int = 0
    beyond_horizon: int = 0
    late_events: int = 0
    watermark: datetime | None = None

    def as_metadata(self) -> dict:
        return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in vars(self).items()}


def _measures_equal(a: str, b: str) -> F.Column:
    cond = F.lit(True)
    for m in MEASURE_COLUMNS:
        cond = cond & F.col(f"{a}.{m}").eqNullSafe(F.col(f"{b}.{m}"))
    return cond


def publish(
    spark: SparkSession,
    settings: Settings,
    d: date,
    recomputed: DataFrame,
    run_id: str,
    default_cause: str,
) -> CorrectionResult:
    """Diff `recomputed` (all windows of `d`) with the gold table and apply the differences."""
    result = CorrectionResult(d, watermark=stream_watermark(spark, settings))
    wm = F.lit(result.watermark) if result.watermark else F.lit(None).cast("timestamp")
    now = datetime.now(UTC)
    gold = read_table(spark, settings, RECONCILED).where(F.col("event_date") == F.lit(d))
    late_windows = (
        read_table(spark, settings, LATE)
        .where(F.col("event_date") == F.lit(d))
        .select(*KEY)
        .distinct()
        .withColumn("has_late", F.lit(True))
    )
    closed = F.coalesce(F.col("n.window_end") <= wm, F.lit(False))
    diff = (
        recomputed.alias("n")
        .join(gold.alias("o"), [F.col(f"n.{k}") == F.col(f"o.{k}") for k in KEY], "full_outer")
        .join(
            late_windows.alias("l"),
            [F.coalesce(F.col(f"n.{k}"), F.col(f"o.{k}")) == F.col(f"l.{k}") for k in KEY],
            "left",
        )
        .select(
            F.coalesce("n.event_date", "o.event_date").alias("event_date"),
            F.coalesce("n.window_start", "o.window_start").alias("window_start"),
            F.coalesce("n.window_end", "o.window_end").alias("window_end"),
            F.coalesce("n.key", "o.key").alias("key"),
            *[F.col(f"o.{m}").alias(f"before_{m}") for m in MEASURE_COLUMNS],
            *[F.col(f"n.{m}").alias(f"after_{m}") for m in MEASURE_COLUMNS],
            F.col("o.revision").alias("old_revision"),
            F.col("o.status").alias("old_status"),
            F.when(F.col("o.key").isNull(), "insert")
            .when(F.col("n.key").isNull(), "remove")
            .when(~_measures_equal("n", "o"), "change")
            .when((F.col("o.status") == "open") & closed, "finalize")
            .alias("action"),
            closed.alias("closed"),
            F.when(F.col("l.has_late"), "late_event").otherwise(default_cause).alias("cause"),
        )
        .where(F.col("action").isNotNull())
        .withColumn(
            "is_correction",
            (F.col("action") == "remove")
            | ((F.col("action") == "change") & (F.col("old_status") != "open")),
        )
        .withColumn(
            "revision",
            F.when(F.col("is_correction"), F.col("old_revision") + 1)
            .otherwise(F.coalesce(F.col("old_revision"), F.lit(0)))
            .cast("int"),
        )
        .withColumn(
            "status",
            F.when(F.col("is_correction"), "corrected")
            .when(F.col("action") == "change", F.when(F.col("closed"), "final").otherwise("open"))
            .when(F.col("action") == "finalize", "final")
            .when(F.col("closed"), "final")
            .otherwise("open"),
        )
        .persist()
    )
    try:
        counts = {r.action: r.n for r in diff.groupBy("action").agg(F.count("*").alias("n")).collect()}
        corrections_n = diff.where("is_correction").count()
        result.inserted = counts.get("insert", 0)
        result.removed = counts.get("remove", 0)
        result.finalized = counts.get("finalize", 0)
        result.corrected = corrections_n
        if not counts:
            return result
        date_pred = f"t.event_date = DATE'{d.isoformat()}'"
        changelog = diff.where("is_correction").select(
            "event_date", "window_start", "window_end", "key", "revision", "cause",
            *[f"before_{m}" for m in MEASURE_COLUMNS],
            *[f"after_{m}" for m in MEASURE_COLUMNS],
            F.lit(now).alias("corrected_at"),
            F.lit(run_id).alias("run_id"),
        )
        if corrections_n:
            (
                DeltaTable.forPath(spark, settings.table_path(CORRECTIONS.name)).alias("t")
                .merge(changelog.alias("s"), f"{date_pred} AND t.window_start = s.window_start "
                       "AND t.key = s.key AND t.revision = s.revision")
                .whenNotMatchedInsertAll()
                .execute()
            )
        src = diff.select(
            "event_date", "window_start", "window_end", "key", "action", "revision", "status",
            *[F.col(f"after_{m}").alias(m) for m in MEASURE_COLUMNS],
            F.lit(now).alias("updated_at"),
        )
        values = {c: F.col(f"s.{c}") for c in (
            "event_date", "window_start", "window_end", "key", *MEASURE_COLUMNS,
            "revision", "status", "updated_at")}
        (
            DeltaTable.forPath(spark, settings.table_path(RECONCILED.name)).alias("t")
            .merge(src.alias("s"), f"{date_pred} AND t.window_start = s.window_start "
                   "AND t.key = s.key")
            .whenMatchedDelete(condition="s.action = 'remove'")
            .whenMatchedUpdate(set=values)
            .whenNotMatchedInsert(condition="s.action != 'remove'", values=values)
            .execute()
        )
        return result
    finally:
        diff.unpersist()


def run_corrections(
    spark: SparkSession, settings: Settings, d: date, run_id: str
) -> CorrectionResult:
    """Correct one event date from bronze (idempotent: a rerun with no new data is a no-op)."""
    ensure_tables(spark, settings)
    bronze = read_table(spark, settings, BRONZE)
    recomputed = aggregate_windows(events_for_date(bronze, settings, d), settings)
    result = publish(spark, settings, d, recomputed, run_id, default_cause="late_event")
    in_date = bronze.where(F.col("event_date") == F.lit(d))
    result.beyond_horizon = in_date.where(
        F.col("kafka_timestamp") > F.lit(applicable_cutoff(settings, d))
    ).count()
    result.windows = (
        read_table(spark, settings, RECONCILED).where(F.col("event_date") == F.lit(d)).count()
    )
    result.late_events = (
        read_table(spark, settings, LATE).where(F.col("event_date") == F.lit(d)).count()
    )
    return result
