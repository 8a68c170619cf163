"""The fast path: two checkpointed Structured Streaming queries.

1. `bronze` is the only Kafka consumer: stateless parse, then valid rows to `bronze_events` and
   malformed ones to `quarantined_events`, each write idempotent per batch (Delta txnAppId =
   the query's persistent id, txnVersion = batch id), so a re-run batch after a crash is a no-op.
2. `aggregates` streams from bronze (already parsed and columnar): watermark, dedup by event_id,
   tumbling windows, MERGE into `streaming_aggregates`. After each batch it records the late set:
   the bronze rows in that batch's source range whose event_time is at or below the watermark
   the dedup operator filtered with (the previous batch's, read from the checkpoint) are exactly
   the rows it dropped.

Both run with `trigger(availableNow=True)` (Dagster catch-up) or a processing-time trigger (the
service); the checkpoints under `$LAKEHOUSE_ROOT/_checkpoints` are shared by both ways.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from lakehouse.kafka_admin import topic_offsets
from lakehouse.settings import Settings, spark_interval
from spark_jobs import checkpoint as ckpt
from spark_jobs.checkpoint import AGG_QUERY, BRONZE_QUERY
from spark_jobs.lock import checkpoint_lock
from spark_jobs.parse import parsed_events
from spark_jobs.progress import record_progress
from spark_jobs.tables import (
    BRONZE,
    LATE,
    QUARANTINE,
    STREAMING,
    bronze_position,
    ensure_tables,
    position_metadata,
)
from spark_jobs.windows import flatten_window, measures, window_of


@dataclass
class Trigger:
    """`available_now` for a catch-up run, else a processing-time interval."""

    available_now: bool = True
    interval: str = "10 seconds"

    def apply(self, writer):
        if self.available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=self.interval)


@dataclass
class _Batch:
    """Lazily resolved per-query facts needed inside foreachBatch."""

    spark: SparkSession
    checkpoint: str
    _app_id: str | None = field(default=None)

    @property
    def app_id(self) -> str:
        # Delta txnAppId: the streaming query's id from its checkpoint. A new checkpoint is a new
        # id, so a reprocess-from-scratch is not mistaken for already-committed batches.
        if self._app_id is None:
            self._app_id = ckpt.query_id(self.spark, self.checkpoint)
        return self._app_id


def _idempotent_append(df: DataFrame, path: str, app_id: str, batch_id: int,
                       user_metadata: str | None = None) -> None:
    writer = (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
    )
    if user_metadata:
        writer = writer.option("userMetadata", user_metadata)
    writer.save(path)


# ---------------------------------------------------------------------------------------------
# 1. Kafka -> bronze + quarantine
# ---------------------------------------------------------------------------------------------
def starting_offsets(spark: SparkSession, settings: Settings) -> str:
    """Where a bronze query with a new checkpoint starts: the earliest retained offset for a new
    instance (nothing produced before the first run is skipped, DESIGN §7), or, when bronze
    already holds records, the Kafka position stamped on its newest stream commit. So a reset
    or lost checkpoint (a new txnAppId, which Delta's idempotent writes cannot recognise) never
    ingests a record twice: bronze stays unique on (topic, partition, offset). Ignored by Spark
    once the checkpoint has offsets."""
    position = bronze_position(spark, settings)
    if position is None or not position.end_offsets:
        return "earliest"
    # -2 = earliest for a partition the stream has not read yet.
    offsets = {str(p): position.end_offsets.get(p, -2)
               for p in {*position.end_offsets, *[o.partition for o in topic_offsets(settings)]}}
    return json.dumps({settings.events_topic: offsets})


def kafka_source(spark: SparkSession, settings: Settings, start: str = "earliest") -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .options(**settings.spark_kafka_options)
        .option("subscribe", settings.events_topic)
        .option("startingOffsets", start)
        # Records deleted by retention before the stream read them fail the query loudly.
        .option("failOnDataLoss", "true")
        .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
        .load()
    )


def write_bronze_batch(settings: Settings, ctx: _Batch) -> Callable[[DataFrame, int], None]:
    def run(batch: DataFrame, batch_id: int) -> None:
        stamp = [
            F.current_timestamp().alias("ingested_at"),
            F.lit(batch_id).cast("long").alias("bronze_batch_id"),
        ]
        # The batch's end offsets (from its write-ahead log entry) stamp the bronze commit.
        ends = (ckpt.batch_offsets(batch.sparkSession, ctx.checkpoint, batch_id).sources[0]
                or {}).get(settings.events_topic) or {}
        with parsed_events(batch, settings) as (valid, bad):
            _idempotent_append(valid.select("*", *stamp), settings.table_path(BRONZE.name),
                               ctx.app_id, batch_id,
                               position_metadata({int(p): int(o) for p, o in ends.items()}))
            # Most batches have nothing to quarantine: no empty commit for them (the check
            # reads the cached classification). A re-run batch decides the same way.
            if not bad.isEmpty():
                _idempotent_append(bad.select("*", *stamp),
                                   settings.table_path(QUARANTINE.name), ctx.app_id, batch_id)

    return run


def start_bronze(spark: SparkSession, settings: Settings, trigger: Trigger) -> StreamingQuery:
    ensure_tables(spark, settings)
    checkpoint = settings.checkpoint_path(BRONZE_QUERY)
    ctx = _Batch(spark, checkpoint)
    fresh = ckpt.last_committed_batch(spark, checkpoint) is None and ckpt.batch_offsets(
        spark, checkpoint, 0) is None
    writer = (
        kafka_source(spark, settings, starting_offsets(spark, settings) if fresh else "earliest")
        .writeStream.queryName(BRONZE_QUERY)
        .foreachBatch(write_bronze_batch(settings, ctx))
        .option("checkpointLocation", checkpoint)
    )
    return trigger.apply(writer).start()


# ---------------------------------------------------------------------------------------------
# 2. bronze -> streaming_aggregates + late_events
# ---------------------------------------------------------------------------------------------
def bronze_source(spark: SparkSession, settings: Settings) -> DataFrame:
    return (
        spark.readStream.format("delta")
        # Read the log version by version from the table's creation (never an initial snapshot),
        # so each batch's source range is a range of bronze commit versions.
        .option("startingVersion", 0)
        .option("maxFilesPerTrigger", 1_000_000)
        # Commits that change existing bronze rows (a repair, a deletion) are not new events:
        # the fast path skips them instead of failing; corrections read them from the change
        # feed (and a reprocess rebuilds from the log).
        .option("skipChangeCommits", "true")
        .load(settings.table_path(BRONZE.name))
    )


def windowed_aggregates(events: DataFrame, settings: Settings) -> DataFrame:
    agg = (
        events.select("event_id", "key", "event_time", "value")
        .withWatermark("event_time", spark_interval(settings.watermark_delay))
        .dropDuplicatesWithinWatermark(["event_id"])
        .groupBy(window_of(settings).alias("window"), "key")
        .agg(*measures())
    )
    return flatten_window(agg)


def bronze_version_range(start: dict | None, end: dict) -> tuple[int, int]:
    """Bronze commit versions [first, last] a Delta-source batch covers. With an unlimited
    maxFilesPerTrigger a batch always ends at a version boundary: `index` -1 means "before any
    file of reservoirVersion", so that version is not included."""
    def consumed_through(off: dict) -> int:
        return off["reservoirVersion"] - (1 if off["index"] == -1 else 0)

    first = 0 if start is None else consumed_through(start) + 1
    return first, consumed_through(end)


def late_rows(
    spark: SparkSession, settings: Settings, first: int, last: int, watermark_ms: int, batch_id: int
) -> DataFrame:
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", first)
        .option("endingVersion", last)
        .load(settings.table_path(BRONZE.name))
        .where("_change_type = 'insert'")
    )
    wm = F.timestamp_millis(F.lit(watermark_ms))
    w = window_of(settings)
    return changes.where(F.col("event_time") <= wm).select(
        "event_id",
        "key",
        "event_time",
        "value",
        "event_date",
        w.start.alias("window_start"),
        w.end.alias("window_end"),
        (F.unix_millis(wm) - F.unix_millis("event_time")).alias("lateness_ms"),
        F.lit(batch_id).cast("long").alias("batch_id"),
        wm.alias("batch_watermark"),
        "topic",
        "partition",
        "offset",
        "kafka_timestamp",
        F.current_timestamp().alias("recorded_at"),
    )


def write_aggregate_batch(settings: Settings, ctx: _Batch) -> Callable[[DataFrame, int], None]:
    def run(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        this = ckpt.batch_offsets(spark, ctx.checkpoint, batch_id)
        prev = ckpt.batch_offsets(spark, ctx.checkpoint, batch_id - 1) if batch_id > 0 else None
        wm_ms = this.watermark_ms
        # The watermark the previous batch ran with (0 before any): its finalize bound, and the
        # one this batch's dedup dropped late rows by (see below).
        prev_wm_ms = prev.watermark_ms if prev else 0
        wm = F.timestamp_millis(F.lit(wm_ms))
        now = datetime.now(UTC)
        rows = batch.select(
            "*",
            F.when(F.col("window_end") <= wm, "final").otherwise("open").alias("status"),
            wm.alias("watermark"),
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.lit(now).alias("updated_at"),
        ).persist()
        try:
            target = DeltaTable.forPath(spark, settings.table_path(STREAMING.name))
            dates = [r.event_date for r in rows.select("event_date").distinct().collect()]
            if dates:
                in_dates = "t.event_date IN ({})".format(
                    ",".join(f"DATE'{d.isoformat()}'" for d in dates)
                )
                (
                    target.alias("t")
                    .merge(rows.alias("s"), f"{in_dates} AND t.event_date = s.event_date AND "
                           "t.window_start = s.window_start AND t.key = s.key")
                    .whenMatchedUpdateAll()
                    .whenNotMatchedInsertAll()
                    .execute()
                )
            # Windows the watermark has passed are final (Spark evicts them in this batch).
            # Those ending at or before the previous watermark were finalized by the previous
            # batch (or written final), so only windows ending in (previous, current] are
            # looked at: the UPDATE prunes to the newest dates and files, however long the
            # history, and does not run when the watermark did not move.
            if wm_ms > prev_wm_ms:
                prev_wm = F.timestamp_millis(F.lit(prev_wm_ms))
                target.update(
                    condition=(F.col("status") == "open")
                    & F.col("event_date").between(F.to_date(prev_wm), F.to_date(wm))
                    & (F.col("window_end") > prev_wm) & (F.col("window_end") <= wm),
                    set={"status": F.lit("final"), "updated_at": F.lit(now)},
                )
        finally:
            rows.unpersist()
        # With chained stateful operators (dedup, then windows) Spark drops input rows by the
        # watermark "for late events", which is the previous batch's watermark; the current one
        # is only used for eviction (SPARK-40925). They differ whenever data keeps arriving.
        src_end = this.sources[0]
        if src_end is not None:
            first, last = bronze_version_range(prev.sources[0] if prev else None, src_end)
            if first <= last and prev_wm_ms > 0:
                late = late_rows(spark, settings, first, last, prev_wm_ms, batch_id)
                _idempotent_append(late, settings.table_path(LATE.name), ctx.app_id, batch_id)

    return run


def start_aggregates(spark: SparkSession, settings: Settings, trigger: Trigger) -> StreamingQuery:
    ensure_tables(spark, settings)
    checkpoint = settings.checkpoint_path(AGG_QUERY)
    ctx = _Batch(spark, checkpoint)
    writer = (
        windowed_aggregates(bronze_source(spark, settings), settings)
        .writeStream.queryName(AGG_QUERY)
        .outputMode("update")
        .foreachBatch(write_aggregate_batch(settings, ctx))
        .option("checkpointLocation", checkpoint)
    )
    return trigger.apply(writer).start()


STARTERS = {BRONZE_QUERY: start_bronze, AGG_QUERY: start_aggregates}


# Spark 4.1.1 bug (SPARK-55271): after a crash, the Kafka source's progress metrics throw this
# NullPointerException at the end of the first re-executed batch, *after* the batch committed.
# A restart continues correctly, so runners restart a query that died of exactly this.
_SPARK_55271 = 'because the return value of "scala.Option.get()" is null'
MAX_RESTARTS = 3


def is_known_restart_bug(exc: BaseException | None) -> bool:
    return exc is not None and _SPARK_55271 in str(exc)


def run_available_now(spark: SparkSession, settings: Settings, query: str) -> list[dict]:
    """One checkpointed catch-up of `query`: every available record, then stop. Returns the
    progress reports of its batches (also recorded in `stream_progress`)."""
    progresses: list[dict] = []
    with checkpoint_lock(settings.root, query, spark):
        for attempt in range(MAX_RESTARTS + 1):
            q = STARTERS[query](spark, settings, Trigger(available_now=True))
            try:
                q.awaitTermination()
                progresses += [json.loads(p.json) for p in q.recentProgress]
                break
            except Exception as exc:  # StreamingQueryException
                progresses += [json.loads(p.json) for p in q.recentProgress]
                if not is_known_restart_bug(exc) or attempt == MAX_RESTARTS:
                    raise
    ends = None
    if query == BRONZE_QUERY:
        ends = {p.partition: p.latest for p in topic_offsets(settings)}
    record_progress(spark, settings, query, progresses, ends)
    return progresses


def catch_up(spark: SparkSession, settings: Settings) -> dict[str, list[dict]]:
    """Bronze then aggregates, each available-now until done."""
    return {q: run_available_now(spark, settings, q) for q in (BRONZE_QUERY, AGG_QUERY)}
